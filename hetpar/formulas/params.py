"""Parameter counts and bytes of a ModelSpec's layers, embeddings and experts."""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from hetpar.formulas.ssm import ssm_params
from hetpar.specs.model import ModelSpec
from hetpar.specs.ssm import LayerKind, has_attention, has_mlp, has_ssm, norms_of

# Notation (Narayanan et al. SC'21; Korthikanti et al. MLSys'23): h hidden, a heads, d head
# width, g KV heads (GQA/MQA: Ainslie et al. 2023), f MLP width, V vocab, L layers, s sequence.
# Multi-head latent attention (DeepSeek-V2, arXiv:2405.04434 Sec. 2.1.2-2.1.3, eqs. 9-19):
# r_q, r_kv the query and key-value ranks, d_n / d_r the non-rotary / rotary query-key head
# widths, d_v the value head width.


def q_width(m: ModelSpec) -> int:
    """Width of the queries (and, under MLA, of the keys): a d (MLA: a (d_n + d_r))."""
    if m.attention == "mla":
        return m.n_heads * (_mla(m.qk_nope_head_dim) + _mla(m.qk_rope_head_dim))
    return m.n_heads * m.dim_head


def kv_width(m: ModelSpec) -> int:
    """Width of each of the keys and values: g d (MLA: their mean, a (d_n + d_r + d_v) / 2,
    so that 2 x kv_width is what K and V hold together)."""
    if m.attention == "mla":
        return (q_width(m) + m.n_heads * _mla(m.v_head_dim)) // 2
    return m.n_kv_heads * m.dim_head


def v_width(m: ModelSpec) -> int:
    """Width of the values, which the output projection reads: a d (MLA: a d_v)."""
    return m.n_heads * (_mla(m.v_head_dim) if m.attention == "mla" else m.dim_head)


def _mla(v: int | None) -> int:
    assert v is not None, "ModelSpec checks that attention = 'mla' sets its widths"
    return v


def mla_matrices(m: ModelSpec) -> tuple[tuple[int, int], ...]:
    """MLA's weight matrices (rows in, columns out), in the order a token passes them.

    Queries: W^DQ h -> r_q and W^UQ r_q -> a (d_n + d_r) (eqs. 12-13; one h -> a (d_n + d_r)
    matrix without q_lora_rank); keys and values: W^DKV h -> r_kv together with W^KR
    h -> d_r (eqs. 9, 14; transformers' kv_a_proj_with_mqa), W^UK and W^UV r_kv -> a (d_n +
    d_v) (eqs. 10-11, one kv_b_proj); output W^O a d_v -> h (eq. 19). Training runs these
    matrices as written (no absorption of W^UK into W^UQ, which only serves inference).
    """
    h, a, r_kv = m.hidden, m.n_heads, _mla(m.kv_lora_rank)
    dn, dr, dv = _mla(m.qk_nope_head_dim), _mla(m.qk_rope_head_dim), _mla(m.v_head_dim)
    r_q = m.q_lora_rank
    q = ((h, r_q), (r_q, a * (dn + dr))) if r_q is not None else ((h, a * (dn + dr)),)
    return (*q, (h, r_kv + dr), (r_kv, a * (dn + dv)), (a * dv, h))


def attention_matmul_weights(m: ModelSpec) -> int:
    """Weights of the attention's projections (no biases, no norms)."""
    if m.attention == "mla":
        return sum(i * o for i, o in mla_matrices(m))
    h, q, kv = m.hidden, q_width(m), kv_width(m)
    return h * (q + 2 * kv) + q * h


def mlp_matrices(m: ModelSpec) -> int:
    """Weight matrices of one MLP (or expert)."""
    # A gated MLP (SwiGLU, Shazeer 2020) has gate, up and down projections; GELU has up, down.
    return 3 if m.mlp == "swiglu" else 2


def norm_params(m: ModelSpec) -> int:
    """Parameters of one normalisation: a gain, plus a bias for a LayerNorm that has one."""
    # RMSNorm is x / rms(x) * g (Zhang & Sennrich 2019; transformers' LlamaRMSNorm holds only
    # `weight`); torch.nn.LayerNorm(bias=False) holds only `weight` too, and so does the
    # runtime's bias-free LayerNorm (runtime/model.py::_norm), while HF OPT's LayerNorms keep
    # their bias whatever enable_bias says (ModelSpec.norm_bias)
    # OLMo 1's LayerNorm has neither gain nor bias (modeling_olmo.OlmoLayerNorm)
    if not m.norm_affine:
        return 0
    return (2 if m.norm_has_bias else 1) * m.hidden


