"""Alternative models of the fabric for ``--objective robust``: the robust pool priced under
each, ranked by its worst loss to the best pooled plan under any of them; fragile plans."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from hetpar.search.evaluate import Failed, Outcome
from hetpar.search.generate import Ranked
from hetpar.search.space import SearchSpace
from hetpar.specs.collectives import NetworkModel
from hetpar.specs.plan import Plan

NOMINAL = "nominal"
"""The cost model's own network (the plans' evaluations), always one of the models."""

DEFAULT: tuple[NetworkModel, ...] = (
    # issue 32: a peer planner (Sailor, SOSP'25) charges a flat ring at each GPU's share of
    # its VM's NIC, 2.38 / 1.09 / 0.49 s for tp1 dp128 / tp2 dp64 / tp4 dp32 on GCP VMs, where
    # NCCL's rings (one NIC crossing per channel) charge the three alike
    NetworkModel(name="per-gpu-ring", algorithm="ring", dp_sync="flat", ring_per_gpu=True,
                 description="flat ring, each GPU at its own NIC share"),
    NetworkModel(name="hierarchical", dp_sync="hierarchical",
                 description="inside nodes first, shards across"),  # Jia et al. 2018
    NetworkModel(name="ring", algorithm="ring", description="NCCL ring only"),
    NetworkModel(name="tree", algorithm="tree", description="NCCL tree for all-reduce"),
    # issue 32: with one GPU per node or an older NCCL large messages reach 60-80% of what
    # the link efficiency predicts; cloud TCP offload varies: the low end
    NetworkModel(name="scale-out-60%", scale_out_efficiency=0.6,
                 description="scale-out links at 60% of the model"),
)
"""The bundled alternatives (a search space's ``network_models`` replaces them)."""

FRAGILE = 0.10
"""A plan best (within ``NEAR``) under one model that loses more than this under another is
reported as fragile (issue 32's threshold)."""
NEAR = 0.005


def models(space: SearchSpace) -> tuple[NetworkModel, ...]:
    """The alternative models a search ranks its robust pool under."""
    return space.network_models or DEFAULT


def price(pool: Sequence[Ranked], alts: Sequence[NetworkModel],
          map_under: Callable[[list[tuple[Plan, NetworkModel]]], list[Outcome]]) -> list[Ranked]:
    """``pool`` with each plan's tokens/s under the nominal model and every alternative (a
    plan that fails under one, e.g. out of memory, reaches 0 there)."""
    items = [(r.plan, m) for r in pool for m in alts]
    outs = map_under(items) if items else []
    out = []
    for i, r in enumerate(pool):
        row = outs[i * len(alts):(i + 1) * len(alts)]
        tps = [0.0 if isinstance(o, Failed) else o.tokens_per_s for o in row]
        named = ((NOMINAL, r.evaluation.tokens_per_s),
                 *((m.name, t) for m, t in zip(alts, tps, strict=True)))
        out.append(replace(r, alternatives=named))
    return out


def best(ranked: Sequence[Ranked]) -> dict[str, tuple[float, Ranked]]:
    """Per model, the highest tokens/s of the priced plans and the plan reaching it."""
    out: dict[str, tuple[float, Ranked]] = {}
    for r in ranked:
        for name, t in r.alternatives:
            if name not in out or t > out[name][0]:
                out[name] = (t, r)
    return out


def losses(r: Ranked, tops: dict[str, tuple[float, Ranked]]) -> dict[str, float]:
    """Per model, ``r``'s loss to the best priced plan under it (0: it is the best)."""
    return {name: 1 - t / tops[name][0] if tops[name][0] > 0 else 0.0
            for name, t in r.alternatives}


def worst(r: Ranked, tops: dict[str, tuple[float, Ranked]]) -> float:
    """``r``'s largest loss over the models (what the robust objective minimises)."""
    return max(losses(r, tops).values(), default=0.0)


def fragile(ranked: Sequence[Ranked]) -> list[tuple[Ranked, str, str, float]]:
    """(plan, model it wins under, model it loses under, loss) for every priced plan that is
    best (within ``NEAR``) under one model and loses more than ``FRAGILE`` under another."""
    priced = [r for r in ranked if r.alternatives]
    tops = best(priced)
    out = []
    for r in priced:
        loss = losses(r, tops)
        wins = [n for n, v in loss.items() if v <= NEAR]
        bad = max(loss, key=lambda n: loss[n], default=None)
        if wins and bad is not None and loss[bad] > FRAGILE:
            out.append((r, wins[0], bad, loss[bad]))
    # the nominal model's winner first (the plan a plain search would pick), then the worst
    return sorted(out, key=lambda x: (x[1] != NOMINAL, -x[3]))


def explain(ranked: Sequence[Ranked], evaluated: Sequence[Ranked],
            alts: Sequence[NetworkModel]) -> list[str]:
    """``why #1 won``'s lines: #1's loss under each model, and the fragile plans."""
    priced = [r for r in evaluated if r.alternatives]
    if not ranked or not ranked[0].alternatives or not priced:
        return []
    tops = best(priced)
    loss = losses(ranked[0], tops)
    words = {m.name: m.description for m in alts}
    lines = [f"network models ({len(priced)} plans priced under each; #1's loss to the best):"]
    for name, v in loss.items():
        t, who = tops[name]
        what = "#1 is the best" if v <= 1e-9 else f"#1 loses {v:.1%} to {who.plan.name}"
        about = f" ({words[name]})" if name in words else ""
        lines.append(f"  {name}{about}: {what} ({t:,.0f} tokens/s)")
    for r, win, lose, v in fragile(priced)[:3]:
        lead = "the best" if losses(r, tops)[win] <= 1e-9 else f"within {NEAR:.1%} of the best"
        lines.append(f"fragile: {r.plan.name} is {lead} under {win} but loses {v:.0%} "
                     f"under {lose}")
    return lines
