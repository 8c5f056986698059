"""FLOPs per token of a ModelSpec: per layer, the LM head, model (MFU) and hardware (HFU)."""

from __future__ import annotations

from typing import Literal

from hetpar.formulas.params import (
    attention_matmul_weights,
    is_moe_layer,
    mlp_matrices,
    moe_layers_in,
    projection_params,
    q_width,
    v_width,
    word_embedding_params,
)
from hetpar.formulas.ssm import ssm_core_flops_per_token, ssm_matmul_weights
from hetpar.specs.model import ModelSpec
from hetpar.specs.ssm import LayerKind, has_attention, has_mlp, has_ssm

Recompute = Literal["none", "selective", "full"]
RECOMPUTE_MODES: tuple[Recompute, ...] = ("none", "selective", "full")

# ----------------------------------------------------------------------------- FLOPs
# A matmul of m x k by k x n costs 2mnk FLOPs; backward costs twice the forward (gradients
# of inputs and of weights), so training = 3 x forward (Narayanan et al. SC'21, Sec. 5.1).
# Attention scores QK^T and scores x V each cost 2 s d per head per token; like SC'21 and
# PaLM (Chowdhery et al. 2022, App. B) we count them without the causal-mask saving.
# Under MLA QK^T runs over d_n + d_r per head and scores x V over d_v (DeepSeek-V2 eqs.
# 17-18); a sliding-window layer (GPT-OSS: 128 keys) attends to min(s, window) keys.
# A state-space layer's projections count like any matmul; its conv and scan are
# formulas/ssm.py::ssm_core_flops_per_token (Mamba, Mamba-2 papers), linear in s.


def _layer_matmul_weights(m: ModelSpec, moe: bool, kind: LayerKind = "attention+mlp") -> int:
    """Weights a token multiplies through in one layer (active experts and router only)."""
    h, mats = m.hidden, mlp_matrices(m)
    mixer = attention_matmul_weights(m) if has_attention(kind) else 0
    if has_ssm(kind) and m.ssm is not None:
        mixer += ssm_matmul_weights(m.ssm, h)
    if not has_mlp(kind):
        return mixer
    if not moe:
        return mixer + mats * h * m.ffn_hidden
    shared = mats * h * (m.shared_expert_ffn_hidden or 0) + (h if m.shared_expert_gate else 0)
    return mixer + m.experts_per_token * mats * h * m.expert_ffn + h * m.n_experts + shared


def attention_share(m: ModelSpec) -> float:
    """Share of the layers that attend (1 unless ``layer_kinds`` mixes in others)."""
    if m.layer_kinds is None:
        return 1.0
    return sum(has_attention(k) for k in m.layer_kinds) / m.n_layers


def attended_keys(m: ModelSpec, seq_len: int, index: int | None = None) -> float:
    """Keys a query of layer ``index`` attends to: s, or min(s, window) in a sliding-window
    layer; with no index, the mean over the layers (a stage or model average)."""
    w = m.sliding_window
    if w is None or w >= seq_len:
        return float(seq_len)
    k = m.full_attention_interval
    if index is not None:
        return float(seq_len if (index + 1) % k == 0 else w)
    full = m.n_layers // k  # layers i with (i + 1) % k == 0 (GPT-OSS layer_types)
    return (full * seq_len + (m.n_layers - full) * w) / m.n_layers


def attention_core_flops_per_token(
    m: ModelSpec, seq_len: int, index: int | None = None
) -> float:
    """Forward FLOPs of QK^T and scores x V per token per layer: 2 s a d + 2 s a d (MLA:
    2 s a (d_n + d_r) + 2 s a d_v); s the keys attended (``attended_keys``). Layers without
    attention (``layer_kinds``) have none: with no index, the mean over all layers."""
    if index is not None and not has_attention(m.kinds[index]):
        return 0.0
    share = 1.0 if index is not None else attention_share(m)
    return share * 2.0 * attended_keys(m, seq_len, index) * (q_width(m) + v_width(m))


def ssm_flops_per_token(m: ModelSpec, index: int | None = None) -> float:
    """Forward FLOPs of the conv and scan of layer ``index`` per token (none without an SSM
    mixer); with no index, the mean over the layers."""
    if m.ssm is None:
        return 0.0
    kinds = m.kinds if index is None else (m.kinds[index],)
    return ssm_core_flops_per_token(m.ssm) * sum(map(has_ssm, kinds)) / len(kinds)


def layer_forward_flops_per_token(m: ModelSpec, seq_len: int, index: int = 0) -> float:
    """Forward matmul FLOPs of layer ``index`` per token (projections, MLP, attention core,
    a state-space mixer's conv and scan)."""
    weights = _layer_matmul_weights(m, is_moe_layer(m, index), m.kinds[index])
    return (2.0 * weights + attention_core_flops_per_token(m, seq_len, index)
            + ssm_flops_per_token(m, index))


def layer_forward_flops(m: ModelSpec, seq_len: int, tokens: int, index: int = 0) -> float:
    """Forward FLOPs of layer ``index`` for ``tokens`` tokens of sequences of ``seq_len``."""
    return tokens * layer_forward_flops_per_token(m, seq_len, index)


def head_forward_flops_per_token(m: ModelSpec) -> float:
    """Forward FLOPs of the LM head (logits) per token: 2 h V (2 e V + 2 h e when the word
    embedding is e-wide with a projection, OPT-350m)."""
    return 2.0 * (word_embedding_params(m) + projection_params(m))


def _layers_forward_flops_per_token(m: ModelSpec, seq_len: int) -> float:
    if m.layer_kinds is not None:
        return sum(layer_forward_flops_per_token(m, seq_len, i) for i in range(m.n_layers))
    n_moe = moe_layers_in(m, 0, m.n_layers)
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
