"""A GPT/Llama-style decoder as pure functions over a dict of (possibly TP-sharded) tensors.

The single-process reference and every parallel rank run this same code; a rank only holds
its layers and its TP shard of each weight, so parity with the reference is by construction
up to the order of floating-point sums.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F  # noqa: N812
from torch.utils.checkpoint import checkpoint

from hetpar.runtime import ffn, moe
from hetpar.runtime import tp as tpc
from hetpar.runtime.moe import EP_SINGLE, EPContext
from hetpar.specs.model import ModelSpec

INIT_STD = 0.02  # GPT-2 initialisation (Radford et al. 2019)


@dataclass(frozen=True)
class ParamInfo:
    """Full shape of one parameter and the dim its TP shards split (None = replicated)."""

    shape: tuple[int, ...]
    shard_dim: int | None
    init: str  # "normal", "zeros" or "ones"


def param_infos(m: ModelSpec, layers: range, first: bool, last: bool,
                experts: tuple[int, int] | None = None) -> dict[str, ParamInfo]:
    """Parameters of the chunk holding ``layers`` (plus embeddings if first, head if last);
    of each MoE layer's experts only [a, b) = ``experts`` (None: all)."""
    h, v, dh = m.hidden, m.vocab, m.dim_head
    is_moe = m.moe_layer_flags
    out: dict[str, ParamInfo] = {}
    if first or (last and m.tied_embeddings):
        out["tok_emb"] = ParamInfo((v, h), None, "normal")
    if first and m.position == "learned":
        # ModelSpec.max_positions rows (OPT keeps 2 past its window), else seq_len
        out["pos_emb"] = ParamInfo((m.max_positions or m.seq_len, h), None, "normal")
    for i in layers:
        p = f"layers.{i}."
        _norm(out, m, p + "ln1")
        # Megatron TP (Shoeybi et al. 2019, sec. 3): Q/K/V and the MLP input are split by
        # output rows (heads / ffn units), the attention output and MLP output by columns.
        for name, rows in (("wq", m.n_heads * dh), ("wk", m.n_kv_heads * dh),
                           ("wv", m.n_kv_heads * dh)):
            out[p + name] = ParamInfo((rows, h), 0, "normal")
            if m.bias:
                out[p + "b" + name[1]] = ParamInfo((rows,), 0, "zeros")
        out[p + "wo"] = ParamInfo((h, m.n_heads * dh), 1, "normal")
        if m.bias:
            out[p + "bo"] = ParamInfo((h,), None, "zeros")
        _norm(out, m, p + "ln2")
        if is_moe[i]:
            moe.infos(out, m, p, experts)
        else:
            ffn.infos(out, m, p, m.ffn_hidden, split=True)
    if last:
        _norm(out, m, "lnf")
        if not m.tied_embeddings:
            # Vocab-parallel output layer (Megatron): rows = vocabulary entries.
            out["head"] = ParamInfo((v, h), 0, "normal")
    return out


def _norm(out: dict[str, ParamInfo], m: ModelSpec, name: str) -> None:
    out[name + ".w"] = ParamInfo((m.hidden,), None, "ones")
    if m.norm_has_bias:  # LayerNorm with a bias (ModelSpec.norm_bias; RMSNorm has none)
        out[name + ".b"] = ParamInfo((m.hidden,), None, "zeros")


def init_param(name: str, info: ParamInfo, seed: int, dtype: torch.dtype,
               device: torch.device | str = "cpu") -> torch.Tensor:
    """The full (unsharded) initial value of ``name``: seeded per name, so any subset matches."""
    if info.init == "ones":
        return torch.ones(info.shape, dtype=dtype, device=device)
    if info.init == "zeros":
        return torch.zeros(info.shape, dtype=dtype, device=device)
    g = torch.Generator(device=device).manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    return torch.randn(info.shape, generator=g, dtype=dtype, device=device) * INIT_STD


def shard(t: torch.Tensor, info: ParamInfo, tp_rank: int, tp: int) -> torch.Tensor:
    """TP shard ``tp_rank`` of ``tp`` of the full tensor ``t`` (a copy)."""
    if info.shard_dim is None or tp == 1:
        return t.clone()
    return t.chunk(tp, dim=info.shard_dim)[tp_rank].clone()


def _norm_fwd(m: ModelSpec, p: dict[str, torch.Tensor], name: str, x: torch.Tensor) -> torch.Tensor:
    if m.norm == "rmsnorm":
        # RMSNorm (Zhang & Sennrich 2019): x / rms(x) * g
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * p[name + ".w"]
    return F.layer_norm(x, (m.hidden,), p[name + ".w"], p.get(name + ".b"), 1e-5)


