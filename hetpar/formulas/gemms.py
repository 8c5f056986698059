"""Per-GEMM shapes of one layer (and the LM head) on one TP rank."""

from __future__ import annotations

import math
from functools import lru_cache
from typing import NamedTuple

from hetpar.errors import Infeasible
from hetpar.formulas.flops import attention_core_flops_per_token
from hetpar.formulas.ssm import ssm_matrices
from hetpar.specs.model import ModelSpec
from hetpar.specs.ssm import LayerKind, has_attention, has_mlp, has_ssm

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


def per_rank(total: int, tp: int, what: str, uneven: bool = False) -> int:
    """The share of ``total`` heads or columns one TP rank holds (the largest if uneven)."""
    if uneven:
        # Nonuniform TP (Arfeen et al. 2025): shards differ by one head/column; the largest
        # shard paces the group, so the per-rank cost is the ceiling.
        return math.ceil(total / tp)
    if total % tp:
        raise Infeasible("divisibility", f"{what} ({total}) not divisible by tp ({tp})")
    return total // tp


def kv_heads_per_rank(m: ModelSpec, tp: int, uneven: bool = False) -> int:
    """KV heads one TP rank holds (at least one: replicated beyond g ranks)."""
    # More TP ranks than KV heads: each KV head sits on tp/g ranks. Feasibility
    # (hetpar/feasibility.py::tp_shards) forbids it for even TP, as Megatron-Core does; only
    # nonuniform-TP replicas (uneven=True) and cost-only callers reach this branch.
    if m.n_kv_heads >= tp:
        return per_rank(m.n_kv_heads, tp, "n_kv_heads", uneven)
    if tp % m.n_kv_heads and not uneven:
        raise Infeasible("divisibility", f"tp ({tp}) not a multiple of n_kv_heads ({m.n_kv_heads})")
    return 1


@lru_cache(maxsize=8192)
def layer_gemms(
    m: ModelSpec, tokens: int, tp: int = 1, moe: bool = False, uneven: bool = False,
    experts: tuple[int, int, float] = (1, 0, 1.0), kind: LayerKind = "attention+mlp",
    local: int = 0,
) -> tuple[Gemm, ...]:
    """The forward matmuls of one layer on one TP rank processing ``tokens`` tokens.

    Megatron's split: QKV and MLP up/gate are column-parallel (n / tp), the output and MLP
    down projections row-parallel (k / tp). MoE layers route tokens*top-k tokens evenly over
    the experts (balanced routing assumed). Backward runs each GEMM twice with the same sizes.
    With ``uneven`` (nonuniform TP), heads and MLP columns need not divide by ``tp``: the
    largest shard is returned; otherwise indivisible shapes raise Infeasible.

    ``experts`` = (ep, etp, load): with expert parallelism a rank holds n_experts / ep experts,
    each split over etp ranks (0: over tp, as the dense MLP), and runs them as one grouped GEMM
    per matrix on the tokens its EP group routed to them; ``load`` (>= 1) scales the tokens
    of the slowest EP rank (``hetpar.sim.moe.rank_load``). ``local``: the experts this rank
    holds where the plan splits them unevenly (``Plan.experts_per_rank``; 0: n_experts / ep);
    a uniform router gives each expert the same rows, so only their number changes.

    ``kind`` (``ModelSpec.kinds``): the mixer's GEMMs are attention's or a state-space
    mixer's projections (unsplit: feasibility refuses tp > 1 for them); no MLP in ``ssm``,
    ``attention`` layers.
    """
    h = m.hidden
    f = per_rank(m.ffn_hidden, tp, "ffn_hidden", uneven)
    up = 2 * f if m.mlp == "swiglu" else f  # gate and up projections fused, as in Megatron
    out = _attention_gemms(m, tokens, tp, uneven) if has_attention(kind) else []
    if has_ssm(kind) and m.ssm is not None:
        out += [Gemm(f"ssm_proj{i}", tokens, n, k)
                for i, (k, n) in enumerate(ssm_matrices(m.ssm, h))]
    if not has_mlp(kind):
        return tuple(out)
    if moe and m.n_experts > 1:
        ep, etp, load = experts
        etp = etp or tp
        # A rank's expert work is its tokens' top-k assignments over tp ranks (the TP ranks
        # share tokens), whatever the split: E / ep local experts of width fe / etp each take
        # tokens x top-k x ep x etp / (E x tp) rows (ep = 1, etp = tp: tokens x top-k / E).
        routed = math.ceil(tokens * m.experts_per_token * ep * etp / (m.n_experts * tp) * load)
        fe = per_rank(m.expert_ffn, etp, "moe_ffn_hidden", uneven)
        up_e = 2 * fe if m.mlp == "swiglu" else fe
        local = local or m.n_experts // ep
        out += [
            Gemm("router", tokens, m.n_experts, h),
            Gemm("expert_up", routed, up_e, h, local),
            Gemm("expert_down", routed, h, fe, local),
        ]
        out += _shared_expert_gemms(m, tokens, tp, uneven)
    else:
        out += [Gemm("mlp_up", tokens, up, h), Gemm("mlp_down", tokens, h, f)]
    return tuple(out)


