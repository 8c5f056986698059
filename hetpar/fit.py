"""Fit the simulator's free parameters on a runs CSV, and leave-one-source-out predictions.

One procedure: bounded coordinate descent on the mean absolute log error, |log(predicted /
measured)|, over every row the simulator predicts. Each row's blanks (micro-batch, recompute,
vpp) are filled once with the starting parameters and held fixed while fitting, so the
objective is a deterministic function of the parameters alone. Provenance columns are never
read; the source column only groups rows for leave-one-source-out.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hetpar.sim.profile import FittedParams, bundled_fit
from hetpar.validation.predict import RowResult, predict_row
from hetpar.validation.rows import Choice


@dataclass(frozen=True, kw_only=True)
class Parameter:
    """One free parameter: its plausible range and where that range comes from."""

    name: str
    low: float
    high: float
    source: str


PARAMETERS = (
    Parameter(name="kernel_gap_us", low=2.0, high=30.0,
              source="CUDA kernel launch latency 2-10 us plus stream syncs around collectives "
                     "(NVIDIA CUDA best-practices guide; PyTorch profiler traces)"),
    Parameter(name="kernel_dispatch_us", low=5.0, high=40.0,
              source="PyTorch eager per-op CPU overhead, 5-40 us (Paszke et al. 2019; "
                     "torch.compile / CUDA-graph motivation)"),
    Parameter(name="microbatch_overhead_ms", low=0.0, high=5.0,
              source="pipeline-schedule bookkeeping and p2p handshakes per micro-batch"),
    Parameter(name="iteration_overhead_ms", low=0.0, high=50.0,
              source="loss all-reduce, logging, data loading per iteration"),
    Parameter(name="collective_step_latency_us", low=2.0, high=30.0,
              source="NCCL ring step latency across nodes, 2-30 us (NCCL tuning model: "
                     "base + per-hop network latency)"),
)


def source_key(row: dict[str, str]) -> str:
    """The publication a row comes from (its source without a parenthetical suffix)."""
    return row["source"].split(" (")[0].strip()


def _loss(results: Sequence[RowResult]) -> float:
    """Mean absolute log error: about the MAPE for small errors, and robust to the few rows
    the physics cannot explain (a squared loss would let them pull every parameter)."""
    errs = [abs(math.log(r.predicted / r.measured)) for r in results
            if r.predicted and r.measured > 0]
    return sum(errs) / len(errs) if errs else math.inf


Evaluate = Callable[[FittedParams], float]


Memo = dict[tuple[int, FittedParams], RowResult]


def _evaluator(rows: Sequence[dict[str, str]], choices: Sequence[Choice | None],
               index: Sequence[int] | None = None, memo: Memo | None = None) -> Evaluate:
    """The loss of parameters on ``rows``; ``memo`` (keyed by ``index``) shares row
    predictions between fits on overlapping rows (the leave-one-source-out folds)."""
    index = index if index is not None else range(len(rows))
    memo = memo if memo is not None else {}

    def row(i: int, r: dict[str, str], c: Choice, p: FittedParams) -> RowResult:
        hit = memo.get((i, p))
        if hit is None:
            hit = memo[(i, p)] = predict_row(r, fitted=p, choice=c)
        return hit

    def f(p: FittedParams) -> float:
        return _loss([row(i, r, c, p) for i, r, c in zip(index, rows, choices, strict=True)
                      if c is not None])
    return f


def coordinate_descent(f: Evaluate, start: FittedParams, *, rounds: int = 2,
                       points: int = 5, span: float = 0.5) -> FittedParams:
    """Minimise ``f`` one parameter at a time on a grid of ``points`` inside its bounds,
    first ``span`` x its range either side of the current value, halved every round."""
    best, best_v = start, f(start)
    width = {p.name: (p.high - p.low) * span for p in PARAMETERS}
    for _ in range(rounds):
        for prm in PARAMETERS:
            centre = getattr(best, prm.name)
            w = width[prm.name]
            for k in range(points):
                x = min(prm.high, max(prm.low, centre - w + 2 * w * k / (points - 1)))
                if x == getattr(best, prm.name):
                    continue
                cand = dataclasses.replace(best, **{prm.name: round(x, 4)})
                v = f(cand)
                if v < best_v:
                    best, best_v = cand, v
            width[prm.name] = w / 2
    return best


def fit(rows: Sequence[dict[str, str]], *, start: FittedParams | None = None,
        rounds: int = 3) -> FittedParams:
    """The parameters that minimise the mean absolute log error on ``rows``, from a fixed
    start (the FittedParams defaults) so that the same file always gives the same fit."""
    start = start or FittedParams()
    choices = [predict_row(r, fitted=start).choice for r in rows]
    return coordinate_descent(_evaluator(rows, choices), start, rounds=rounds)


def leave_one_source_out(
    rows: Sequence[dict[str, str]], *, start: FittedParams | None = None, rounds: int = 2,
) -> list[RowResult]:
    """Every row predicted with parameters fitted on the other sources' rows only.

    Each fold refits from the full-file fit (``start``, default the bundled one) with the same
    coordinate descent on a local grid (a quarter of each range either side, ``rounds``
    halvings), so a source that pulls a parameter is judged without that pull.
    """
    start = start or bundled_fit()
    choices = [predict_row(r, fitted=start).choice for r in rows]
    keys = [source_key(r) for r in rows]
    out: list[RowResult | None] = [None] * len(rows)
    memo: Memo = {}
    for key in dict.fromkeys(keys):
        train = [i for i, k in enumerate(keys) if k != key]
        test = [i for i, k in enumerate(keys) if k == key]
        params = start
        if train:
            f = _evaluator([rows[i] for i in train], [choices[i] for i in train], train, memo)
            params = coordinate_descent(f, start, rounds=rounds, points=5, span=0.25)
        for i in test:
            out[i] = predict_row(rows[i], fitted=params)
    return [r for r in out if r is not None]


def write_fit(params: FittedParams, path: str, runs: str,
              bands: dict[str, tuple[float, float]]) -> None:
    """Write the [fit] table and the leave-one-source-out [interval] bands atomically."""
    from hetpar.io import write_text_atomic

    lines = [
        "# The simulator's free parameters: fitted, never tuned by hand. Written by",
        f"#   hetpar validate {runs} --fit {path}",
        "# (bounded coordinate descent on the mean absolute log error over all rows; "
        "hetpar/fit.py,",
        "# which lists each parameter's range and its source).",
        "[fit]",
    ]
    lines += [f"{f.name} = {getattr(params, f.name)!r}" for f in dataclasses.fields(params)]
    lines += ["", "# 10th / 90th percentile of log(predicted / measured), leave-one-source-out,",
              "# per framework (hetpar/ranking.py): the prediction intervals.", "[interval]"]
    lines += [f'"{k}" = [{lo:.4f}, {hi:.4f}]' for k, (lo, hi) in sorted(bands.items())]
    write_text_atomic(path, "\n".join(lines) + "\n")
