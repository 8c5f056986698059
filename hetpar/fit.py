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
from typing import Any, Protocol

from hetpar.fit_gpu import gpu_parameters, keep_gpus, row_params
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

    def get(self, p: FittedParams) -> float:
        return float(getattr(p, self.name))

    def put(self, p: FittedParams, x: float) -> FittedParams:
        change: dict[str, Any] = {self.name: x}
        return dataclasses.replace(p, **change)


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


class Coordinate(Protocol):
    """A fitted number: its name, bounds, and how to read and set it in FittedParams."""

    @property
    def name(self) -> str: ...

    @property
    def low(self) -> float: ...

    @property
    def high(self) -> float: ...

    def get(self, p: FittedParams) -> float: ...

    def put(self, p: FittedParams, x: float) -> FittedParams: ...


Predict = Callable[[FittedParams], list[RowResult]]


def _predictor(rows: Sequence[dict[str, str]], choices: Sequence[Choice | None],
               index: Sequence[int] | None = None, memo: Memo | None = None) -> Predict:
    """The predictions of ``rows`` (those with a choice) under given parameters; ``memo``
    (keyed by ``index`` and the parameters a row depends on: the global ones and its own
    GPU's) shares them between candidates and between the leave-one-source-out folds."""
    index = index if index is not None else range(len(rows))
    memo = memo if memo is not None else {}

    def row(i: int, r: dict[str, str], c: Choice, p: FittedParams) -> RowResult:
        key = (i, row_params(p, r["gpu"].strip()))
        hit = memo.get(key)
        if hit is None:
            hit = memo[key] = predict_row(r, fitted=key[1], choice=c)
        return hit

    def f(p: FittedParams) -> list[RowResult]:
        return [row(i, r, c, p) for i, r, c in zip(index, rows, choices, strict=True)
                if c is not None]
    return f


def _objective(rows: Sequence[dict[str, str]], choices: Sequence[Choice | None],
               start: FittedParams, index: Sequence[int] | None = None,
               memo: Memo | None = None) -> tuple[Evaluate, list[Coordinate]]:
    """The fit's objective on ``rows`` (mean absolute log error plus the GPU asymptotes'
    prior penalty) and its coordinates: the global parameters, then two per GPU type."""
    predict = _predictor(rows, choices, index, memo)
    errs = sorted(abs(math.log(r.predicted / r.measured)) for r in predict(start)
                  if r.predicted and r.measured > 0)
    # Laplace scale of the log errors from their median (P(|e| < m) = 1/2 gives b = m / ln 2):
    # robust to the rows the physics cannot explain, as the loss itself is
    scale = errs[len(errs) // 2] / math.log(2) if errs else 0.0
    used = [r for r, c in zip(rows, choices, strict=True) if c is not None]
    gpus = gpu_parameters(used, scale)
    coords: list[Coordinate] = [*PARAMETERS, *gpus]

    def f(p: FittedParams) -> float:
        return _loss(predict(p)) + sum(g.penalty(p) for g in gpus)
    return f, coords


def coordinate_descent(f: Evaluate, start: FittedParams, *, rounds: int = 2,
                       points: int = 5, span: float = 0.5,
                       coords: Sequence[Coordinate] = PARAMETERS) -> FittedParams:
    """Minimise ``f`` one coordinate at a time on a grid of ``points`` inside its bounds,
    first ``span`` x its range either side of the current value, halved every round."""
    best, best_v = start, f(start)
    width = {c.name: (c.high - c.low) * span for c in coords}
    for _ in range(rounds):
        for c in coords:
            centre = c.get(best)
            w = width[c.name]
            for k in range(points):
                x = round(min(c.high, max(c.low, centre - w + 2 * w * k / (points - 1))), 4)
                if x == c.get(best):
                    continue
                cand = c.put(best, x)
                v = f(cand)
                if v < best_v:
                    best, best_v = cand, v
            width[c.name] = w / 2
    return best


def fit(rows: Sequence[dict[str, str]], *, start: FittedParams | None = None,
        rounds: int = 3) -> FittedParams:
    """The parameters that minimise the mean absolute log error (plus the GPU asymptotes'
    prior penalty) on ``rows``, from a fixed start (the FittedParams defaults: every GPU at
    its file's prior) so that the same file always gives the same fit."""
    start = start or FittedParams()
    choices = [predict_row(r, fitted=start).choice for r in rows]
    f, coords = _objective(rows, choices, start)
    return coordinate_descent(f, start, rounds=rounds, coords=coords)


def leave_one_source_out(
    rows: Sequence[dict[str, str]], *, start: FittedParams | None = None, rounds: int = 2,
) -> list[RowResult]:
    """Every row predicted with parameters fitted on the other sources' rows only.

    Each fold refits every fitted number, GPU asymptotes included, from the full-file fit
    (``start``, default the bundled one) with the same coordinate descent on a local grid (a
    quarter of each range either side, ``rounds`` halvings), so a source that pulls a
    parameter is judged without that pull; a GPU whose rows all come from the held-out
    source goes back to its file's prior.
    """
    start = start or bundled_fit()
    choices = [predict_row(r, fitted=start).choice for r in rows]
    keys = [source_key(r) for r in rows]
    out: list[RowResult | None] = [None] * len(rows)
    memo: Memo = {}
    for key in dict.fromkeys(keys):
        train = [i for i, k in enumerate(keys) if k != key]
        test = [i for i, k in enumerate(keys) if k == key]
        params = keep_gpus(start, [rows[i] for i in train])
        if train:
            f, coords = _objective([rows[i] for i in train], [choices[i] for i in train],
                                   params, train, memo)
            params = coordinate_descent(f, params, rounds=rounds, points=5, span=0.25,
                                        coords=coords)
        for i in test:
            out[i] = predict_row(rows[i], fitted=params)
    return [r for r in out if r is not None]


def write_fit(params: FittedParams, path: str, runs: str,
              bands: dict[str, tuple[float, float]]) -> None:
    """Write the [fit] table and the leave-one-source-out [interval] bands atomically."""
    from hetpar.catalog import load_gpu_prior
    from hetpar.catalog.gpu_fit import prior
    from hetpar.io import write_text_atomic

    lines = [
        "# The simulator's free parameters: fitted, never tuned by hand. Written by",
        f"#   hetpar validate {runs} --fit {path}",
        "# (bounded coordinate descent on the mean absolute log error over all rows; "
        "hetpar/fit.py,",
        "# which lists each parameter's range and its source).",
        "[fit]",
    ]
    lines += [f"{f.name} = {getattr(params, f.name)!r}" for f in dataclasses.fields(params)
              if f.name != "gpu_efficiency"]
    lines += ["", "# Fitted matmul / attention f_inf per GPU type with rows (hetpar/fit_gpu.py: "
              "prior = the GPU", "# file's value, log-normal penalty); a GPU not listed keeps "
              "its file's prior.", "[gpu_efficiency]"]
    lines += [f'"{n}" = {{matmul = {m!r}, attention = {a!r}}}  # prior {pm!r} / {pa!r}'
              for n, m, a in params.gpu_efficiency
              for pm, pa in [prior(load_gpu_prior(n))]]
    lines += ["", "# 10th / 90th percentile of log(predicted / measured), leave-one-source-out,",
              "# per framework (hetpar/ranking.py): the prediction intervals.", "[interval]"]
    lines += [f'"{k}" = [{lo:.4f}, {hi:.4f}]' for k, (lo, hi) in sorted(bands.items())]
    write_text_atomic(path, "\n".join(lines) + "\n")