def _rope(x: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding (Su et al. 2021), half-split form, base 10000."""
    s, d = x.shape[-2], x.shape[-1]
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=x.dtype, device=x.device) / d))
    ang = torch.arange(s, dtype=x.dtype, device=x.device)[:, None] * inv[None, :]
    cos, sin = ang.cos(), ang.sin()
    a, b = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


def _linear(x: torch.Tensor, p: dict[str, torch.Tensor], w: str, b: str) -> torch.Tensor:
    return F.linear(x, p[w], p.get(b))


def _attention(m: ModelSpec, p: dict[str, torch.Tensor], pre: str, x: torch.Tensor,
               ctx: tpc.TPContext, selective: bool = False) -> torch.Tensor:
    h = tpc.enter(_norm_fwd(m, p, pre + "ln1", x), ctx)
    bsz, s, _ = h.shape
    dh = m.dim_head
    q = _linear(h, p, pre + "wq", pre + "bq").view(bsz, s, -1, dh).transpose(1, 2)
    k = _linear(h, p, pre + "wk", pre + "bk").view(bsz, s, -1, dh).transpose(1, 2)
    v = _linear(h, p, pre + "wv", pre + "bv").view(bsz, s, -1, dh).transpose(1, 2)
    if m.position == "rope":
        q, k = _rope(q), _rope(k)
    if k.shape[1] != q.shape[1]:  # grouped-query attention (Ainslie et al. 2023)
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    if selective:
        o = checkpoint(F.scaled_dot_product_attention, q, k, v, is_causal=True,
                       use_reentrant=False)
    else:
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    o = F.linear(o.transpose(1, 2).reshape(bsz, s, -1), p[pre + "wo"])
    o = tpc.exit(o, ctx)
    return o + p[pre + "bo"] if pre + "bo" in p else o


def _mlp(m: ModelSpec, p: dict[str, torch.Tensor], pre: str, x: torch.Tensor,
         ctx: tpc.TPContext) -> torch.Tensor:
    h = tpc.enter(_norm_fwd(m, p, pre + "ln2", x), ctx)
    o = tpc.exit(F.linear(ffn.up(m, p, pre, h), p[pre + "w2"]), ctx)
    return o + p[pre + "b2"] if pre + "b2" in p else o


def embed(m: ModelSpec, p: dict[str, torch.Tensor], tokens: torch.Tensor,
          ctx: tpc.TPContext) -> torch.Tensor:
    """Token (+ learned position) embedding; the local sequence shard under SP."""
    x = F.embedding(tokens, p["tok_emb"])
    if "pos_emb" in p:
        x = x + p["pos_emb"][: tokens.shape[1]]
    return tpc.seq_shard(x, ctx)


def blocks(m: ModelSpec, p: dict[str, torch.Tensor], layers: range, x: torch.Tensor,
           ctx: tpc.TPContext, recompute: str = "none",
           ep: EPContext = EP_SINGLE) -> torch.Tensor:
    """Pre-norm transformer blocks ``layers`` applied to ``x``.

    ``recompute="full"`` keeps only each block's input and reruns the block in the backward
    pass; ``"selective"`` reruns just the attention core (Korthikanti et al. 2022, sec. 5).
    ``ep``: the expert-parallel group of the MoE layers (a rerun block redoes its
    all-to-alls, on every rank of the group alike).
    """
    for i in layers:
        if recompute == "full":
            x = checkpoint(_block, m, p, i, x, ctx, False, ep, use_reentrant=False)
        else:
            x = _block(m, p, i, x, ctx, recompute == "selective", ep)
    return x


def _block(m: ModelSpec, p: dict[str, torch.Tensor], i: int, x: torch.Tensor,
           ctx: tpc.TPContext, selective: bool, ep: EPContext) -> torch.Tensor:
    pre = f"layers.{i}."
    x = x + _attention(m, p, pre, x, ctx, selective)
    if m.moe_layer_flags[i]:  # tp = 1 (runtime/layout.py): no TP enter / exit around it
        return x + moe.layer(m, p, pre, _norm_fwd(m, p, pre + "ln2", x), ep)
    return x + _mlp(m, p, pre, x, ctx)


def vocab_parallel(m: ModelSpec, ctx: tpc.TPContext) -> bool:
    """Whether the LM head is split over the TP ranks by vocabulary (untied models)."""
    return ctx.size > 1 and not m.tied_embeddings


def head_loss(m: ModelSpec, p: dict[str, torch.Tensor], x: torch.Tensor,
              targets: torch.Tensor, ctx: tpc.TPContext, denom: int) -> torch.Tensor:
    """Sum of token cross-entropies divided by ``denom`` (the global token count).

    Dividing by the global token count, not the local one, makes the sum over microbatches
    and replicas the global mean loss whatever the batch shares are. With a vocab-parallel
    head every TP rank returns the loss of all its replica's tokens; otherwise (tied
    embeddings) the loss of its local tokens (its sequence slice under SP).
    """
    x = _norm_fwd(m, p, "lnf", x)
    if vocab_parallel(m, ctx):
        logits = F.linear(tpc.enter(x, ctx), p["head"])
        return _vocab_parallel_ce(logits, targets, ctx) / denom
    w = p["tok_emb"] if m.tied_embeddings else p["head"]
    logits = F.linear(x, w)
    t = tpc.seq_shard(targets, ctx)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), t.reshape(-1),
                           reduction="sum") / denom


def vocab_parallel_mean_ce(logits: torch.Tensor, targets: torch.Tensor,
                           ctx: tpc.TPContext) -> torch.Tensor:
    """Mean token cross-entropy of logits split by vocabulary over ``ctx``'s ranks (the
    same on every rank of the TP group)."""
    return _vocab_parallel_ce(logits, targets, ctx) / targets.numel()


def _vocab_parallel_ce(logits: torch.Tensor, targets: torch.Tensor,
                       ctx: tpc.TPContext) -> torch.Tensor:
    """Cross-entropy over logits split by vocabulary (Shoeybi et al. 2019, sec. 3).

    Only (tokens,)-sized tensors cross the TP group: the row max, the sum of exponentials and
    the target logit, never the (tokens, vocab) logits.
    """
    z = logits.reshape(-1, logits.shape[-1])
    n_local = z.shape[1]
    top = z.detach().max(dim=1, keepdim=True).values
    tpc.all_reduce_max(top, ctx)  # a constant shift: the loss does not depend on it
    z = z - top
    sumexp = tpc.reduce_sum(z.exp().sum(dim=1), ctx)
    t = targets.reshape(-1) - ctx.rank * n_local
    inside = (t >= 0) & (t < n_local)
    picked = z.gather(1, t.clamp(0, n_local - 1)[:, None]).squeeze(1) * inside
    return (sumexp.log() - tpc.reduce_sum(picked, ctx)).sum()
