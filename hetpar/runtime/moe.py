"""The decoder's mixture-of-experts layer: router, top-k, experts, and their EP dispatch.

A token's router scores are a softmax over a linear map h -> E (Fedus et al. 2021, Switch
Transformer eq. 1); its top-k experts' scores, renormalised to sum to one (Mixtral, Jiang et
al. 2024 eq. 1: softmax over the top-k logits; Qwen3's ``norm_topk_prob``), weight the
experts' outputs; an always-active shared expert (Qwen2-MoE), gated by sigmoid(h -> 1) if the
model says so, is added. Dropless: every expert takes every token routed to it.

Under expert parallelism (EP) rank i of an ``ep`` group holds experts
[i E/ep, (i + 1) E/ep) (an uneven split, ``EPContext.counts``: the next counts[i]): the
rows routed to them are sent there by an all-to-all (dispatch) and their outputs come back
by the reverse one (combine), with uneven splits (``alltoall``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F  # noqa: N812

from hetpar.runtime import alltoall, ffn

if TYPE_CHECKING:
    from hetpar.runtime.model import ParamInfo
    from hetpar.specs.model import ModelSpec


@dataclass(frozen=True)
class EPContext:
    """This rank's expert-parallel group (None alone) and the experts it holds."""

    group: Any
    size: int = 1
    first: int = 0
    """First expert held; it holds E / size from there (``counts``: its count)."""
    counts: tuple[int, ...] = ()
    """Experts per rank of the group under an uneven split (``Plan.experts_per_rank``, the
    group's ranks holding consecutive runs in order); empty: E / size each."""


EP_SINGLE = EPContext(None)


def infos(out: dict[str, ParamInfo], m: ModelSpec, pre: str,
          experts: tuple[int, int] | None) -> None:
    """Add MoE layer ``pre``'s router, experts [a, b) (None: all) and shared expert."""
    from hetpar.runtime.model import ParamInfo

    out[pre + "router"] = ParamInfo((m.n_experts, m.hidden), None, "normal")
    if m.router_bias:  # GPT-OSS
        out[pre + "router_b"] = ParamInfo((m.n_experts,), None, "zeros")
    a, b = experts or (0, m.n_experts)
    for e in range(a, b):
        ffn.infos(out, m, f"{pre}experts.{e}.", m.expert_ffn, split=False)
    if m.shared_expert_ffn_hidden is not None:
        ffn.infos(out, m, pre + "shared.", m.shared_expert_ffn_hidden, split=False)
        if m.shared_expert_gate:
            out[pre + "shared_gate"] = ParamInfo((1, m.hidden), None, "normal")


def layer(m: ModelSpec, p: dict[str, torch.Tensor], pre: str, h: torch.Tensor,
          ep: EPContext) -> torch.Tensor:
    """The MoE MLP of the normalised input ``h`` (batch, seq, hidden)."""
    x = h.reshape(-1, h.shape[-1])
    weight, chosen = route(m, p, pre, x)
    k = chosen.shape[1]
    # (token, expert) pairs sorted by expert, ties by token: the order every expert sees its
    # rows in, on one rank or, source by source, across the EP group
    token = torch.arange(x.shape[0], device=x.device).repeat_interleave(k)
    order = torch.sort(chosen.reshape(-1), stable=True).indices
    per_expert = torch.bincount(chosen.reshape(-1), minlength=m.n_experts)
    rows = _experts(m, p, pre, x[token[order]], per_expert, ep)
    y = torch.zeros_like(x).index_add(0, token[order], rows * weight.reshape(-1)[order, None])
    if m.shared_expert_ffn_hidden is not None:
        s = ffn.whole(m, p, pre + "shared.", x)
        if m.shared_expert_gate:
            s = s * torch.sigmoid(F.linear(x, p[pre + "shared_gate"]))
        y = y + s
    return y.view(h.shape)


def route(m: ModelSpec, p: dict[str, torch.Tensor], pre: str,
          x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's top-k experts (k = ``experts_per_token``) and their renormalised weights."""
    scores = F.linear(x, p[pre + "router"], p.get(pre + "router_b")).softmax(-1)
    # A stable sort: of equal scores the lower expert wins, on every rank and in the reference
    # (torch.topk does not promise an order for ties).
    chosen = torch.sort(scores.detach(), dim=-1, descending=True,
                        stable=True).indices[:, : m.experts_per_token]
    top = scores.gather(1, chosen)
    return top / top.sum(-1, keepdim=True), chosen


def _experts(m: ModelSpec, p: dict[str, torch.Tensor], pre: str, rows: torch.Tensor,
             per_expert: torch.Tensor, ep: EPContext) -> torch.Tensor:
    """Every row through its expert (rows sorted by expert, ``per_expert`` of each), EP-
    dispatched when ``ep`` has more than one rank; the outputs in the rows' order."""
    if ep.size == 1:
        return _local(m, p, pre, rows, per_expert.tolist(), 0)
    counts = list(ep.counts) or [m.n_experts // ep.size] * ep.size
    held = counts[[sum(counts[:i]) for i in range(ep.size)].index(ep.first)]
    send = [int(s.sum()) for s in torch.split(per_expert, counts)]
    # [source][my expert] row counts: the receive splits and where each expert's rows are
    if ep.counts:  # uneven: each source sends each rank its own number of counts
        got = alltoall.exchange(per_expert, counts, [held] * ep.size, ep.group).view(
            ep.size, held)
    else:
        got = alltoall.counts(per_expert, ep.size, ep.group)
    recv = got.sum(1).tolist()
    arrived = alltoall.AllToAll.apply(rows, send, recv, ep.group)
    # arrived rows go source by source, each source's by expert: regroup them by expert
    expert_of = torch.arange(held, device=rows.device).repeat(ep.size).repeat_interleave(
        got.reshape(-1))
    by_expert = torch.sort(expert_of, stable=True).indices
    out = _local(m, p, pre, arrived[by_expert], got.sum(0).tolist(), ep.first)
    back = torch.empty_like(by_expert)
    back[by_expert] = torch.arange(by_expert.numel(), device=rows.device)
    return alltoall.AllToAll.apply(out[back], recv, send, ep.group)


def _local(m: ModelSpec, p: dict[str, torch.Tensor], pre: str, rows: torch.Tensor,
           sizes: list[int], first: int) -> torch.Tensor:
    """Rows (grouped by expert, ``sizes`` of each) through experts first, first + 1, ...
    An expert without rows still runs (on none), so its weights get a zero gradient."""
    parts = torch.split(rows, sizes)
    return torch.cat([ffn.whole(m, p, f"{pre}experts.{first + j}.", part)
                      for j, part in enumerate(parts)])
