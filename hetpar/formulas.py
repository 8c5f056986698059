"""Parameter counts, FLOPs per token, per-GEMM shapes and bytes per layer of a ModelSpec."""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Literal, NamedTuple

from hetpar.errors import Infeasible
from hetpar.specs.model import ModelSpec

Recompute = Literal["none", "selective", "full"]
RECOMPUTE_MODES: tuple[Recompute, ...] = ("none", "selective", "full")

# Notation (Narayanan et al. SC'21; Korthikanti et al. MLSys'23): h hidden, a heads, d head
# width, g KV heads (GQA/MQA: Ainslie et al. 2023), f MLP width, V vocab, L layers, s sequence.


# ----------------------------------------------------------------------------- parameters


def _q_width(m: ModelSpec) -> int:
    return m.n_heads * m.dim_head


def _kv_width(m: ModelSpec) -> int:
    return m.n_kv_heads * m.dim_head


def _mlp_matrices(m: ModelSpec) -> int:
    # A gated MLP (SwiGLU, Shazeer 2020) has gate, up and down projections; GELU has up, down.
    return 3 if m.mlp == "swiglu" else 2


def norm_params(m: ModelSpec) -> int:
    """Parameters of one normalisation: LayerNorm has a gain and a bias, RMSNorm only a gain."""
    return (2 if m.norm == "layernorm" else 1) * m.hidden


def attention_params(m: ModelSpec) -> int:
    """Q, K, V and output projections (K and V are g*d wide under GQA/MQA), plus biases."""
    h, q, kv = m.hidden, _q_width(m), _kv_width(m)
    weights = h * (q + 2 * kv) + q * h
    qkv_bias = m.bias if m.qkv_bias is None else m.qkv_bias  # Qwen2: Q/K/V biases only
    return weights + ((q + 2 * kv) if qkv_bias else 0) + (h if m.bias else 0)


def mlp_params(m: ModelSpec, width: int | None = None) -> int:
    """One MLP of inner width ``width`` (default ``ffn_hidden``): 2 matrices h x f (GELU) or
    3 (SwiGLU), plus biases."""
    mats, h = _mlp_matrices(m), m.hidden
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


def _moe_layers_in(m: ModelSpec, start: int, end: int) -> int:
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
    n_moe = _moe_layers_in(m, start, end)
    return (end - start) * _dense_layer_params(m) + n_moe * _moe_extra_params(m)


def _word_embedding(m: ModelSpec) -> int:
    return m.vocab * (m.embed_dim or m.hidden)


def _projection(m: ModelSpec) -> int:
    """One bias-free e x h projection when the word embedding is narrower (OPT-350m)."""
    e = m.embed_dim
    return e * m.hidden if e is not None and e != m.hidden else 0


def embedding_params(m: ModelSpec) -> int:
    """Token embedding V x e (e = h unless narrower), its e -> h projection, and learned
    position embeddings P x h (P = ``max_positions`` or s; none for rope/alibi)."""
    rows = m.max_positions or m.seq_len
    positions = rows * m.hidden if m.position == "learned" else 0
    return _word_embedding(m) + _projection(m) + positions


def output_params(m: ModelSpec) -> int:
    """Final norm, the h -> e projection if any, and the LM head V x e, as held by the last
    pipeline stage (even if tied)."""
    return (norm_params(m) if m.final_norm else 0) + _projection(m) + _word_embedding(m)


def params(m: ModelSpec) -> int:
    """Total parameters, counting tied input/output embeddings once."""
    tied = _word_embedding(m) if m.tied_embeddings else 0
    return embedding_params(m) + layers_params(m) + output_params(m) - tied


def active_params(m: ModelSpec) -> int:
    """Parameters used per token: only ``experts_per_token`` experts of each MoE layer."""
    idle = (m.n_experts - m.experts_per_token) * expert_params(m)
    return params(m) - _moe_layers_in(m, 0, m.n_layers) * idle


def param_bytes(m: ModelSpec, dtype_bytes: float = 2) -> float:
    """Bytes of all parameters in one data type."""
    return params(m) * dtype_bytes


def bytes_per_layer(m: ModelSpec, dtype_bytes: float = 2, index: int = 0) -> float:
    """Bytes of one transformer layer's parameters in one data type."""
    return layer_params(m, index) * dtype_bytes