def _attention_gemms(m: ModelSpec, tokens: int, tp: int, uneven: bool) -> list[Gemm]:
    """The attention's projections on one TP rank (heads split over ranks)."""
    h, heads = m.hidden, per_rank(m.n_heads, tp, "n_heads", uneven)
    if m.attention == "mla":
        return _mla_gemms(m, tokens, heads)
    d = m.dim_head
    q, kv = heads * d, kv_heads_per_rank(m, tp, uneven) * d
    return [Gemm("qkv", tokens, q + 2 * kv, h), Gemm("attn_out", tokens, h, q)]


def _mla_gemms(m: ModelSpec, tokens: int, heads: int) -> list[Gemm]:
    """MLA's projections (formulas.params.mla_matrices) on a rank holding ``heads`` heads.

    As Megatron-Core builds MLA (megatron-core 0.16.1 models/gpt/gpt_layer_specs.py: the up
    projections column-parallel, linear_proj row-parallel, linear_q_down_proj and
    linear_kv_down_proj ``backend.linear()``, not split), the up projections and the output
    split by heads and the down projections (h -> r_q, h -> r_kv + d_r) run whole on every
    TP rank.
    """
    h, r_kv = m.hidden, m.kv_lora_rank or 0
    dn, dr, dv = m.qk_nope_head_dim or 0, m.qk_rope_head_dim or 0, m.v_head_dim or 0
    out = [Gemm("kv_down", tokens, r_kv + dr, h), Gemm("kv_up", tokens, heads * (dn + dv), r_kv)]
    if m.q_lora_rank is None:
        out.append(Gemm("q", tokens, heads * (dn + dr), h))
    else:
        out += [Gemm("q_down", tokens, m.q_lora_rank, h),
                Gemm("q_up", tokens, heads * (dn + dr), m.q_lora_rank)]
    return [*out, Gemm("attn_out", tokens, h, heads * dv)]


def _shared_expert_gemms(m: ModelSpec, tokens: int, tp: int, uneven: bool) -> list[Gemm]:
    """The shared expert every token passes (split over TP like the dense MLP) and its gate."""
    if m.shared_expert_ffn_hidden is None:
        return []
    fs = per_rank(m.shared_expert_ffn_hidden, tp, "shared_expert_ffn_hidden", uneven)
    up = 2 * fs if m.mlp == "swiglu" else fs
    out = [Gemm("shared_up", tokens, up, m.hidden), Gemm("shared_down", tokens, m.hidden, fs)]
    return out + ([Gemm("shared_gate", tokens, 1, m.hidden)] if m.shared_expert_gate else [])


@lru_cache(maxsize=8192)
def attention_core_flops(m: ModelSpec, tokens: int, seq_len: int, tp: int = 1) -> float:
    """Forward FLOPs of QK^T and scores x V on one TP rank for ``tokens`` query tokens.

    ``seq_len`` is the number of keys each query attends to (the full sequence under CP).
    Heads that do not divide by ``tp`` (nonuniform TP) cost the largest shard's share; the
    FLOPs are the mean over the model's layers (sliding-window layers attend to fewer keys).
    """
    share = math.ceil(m.n_heads / tp) / m.n_heads
    return tokens * attention_core_flops_per_token(m, seq_len) * share


@lru_cache(maxsize=1024)
def head_gemm(m: ModelSpec, tokens: int, tp: int = 1) -> Gemm:
    """The LM-head matmul on one TP rank (vocab split over ranks, padded like Megatron)."""
    return Gemm("lm_head", tokens, math.ceil(m.vocab / tp), m.hidden)
