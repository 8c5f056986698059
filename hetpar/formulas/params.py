"""Parameter counts and bytes of a ModelSpec's layers, embeddings and experts."""

from __future__ import annotations

from hetpar.specs.model import ModelSpec

# Notation (Narayanan et al. SC'21; Korthikanti et al. MLSys'23): h hidden, a heads, d head
# width, g KV heads (GQA/MQA: Ainslie et al. 2023), f MLP width, V vocab, L layers, s sequence.



def q_width(m: ModelSpec) -> int:
    """Width of the query projection: a d."""
    return m.n_heads * m.dim_head


def kv_width(m: ModelSpec) -> int:
    """Width of each of the key and value projections: g d."""
    return m.n_kv_heads * m.dim_head


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
    return (2 if m.norm_has_bias else 1) * m.hidden


def attention_params(m: ModelSpec) -> int:
    """Q, K, V and output projections (K and V are g*d wide under GQA/MQA), plus biases."""
    h, q, kv = m.hidden, q_width(m), kv_width(m)
    weights = h * (q + 2 * kv) + q * h
    qkv_bias = m.bias if m.qkv_bias is None else m.qkv_bias  # Qwen2: Q/K/V biases only
    return weights + ((q + 2 * kv) if qkv_bias else 0) + (h if m.bias else 0)


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


def is_moe_layer(m: ModelSpec, index: int) -> bool:
    """Whether layer ``index`` is a mixture-of-experts layer.

    Follows Megatron-Core's ``moe_layer_freq``: layer i is MoE when i % interval == 0.
    """
    return m.n_experts > 1 and index % m.moe_layer_interval == 0


def moe_layers_in(m: ModelSpec, start: int, end: int) -> int:
    """How many of layers [start, end) are mixture-of-experts layers."""
    if m.n_experts == 1 or end <= start:
        return 0
    k = m.moe_layer_interval
    return (end + k - 1) // k - (start + k - 1) // k  # multiples of k in [start, end)


def _dense_layer_params(m: ModelSpec) -> int:
    # QK-norm (Qwen3, Gemma 3) is an RMSNorm gain over one head's width for Q and one for K
    qk = 2 * m.dim_head if m.qk_norm else 0
    return attention_params(m) + mlp_params(m) + m.norms_per_layer * norm_params(m) + qk


def _moe_extra_params(m: ModelSpec) -> int:
    # an MoE layer's MLP is E experts, the router (a linear map h -> E, Fedus et al. 2021) and
    # any shared expert; the dense layer's MLP it replaces is subtracted
    experts = m.n_experts * expert_params(m) + m.hidden * m.n_experts
    return experts + _shared_expert_params(m) - mlp_params(m)


def layer_params(m: ModelSpec, index: int = 0) -> int:
    """Parameters of transformer layer ``index`` (all experts and the router if MoE)."""
    moe = is_moe_layer(m, index)
    return _dense_layer_params(m) + (_moe_extra_params(m) if moe else 0)


def layers_params(m: ModelSpec, start: int = 0, end: int | None = None) -> int:
    """Parameters of layers [start, end) (a pipeline stage's transformer layers)."""
    end = m.n_layers if end is None else end
    n_moe = moe_layers_in(m, start, end)
    return (end - start) * _dense_layer_params(m) + n_moe * _moe_extra_params(m)


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
    return word_embedding_params(m) + projection_params(m) + positions


def output_params(m: ModelSpec) -> int:
    """Final norm, the h -> e projection if any, and the LM head V x e, as held by the last
    pipeline stage (even if tied)."""
    return (norm_params(m) if m.final_norm else 0) + projection_params(m) + word_embedding_params(m)


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