# ----------------------------------------------------------------------------- FLOPs
# A matmul of m x k by k x n costs 2mnk FLOPs; backward costs twice the forward (gradients
# of inputs and of weights), so training = 3 x forward (Narayanan et al. SC'21, Sec. 5.1).
# Attention scores QK^T and scores x V each cost 2 s d per head per token; like SC'21 and
# PaLM (Chowdhery et al. 2022, App. B) we count them without the causal-mask saving.


def _layer_matmul_weights(m: ModelSpec, moe: bool) -> int:
    """Weights a token multiplies through in one layer (active experts and router only)."""
    h, q, kv, mats = m.hidden, _q_width(m), _kv_width(m), _mlp_matrices(m)
    attn = h * (q + 2 * kv) + q * h
    if not moe:
        return attn + mats * h * m.ffn_hidden
    shared = mats * h * (m.shared_expert_ffn_hidden or 0) + (h if m.shared_expert_gate else 0)
    return attn + m.experts_per_token * mats * h * m.expert_ffn + h * m.n_experts + shared


def attention_core_flops_per_token(m: ModelSpec, seq_len: int) -> float:
    """Forward FLOPs of QK^T and scores x V per token per layer: 2 x 2 s a d."""
    return 4.0 * seq_len * _q_width(m)


def layer_forward_flops_per_token(m: ModelSpec, seq_len: int, index: int = 0) -> float:
    """Forward matmul FLOPs of layer ``index`` per token (projections, MLP, attention core)."""
    weights = _layer_matmul_weights(m, is_moe_layer(m, index))
    return 2.0 * weights + attention_core_flops_per_token(m, seq_len)


def layer_forward_flops(m: ModelSpec, seq_len: int, tokens: int, index: int = 0) -> float:
    """Forward FLOPs of layer ``index`` for ``tokens`` tokens of sequences of ``seq_len``."""
    return tokens * layer_forward_flops_per_token(m, seq_len, index)


def head_forward_flops_per_token(m: ModelSpec) -> float:
    """Forward FLOPs of the LM head (logits) per token: 2 h V (2 e V + 2 h e when the word
    embedding is e-wide with a projection, OPT-350m)."""
    return 2.0 * (_word_embedding(m) + _projection(m))


def _layers_forward_flops_per_token(m: ModelSpec, seq_len: int) -> float:
    n_moe = _moe_layers_in(m, 0, m.n_layers)
    per_dense = 2.0 * _layer_matmul_weights(m, False) + attention_core_flops_per_token(m, seq_len)
    per_moe = 2.0 * _layer_matmul_weights(m, True) + attention_core_flops_per_token(m, seq_len)
    return n_moe * per_moe + (m.n_layers - n_moe) * per_dense


def model_flops_per_token(m: ModelSpec, seq_len: int) -> float:
    """Training FLOPs per token without recompute: 3 x forward (what MFU counts, PaLM App. B).

    For GPT shapes this is 72 l h^2 + 12 l s h + 6 h V per token (Korthikanti et al. Sec. 6),
    i.e. Kaplan et al.'s 6N plus the attention term 12 l s h.
    """
    return 3.0 * (_layers_forward_flops_per_token(m, seq_len) + head_forward_flops_per_token(m))


def hardware_flops_per_token(m: ModelSpec, seq_len: int, recompute: Recompute = "none") -> float:
    """Training FLOPs per token including recomputed forward work (what HFU counts).

    full: one more forward of every layer, not of the head: for GPT shapes
    96 l h^2 (1 + s/6h + V/16lh) per token, Narayanan et al. SC'21 eq. 3.
    selective: one more forward of the attention core (QK^T, softmax, dropout, x V),
    which is what Korthikanti et al. (Sec. 5) recompute.
    """
    base = model_flops_per_token(m, seq_len)
    if recompute == "full":
        return base + _layers_forward_flops_per_token(m, seq_len)
    if recompute == "selective":
        return base + m.n_layers * attention_core_flops_per_token(m, seq_len)
    assert recompute == "none", recompute
    return base


def flops_per_token(m: ModelSpec, seq_len: int, recompute: Recompute = "none") -> float:
    """Alias of ``hardware_flops_per_token`` (the name in docs/CONTRACTS.md)."""
    return hardware_flops_per_token(m, seq_len, recompute)


# ----------------------------------------------------------------------------- GEMM shapes


class Gemm(NamedTuple):
    """One matmul of an (m x k) by a (k x n) matrix, repeated ``repeat`` times (experts)."""

    name: str
    m: int
    n: int
    k: int
    repeat: int = 1

    @property
    def flops(self) -> float:
        """Forward FLOPs of all ``repeat`` repetitions."""
        return 2.0 * self.m * self.n * self.k * self.repeat