def attention_params(m: ModelSpec) -> int:
    """Q, K, V and output projections (K and V are g*d wide under GQA/MQA), plus biases,
    attention sinks (GPT-OSS: one logit per head) and MLA's two latent norms."""
    h, sinks = m.hidden, (m.n_heads if m.attention_sinks else 0)
    if m.attention == "mla":
        return attention_matmul_weights(m) + _mla_extra_params(m) + sinks
    q, kv = q_width(m), kv_width(m)
    # Qwen2, StableLM-2: Q/K/V biases only; GPT-J: the MLP's only
    biases = ((q + 2 * kv) if m.qkv_has_bias else 0) + (h if m.attention_has_bias else 0)
    return attention_matmul_weights(m) + biases + sinks


def _mla_extra_params(m: ModelSpec) -> int:
    # RMSNorm gains on the compressed query (r_q) and key-value (r_kv) latents (DeepSeek-V2
    # Sec. 2.1.2 footnote; transformers' q_a_layernorm, kv_a_layernorm); a bias, where the
    # model has them, on the down projections and the output (transformers' attention_bias
    # reaches q_a_proj, kv_a_proj_with_mqa and o_proj, not the up projections)
    r_q, r_kv = m.q_lora_rank or 0, _mla(m.kv_lora_rank)
    bias = (r_q + r_kv + _mla(m.qk_rope_head_dim) + m.hidden) if m.bias else 0
    return r_q + r_kv + bias


def mlp_params(m: ModelSpec, width: int | None = None) -> int:
    """One MLP of inner width ``width`` (default ``ffn_hidden``): 2 matrices h x f (GELU) or
    3 (SwiGLU), plus biases."""
    mats, h = mlp_matrices(m), m.hidden
    f = m.ffn_hidden if width is None else width
    return mats * h * f + (((mats - 1) * f + h) if m.bias else 0)


def expert_params(m: ModelSpec) -> int:
    """One routed expert: an MLP of inner width ``moe_ffn_hidden`` (Mixtral: ``ffn_hidden``)."""
    return mlp_params(m, m.expert_ffn)


def _shared_expert_params(m: ModelSpec) -> int:
    # Qwen2-MoE (modeling_qwen2_moe.Qwen2MoeSparseMoeBlock): a shared SwiGLU MLP every token
    # uses, scaled by sigmoid(h -> 1), a bias-free linear gate
    fs = m.shared_expert_ffn_hidden
    return (mlp_params(m, fs) if fs is not None else 0) + (m.hidden if m.shared_expert_gate else 0)


@lru_cache(maxsize=256)
def moe_flags(m: ModelSpec) -> tuple[bool, ...]:
    """Per layer, whether it is a mixture-of-experts layer.

    Megatron-Core's ``moe_layer_freq``: an explicit 0/1 list (``moe_layer_pattern``), or every
    k-th layer; here counted from the first layer after ``first_dense_layers`` (DeepSeek-V3's
    ``first_k_dense_replace``), which with no dense layers is Megatron's i % k == 0
    (``ModelSpec.moe_layer_flags``, cached here).
    """
    return m.moe_layer_flags


def is_moe_layer(m: ModelSpec, index: int) -> bool:
    """Whether layer ``index`` is a mixture-of-experts layer (``moe_flags``)."""
    flags = moe_flags(m)
    return flags[index] if 0 <= index < len(flags) else False


def first_moe_layer(m: ModelSpec) -> int:
    """Index of the first MoE layer (0 for a dense model: its layers are all alike)."""
    return next((i for i, f in enumerate(moe_flags(m)) if f), 0)


def moe_layers_in(m: ModelSpec, start: int, end: int) -> int:
    """How many of layers [start, end) are mixture-of-experts layers."""
    if m.n_experts == 1 or end <= start:
        return 0
    return sum(moe_flags(m)[max(start, 0):end])


def _dense_layer_params(m: ModelSpec, kind: LayerKind = "attention+mlp") -> int:
    # QK-norm (Qwen3, Gemma 3) is an RMSNorm gain over one head's width for Q and one for K;
    # OLMo-2 (modeling_olmo2: RMSNorm(a d), RMSNorm(g d)) and Command-R+ (modeling_cohere:
    # CohereLayerNorm((a, d)), ((g, d))) keep a gain per element of the Q and K projections
    qk = 0
    if m.qk_norm:
        qk = 2 * m.dim_head if m.qk_norm_shared else q_width(m) + kv_width(m)
    attn = attention_params(m) + qk if has_attention(kind) else 0
    ssm = ssm_params(m.ssm, m.hidden) if has_ssm(kind) and m.ssm is not None else 0
    mlp = mlp_params(m) if has_mlp(kind) else 0
    return attn + ssm + mlp + norms_of(kind, m.norms_per_layer) * norm_params(m)


