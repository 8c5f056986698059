"""Why the best plan won: what bounds it, and how it compares with the alternatives."""

from __future__ import annotations

from hetpar.search import alternatives
from hetpar.search.planner import Ranked, SearchResult
from hetpar.search.robust import Uncertainty, interval, p_beats, parts
from hetpar.sim import breakdown

PIPELINE = {"pipeline": "the pipeline (compute + bubble)"}
"""The synthetic cost model's one pipeline term (``search/synthetic.py``)."""


def limits() -> dict[str, str]:
    """What bounds a plan, per breakdown key: the registry's (``sim.breakdown``)."""
    return {t.key: t.limit for t in breakdown.terms()} | PIPELINE


def bound_by(r: Ranked) -> tuple[str, float]:
    """The largest share of the iteration time and its fraction."""
    parts = {k: v for k, v in r.evaluation.breakdown.items() if v > 0}
    if not parts:
        return "compute", 1.0
    key = max(sorted(parts), key=lambda k: parts[k])
    return key, parts[key] / max(r.evaluation.iteration_time_s, 1e-30)


def explain(result: SearchResult) -> list[str]:
    """A few lines on why the top plan is the best one found."""
    best = result.ranked[0]
    ev = best.evaluation
    key, frac = bound_by(best)
    limit = limits()
    lines = [f"bound by {limit.get(key, key)}: {frac:.0%} of the iteration"]
    shares = sorted(
        ((v / ev.iteration_time_s, k) for k, v in ev.breakdown.items() if v > 0), reverse=True
    )[1:3]
    if shares:
        lines.append(
            "next: " + ", ".join(f"{limit.get(k, k).split(' (')[0]} {s:.0%}" for s, k in shares)
        )
    if idle(result):
        lines.append(idle(result))
    if ev.peak_memory_fraction >= 0.9:
        lines.append(
            f"memory is nearly full ({ev.peak_memory_fraction:.0%} on the fullest GPU): "
            "larger micro-batches or less recomputation do not fit"
        )
    lines += _comparisons(result, best)
    if len(result.ranked) > 1:
        u = result.objective.uncertainty
        p = p_beats(best.evaluation, result.ranked[1].evaluation, u)
        lo, hi = interval(best.evaluation, u)
        lines.append(f"P(#1 faster than #2) = {p:.0%}; #1's 80% interval "
                     f"{lo:,.0f}-{hi:,.0f} tokens/s")
        lines += reorder(result.ranked, u)
    lines += alternatives.explain(result.ranked, result.evaluated, result.network_models)
    return lines


def reorder(ranked: list[Ranked], u: Uncertainty) -> list[str]:
    """How the top plans reorder when the network bandwidth or the compute efficiency is
    off by the uncertainty's ranges (each alone; the plans' own residuals left out)."""
    cases = [
        (f"network bandwidth -{u.network:.0%}", 1.0, 1 / (1 - u.network)),
        (f"network bandwidth +{u.network:.0%}", 1.0, 1 / (1 + u.network)),
        (f"compute efficiency -{u.compute:.0%}", 1 / (1 - u.compute), 1.0),
        (f"compute efficiency +{u.compute:.0%}", 1 / (1 + u.compute), 1.0),
    ]
    ps = [parts(r.evaluation, u) for r in ranked]
    out = []
    for label, fc, fn in cases:
        tps = [p.tokens / p.time(fc, fn) for p in ps]
        order = sorted(range(len(ranked)), key=lambda i: (-tps[i], i))
        if order[0] == 0:
            gap = tps[0] / max(tps[i] for i in order[1:]) - 1
            what = f"#1 stays first ({gap:+.1%} over the next)"
        else:
            what = (f"#{order[0] + 1} overtakes #1 by {tps[order[0]] / tps[0] - 1:+.1%}; "
                    f"order " + " > ".join(f"#{i + 1}" for i in order))
        out.append(f"if {label}: {what}")
    return out


def idle(result: SearchResult) -> str:
    """Why the best plan leaves GPUs idle ("" when it uses them all or the objective is
    about using fewer): the best evaluated plan on every GPU and how much slower it is."""
    best = result.ranked[0]
    n = result.cluster_gpus
    left = n - best.gpus
    if left <= 0 or result.objective.name in ("min_gpus", "budget"):
        return ""
    full = [r for r in result.evaluated if r.gpus == n]
    if not full:
        return (f"{left} of {n} GPUs idle: no plan using all {n} GPUs came within reach "
                "(their throughput bounds are below this plan's, or they do not fit: "
                "see the removal counts)")
    f = max(full, key=lambda r: (r.score, r.key))
    loss = 1 - f.evaluation.tokens_per_s / best.evaluation.tokens_per_s
    return (f"{left} of {n} GPUs idle: the best plan on all {n} GPUs "
            f"({f.plan.name}) is {loss:.1%} slower")


def _comparisons(result: SearchResult, best: Ranked) -> list[str]:
    out = []
    tps = best.evaluation.tokens_per_s
    if len(result.ranked) > 1:
        second = result.ranked[1]
        gain = tps / second.evaluation.tokens_per_s - 1
        out.append(f"{gain:+.1%} tokens/s over #2 ({second.plan.name})")
    uniform = [r for r in result.evaluated if r.key.startswith("uniform:")]
    if uniform and not best.key.startswith("uniform:"):
        u = max(uniform, key=lambda r: (r.evaluation.tokens_per_s, r.key))
        out.append(
            f"{tps / u.evaluation.tokens_per_s - 1:+.1%} over the best uniform plan "
            f"evaluated ({u.plan.name})"
        )
    elif not uniform and not best.key.startswith("uniform:"):
        out.append("no uniform plan came within reach of its bound (all pruned or infeasible)")
    return out