def _per_rank(total: int, tp: int, what: str, uneven: bool = False) -> int:
    if uneven:
        # Nonuniform TP (Arfeen et al. 2025): shards differ by one head/column; the largest
        # shard paces the group, so the per-rank cost is the ceiling.
        return math.ceil(total / tp)
    if total % tp:
        raise Infeasible("divisibility", f"{what} ({total}) not divisible by tp ({tp})")
    return total // tp


def _kv_heads_per_rank(m: ModelSpec, tp: int, uneven: bool = False) -> int:
    # More TP ranks than KV heads: each KV head sits on tp/g ranks. Feasibility
    # (hetpar/feasibility.py::tp_shards) forbids it for even TP, as Megatron-Core does; only
    # nonuniform-TP replicas (uneven=True) and cost-only callers reach this branch.
    if m.n_kv_heads >= tp:
        return _per_rank(m.n_kv_heads, tp, "n_kv_heads", uneven)
    if tp % m.n_kv_heads and not uneven:
        raise Infeasible("divisibility", f"tp ({tp}) not a multiple of n_kv_heads ({m.n_kv_heads})")
    return 1


@lru_cache(maxsize=8192)
def layer_gemms(
    m: ModelSpec, tokens: int, tp: int = 1, moe: bool = False, uneven: bool = False
) -> tuple[Gemm, ...]:
    """The forward matmuls of one layer on one TP rank processing ``tokens`` tokens.

    Megatron's split: QKV and MLP up/gate are column-parallel (n / tp), the output and MLP
    down projections row-parallel (k / tp). MoE layers route tokens*top-k tokens evenly over
    the experts (balanced routing assumed). Backward runs each GEMM twice with the same sizes.
    With ``uneven`` (nonuniform TP), heads and MLP columns need not divide by ``tp``: the
    largest shard is returned; otherwise indivisible shapes raise Infeasible.
    """
    d, h = m.dim_head, m.hidden
    q = _per_rank(m.n_heads, tp, "n_heads", uneven) * d
    kv = _kv_heads_per_rank(m, tp, uneven) * d
    f = _per_rank(m.ffn_hidden, tp, "ffn_hidden", uneven)
    up = 2 * f if m.mlp == "swiglu" else f  # gate and up projections fused, as in Megatron
    out = [Gemm("qkv", tokens, q + 2 * kv, h), Gemm("attn_out", tokens, h, q)]
    if moe and m.n_experts > 1:
        routed = math.ceil(tokens * m.experts_per_token / m.n_experts)
        fe = _per_rank(m.expert_ffn, tp, "moe_ffn_hidden", uneven)
        up_e = 2 * fe if m.mlp == "swiglu" else fe
        out += [
            Gemm("router", tokens, m.n_experts, h),
            Gemm("expert_up", routed, up_e, h, m.n_experts),
            Gemm("expert_down", routed, h, fe, m.n_experts),
        ]
        out += _shared_expert_gemms(m, tokens, tp, uneven)
    else:
        out += [Gemm("mlp_up", tokens, up, h), Gemm("mlp_down", tokens, h, f)]
    return tuple(out)


def _shared_expert_gemms(m: ModelSpec, tokens: int, tp: int, uneven: bool) -> list[Gemm]:
    """The shared expert every token passes (split over TP like the dense MLP) and its gate."""
    if m.shared_expert_ffn_hidden is None:
        return []
    fs = _per_rank(m.shared_expert_ffn_hidden, tp, "shared_expert_ffn_hidden", uneven)
    up = 2 * fs if m.mlp == "swiglu" else fs
    out = [Gemm("shared_up", tokens, up, m.hidden), Gemm("shared_down", tokens, m.hidden, fs)]
    return out + ([Gemm("shared_gate", tokens, 1, m.hidden)] if m.shared_expert_gate else [])


@lru_cache(maxsize=8192)
def attention_core_flops(m: ModelSpec, tokens: int, seq_len: int, tp: int = 1) -> float:
    """Forward FLOPs of QK^T and scores x V on one TP rank for ``tokens`` query tokens.

    ``seq_len`` is the number of keys each query attends to (the full sequence under CP).
    Heads that do not divide by ``tp`` (nonuniform TP) cost the largest shard's share.
    """
    share = math.ceil(m.n_heads / tp) / m.n_heads
    return tokens * attention_core_flops_per_token(m, seq_len) * share


