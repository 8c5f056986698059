"""Polish: hill-climb the top plans' layer splits and batch shares on the full cost model.

The DP and the share solver optimise the cheap stage costs; the full evaluation also sees
what those leave out (gradient sync that grows with a rank's layers, pipeline transfers,
overlap). Moving one layer between neighbouring ranks, or one share unit between replica
classes, and keeping the best move until none helps, recovers that last bit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from hetpar.search.build import build_plan, shares
from hetpar.search.candidates import Candidate
from hetpar.search.costmodel import Evaluation
from hetpar.search.evaluate import Failed, Outcome
from hetpar.specs.job import Job
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import Plan

Shares = list[tuple[int, int]]


def _layer_moves(c: Candidate) -> list[Candidate]:
    out = []
    for ci, cc in enumerate(c.classes):
        layers = list(cc.split.layers)
        for r in range(len(layers) - 1):
            for give, take in ((r + 1, r), (r, r + 1)):
                if layers[give] - 1 < c.knobs.vpp:
                    continue
                new = list(layers)
                new[give] -= 1
                new[take] += 1
                classes = list(c.classes)
                classes[ci] = replace(cc, split=replace(cc.split, layers=tuple(new)))
                out.append(replace(c, classes=classes))
    return out


def _share_moves(per_rep: Shares, unit: int) -> list[Shares]:
    out = []
    classes = sorted({ci for ci, _ in per_rep})
    for src in classes:
        for dst in classes:
            if src == dst:
                continue
            i = max(
                (j for j, (ci, _) in enumerate(per_rep) if ci == src),
                key=lambda j: (per_rep[j][1], -j),
            )
            k = min(
                (j for j, (ci, _) in enumerate(per_rep) if ci == dst),
                key=lambda j: (per_rep[j][1], j),
            )
            if per_rep[i][1] <= unit:
                continue
            new = list(per_rep)
            new[i] = (src, per_rep[i][1] - unit)
            new[k] = (dst, per_rep[k][1] + unit)
            out.append(new)
    return out


def polish(
    cand: Candidate,
    best: Evaluation,
    model: ModelSpec,
    job: Job,
    unit: int,
    evaluate: Callable[[list[Plan]], list[Outcome]],
    max_steps: int = 8,
) -> tuple[Plan | None, Evaluation, int]:
    """Improve ``cand`` move by move; returns (better plan or None, its evaluation, evals)."""
    per_rep = shares(cand, unit, job.global_batch)
    plan: Plan | None = None
    spent = 0
    for _ in range(max_steps):
        trials: list[tuple[Candidate, Shares]] = [(c, per_rep) for c in _layer_moves(cand)]
        trials += [(cand, s) for s in _share_moves(per_rep, unit)]
        if not trials:
            break
        plans = [build_plan(c, model, job, unit, s) for c, s in trials]
        outcomes = evaluate(plans)
        spent += len(plans)
        top = None
        for i, out in enumerate(outcomes):
            if isinstance(out, Failed):
                continue
            if out.tokens_per_s > best.tokens_per_s * (1 + 1e-9) and (
                top is None or out.tokens_per_s > top[1].tokens_per_s
            ):
                top = (i, out)
        if top is None:
            break
        cand, per_rep = trials[top[0]]
        plan, best = plans[top[0]], top[1]
    return plan, best, spent