def _moe_extra_params(m: ModelSpec) -> int:
    # an MoE layer's MLP is E experts, the router (a linear map h -> E, Fedus et al. 2021) and
    # any shared expert; the dense layer's MLP it replaces is subtracted
    router = (m.hidden + (1 if m.router_bias else 0)) * m.n_experts  # GPT-OSS: router bias
    experts = m.n_experts * expert_params(m) + router
    return experts + _shared_expert_params(m) - mlp_params(m)


def layer_params(m: ModelSpec, index: int = 0) -> int:
    """Parameters of layer ``index`` (all experts and the router if MoE; its mixer, attention
    or state-space, as ``ModelSpec.kinds`` says)."""
    moe = is_moe_layer(m, index)
    return _dense_layer_params(m, m.kinds[index]) + (_moe_extra_params(m) if moe else 0)


def layers_params(m: ModelSpec, start: int = 0, end: int | None = None) -> int:
    """Parameters of layers [start, end) (a pipeline stage's transformer layers)."""
    end = m.n_layers if end is None else end
    n_moe = moe_layers_in(m, start, end)
    if m.layer_kinds is None:
        body = (end - start) * _dense_layer_params(m)
    else:
        body = sum(_dense_layer_params(m, k) for k in m.layer_kinds[max(start, 0):end])
    return body + n_moe * _moe_extra_params(m)


def word_embedding_params(m: ModelSpec) -> int:
    """The V x e word-embedding table (e = h unless narrower)."""
    return m.vocab * (m.embed_dim or m.hidden)


def projection_params(m: ModelSpec) -> int:
    """One bias-free e x h projection when the word embedding is narrower (OPT-350m)."""
    e = m.embed_dim
    return e * m.hidden if e is not None and e != m.hidden else 0


def embedding_params(m: ModelSpec) -> int:
    """Token embedding V x e (e = h unless narrower), its e -> h projection, and learned
    position embeddings P x h (P = ``max_positions`` or s; none for rope/alibi)."""
    rows = m.max_positions or m.seq_len
    positions = rows * m.hidden if m.position == "learned" else 0
    norm = norm_params(m) if m.embedding_norm else 0  # BLOOM's word_embeddings_layernorm
    return word_embedding_params(m) + projection_params(m) + positions + norm


def output_params(m: ModelSpec) -> int:
    """Final norm, the h -> e projection if any, and the LM head V x e (plus its bias if any),
    as held by the last pipeline stage (even if tied)."""
    head_bias = m.vocab if m.lm_head_bias else 0  # GPT-J, Phi-2: nn.Linear(h, V, bias=True)
    return ((norm_params(m) if m.final_norm else 0) + projection_params(m)
            + word_embedding_params(m) + head_bias)


def params(m: ModelSpec) -> int:
    """Total parameters, counting tied input/output embeddings once."""
    tied = word_embedding_params(m) if m.tied_embeddings else 0
    return embedding_params(m) + layers_params(m) + output_params(m) - tied


def active_params(m: ModelSpec) -> int:
    """Parameters used per token: only ``experts_per_token`` experts of each MoE layer."""
    idle = (m.n_experts - m.experts_per_token) * expert_params(m)
    return params(m) - moe_layers_in(m, 0, m.n_layers) * idle


def param_bytes(m: ModelSpec, dtype_bytes: float = 2) -> float:
    """Bytes of all parameters in one data type."""
    return params(m) * dtype_bytes


def bytes_per_layer(m: ModelSpec, dtype_bytes: float = 2, index: int = 0) -> float:
    """Bytes of one transformer layer's parameters in one data type."""
    return layer_params(m, index) * dtype_bytes


def padded_vocab(vocab: int, multiple: int) -> int:
    """``vocab`` rounded up to a multiple of ``multiple`` (Megatron-LM's
    megatron/training/tokenizer/tokenizer.py::_vocab_size_with_padding: multiple =
    make_vocab_size_divisible_by x tensor_model_parallel_size, the rows a framework builds)."""
    return -(-vocab // multiple) * multiple


def with_padded_vocab(m: ModelSpec, multiple: int) -> ModelSpec:
    """``m`` with its embedding and LM-head rows padded as a framework builds them."""
    rows = padded_vocab(m.vocab, multiple)
    return m if rows == m.vocab else replace(m, vocab=rows)
