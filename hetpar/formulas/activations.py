"""Activation bytes one layer (and the LM head) keeps for backward on one TP/CP rank."""

from __future__ import annotations

import math

from hetpar.formulas.flops import Recompute
from hetpar.formulas.gemms import kv_heads_per_rank, per_rank
from hetpar.formulas.params import is_moe_layer
from hetpar.formulas.ssm import ssm_activation_elements
from hetpar.specs.model import ModelSpec
from hetpar.specs.ssm import has_attention, has_mlp

# ----------------------------------------------------------------------------- activations
# Korthikanti et al. (MLSys'23, Sec. 4 and Table 2) count, per layer, 34 s b h + 5 a s^2 b
# bytes for a GPT layer in 16-bit precision with 1-byte dropout masks. We derive the same
# terms tensor by tensor so they generalise to GQA (K, V are g d wide), SwiGLU (three
# f-wide tensors instead of two), dropout-free models and FlashAttention.


def mlp_width(m: ModelSpec, moe: bool) -> int:
    """MLP inner columns one token fills (before any TP split): ``ffn_hidden`` in a dense
    layer; in an MoE layer its top-k experts' plus the shared expert's (transformers
    modeling_qwen2_moe.Qwen2MoeSparseMoeBlock: every token passes the shared expert)."""
    if not moe or m.n_experts == 1:
        return m.ffn_hidden
    return m.experts_per_token * m.expert_ffn + (m.shared_expert_ffn_hidden or 0)


def mlp_columns_per_token(m: ModelSpec, tp: int, moe: bool) -> int:
    """MLP inner columns one token fills on one TP rank: the dense MLP's, or its top-k
    experts' plus the shared expert's."""
    if not moe:
        return math.ceil(m.ffn_hidden / tp)
    shared = math.ceil((m.shared_expert_ffn_hidden or 0) / tp)
    return m.experts_per_token * math.ceil(m.expert_ffn / tp) + shared


def _qkv_columns(m: ModelSpec, tp: int) -> tuple[int, int, int, int]:
    """Query, key, value and attention-output columns on the largest TP shard (even split when
    tp divides the heads, NTP otherwise); MLA's keys are (d_n + d_r), values d_v wide per head."""
    heads = per_rank(m.n_heads, tp, "n_heads", uneven=True)
    if m.attention == "mla":
        qk, v = heads * ((m.qk_nope_head_dim or 0) + (m.qk_rope_head_dim or 0)), heads * (
            m.v_head_dim or 0)
        return qk, qk, v, v
    d = m.dim_head
    kv = kv_heads_per_rank(m, tp, uneven=True) * d
    return heads * d, kv, kv, heads * d


def _mla_latents(m: ModelSpec) -> int:
    # MLA's compressed query and key-value latents, the inputs of its up projections
    # (DeepSeek-V2 eqs. 9, 12), whole on every TP rank: the down projections are not split
    # (formulas/gemms.py::_mla_gemms)
    return (m.q_lora_rank or 0) + (m.kv_lora_rank or 0) if m.attention == "mla" else 0


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
    h, kind = m.hidden, m.kinds[index]
    q, k, v, o = _qkv_columns(m, tp)
    mask = 1.0 if dropout else 0.0
    parts = 2 if "+" in kind else 1  # a hybrid model's one-part layers (Nemotron-H, Mamba)
    # per part its norm input, its first matmul's input (the norm output), a dropout mask
    replicated = tokens * h * parts * (2 * dtype_bytes + mask) / rep
    f_tensors = 3 if m.mlp == "swiglu" else 2  # GELU: its input, down input; SwiGLU: + up out
    attn = (q + k + v + o + _mla_latents(m)) if has_attention(kind) else 0  # QK^T, x V, out
    mlp = f_tensors * mlp_columns_per_token(m, tp, is_moe_layer(m, index)) if has_mlp(kind) \
        else 0
    ssm = ssm_activation_elements(m.ssm) if m.ssm is not None and "ssm" in kind else 0
    split = tokens * dtype_bytes * (attn + mlp + ssm)
    heads = math.ceil(m.n_heads / tp) if has_attention(kind) else 0
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