@lru_cache(maxsize=1024)
def head_gemm(m: ModelSpec, tokens: int, tp: int = 1) -> Gemm:
    """The LM-head matmul on one TP rank (vocab split over ranks, padded like Megatron)."""
    return Gemm("lm_head", tokens, math.ceil(m.vocab / tp), m.hidden)


# ----------------------------------------------------------------------------- activations
# Korthikanti et al. (MLSys'23, Sec. 4 and Table 2) count, per layer, 34 s b h + 5 a s^2 b
# bytes for a GPT layer in 16-bit precision with 1-byte dropout masks. We derive the same
# terms tensor by tensor so they generalise to GQA (K, V are g d wide), SwiGLU (three
# f-wide tensors instead of two), dropout-free models and FlashAttention.


def _mlp_columns_per_token(m: ModelSpec, tp: int, moe: bool) -> int:
    """MLP inner columns one token fills on one TP rank: the dense MLP's, or its top-k
    experts' plus the shared expert's."""
    if not moe:
        return math.ceil(m.ffn_hidden / tp)
    shared = math.ceil((m.shared_expert_ffn_hidden or 0) / tp)
    return m.experts_per_token * math.ceil(m.expert_ffn / tp) + shared


def activation_bytes_per_layer(
    m: ModelSpec,
    seq_len: int,
    micro_batch: int,
    *,
    tp: int = 1,
    sp: bool = False,
    cp: int = 1,
    recompute: Recompute = "none",
    dtype_bytes: float = 2,
    dropout: bool = True,
    flash_attention: bool = False,
    index: int = 0,
) -> float:
    """Activation bytes one layer keeps for backward, per TP/CP rank, for one micro-batch.

    Without sequence parallelism (sp) the norm inputs/outputs and dropout masks are
    replicated on every TP rank (Korthikanti Table 2: s b h (10 + 24/t + 5 a s / h t)).
    Full recompute keeps only the layer input; selective recompute (or FlashAttention)
    drops the s^2 score terms. CP splits the sequence: each rank keeps s/cp tokens.
    """
    tokens = seq_len / cp * micro_batch
    rep = tp if sp else 1
    if recompute == "full":
        return dtype_bytes * tokens * m.hidden / rep
    h, d = m.hidden, m.dim_head
    # The largest shard: equal to the even split when tp divides the heads (NTP otherwise).
    q = _per_rank(m.n_heads, tp, "n_heads", uneven=True) * d
    kv = _kv_heads_per_rank(m, tp, uneven=True) * d
    mask = 1.0 if dropout else 0.0
    # two norm inputs, the QKV input and the MLP input (norm outputs), two dropout masks
    replicated = tokens * h * (4 * dtype_bytes + 2 * mask) / rep
    f_tensors = 3 if m.mlp == "swiglu" else 2  # GELU: its input, down input; SwiGLU: + up out
    split = tokens * dtype_bytes * (
        (q + kv)  # Q and K for QK^T
        + kv  # V for scores x V
        + q  # input of the output projection
        + f_tensors * _mlp_columns_per_token(m, tp, is_moe_layer(m, index))
    )
    heads = math.ceil(m.n_heads / tp)
    if recompute == "selective" or flash_attention:
        # FlashAttention keeps only the fp32 log-sum-exp per query and head (Dao et al. 2022).
        scores = 0.0 if not flash_attention else 4.0 * heads * tokens
    else:
        # softmax output (dtype), dropout mask (1 byte) and dropout output (dtype)
        per_score = dtype_bytes + (mask + dtype_bytes if dropout else 0.0)
        scores = per_score * heads * tokens * seq_len
    assert recompute in ("none", "selective"), recompute
    return replicated + split + scores


def head_activation_bytes(
    m: ModelSpec,
    seq_len: int,
    micro_batch: int,
    *,
    tp: int = 1,
    sp: bool = False,
    cp: int = 1,
    dtype_bytes: float = 2,
) -> float:
    """Activation bytes of the final norm, LM head and fp32 cross-entropy on the last stage."""
    tokens = seq_len / cp * micro_batch
    rep = tp if sp else 1
    norm_in = dtype_bytes * tokens * m.hidden / rep
    head_in = dtype_bytes * tokens * m.hidden / rep
    logits = 4.0 * tokens * math.ceil(m.vocab / tp)  # fp32 logits for the loss (Megatron)
    return norm_in + head_in + logits
