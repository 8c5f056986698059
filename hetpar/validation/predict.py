"""Predict published training runs (a runs.csv) with the simulator and score the predictions."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from hetpar.catalog import load_gpu_prior
from hetpar.catalog.gpu_fit import fitted_gpu
from hetpar.errors import ConfigError, Infeasible
from hetpar.sim import Report, simulate
from hetpar.sim.moe import DISPATCHERS
from hetpar.sim.profile import FittedParams, FrameworkProfile, resolve
from hetpar.specs.gpu import GPUSpec
from hetpar.validation.rows import (
    Choice,
    choices,
    cluster_of,
    combinations,
    model_of,
    plan_of,
    schedule_of,
)


@dataclass(frozen=True, kw_only=True)
class RowResult:
    """The prediction for one run."""

    row_id: int | str
    source: str
    predicted: float | None
    measured: float
    status: str
    """ok | oom (predicted out of memory) | infeasible | unsupported"""
    reason: str
    choice: Choice | None = None
    """The blanks as filled in (micro-batch, recompute, vpp)."""
    oom: bool = False
    interval: tuple[float, float] | None = None
    """Prediction interval (tokens/s per GPU) from leave-one-source-out residuals."""

    @property
    def error_pct(self) -> float | None:
        if self.predicted is None or not self.measured > 0:
            return None
        return (self.predicted - self.measured) / self.measured * 100.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "row_id": self.row_id,
            "predicted_tokens_per_s_per_gpu": self.predicted,
            "measured_tokens_per_s_per_gpu": self.measured if self.measured > 0 else None,
            "error_pct": self.error_pct,
            "status": self.status,
            "reason": self.reason,
            "interval_tokens_per_s_per_gpu": list(self.interval) if self.interval else None,
        }


def row_profile(row: dict[str, str], fitted: FittedParams | None = None) -> FrameworkProfile:
    """The framework profile a row runs under (its framework column, the given fit, its
    ``moe_dispatcher`` where the source names one, e.g. ``deepep``, its ``ep_overlap``
    where the source overlapped the EP all-to-all, and ``cuda_graphs`` where it captured
    whole layers)."""
    profile = resolve(row.get("framework", "").strip() or None, fitted=fitted)
    dispatcher = row.get("moe_dispatcher", "").strip()
    if dispatcher:
        if dispatcher not in DISPATCHERS:
            raise ConfigError(f"row {row['row_id']}: moe_dispatcher={dispatcher!r} not "
                              f"allowed; allowed: {', '.join(DISPATCHERS)} (or blank)")
        profile = dataclasses.replace(profile, moe_dispatcher=dispatcher)
    overlap = row.get("ep_overlap", "").strip()
    if overlap:
        try:
            share = float(overlap)
        except ValueError:
            share = math.nan
        if not 0 <= share <= 1:
            raise ConfigError(f"row {row['row_id']}: ep_overlap={overlap!r} not allowed; "
                              "allowed: a share from 0 to 1 (or blank)")
        profile = dataclasses.replace(profile, ep_overlap=share)
    graphs = row.get("cuda_graphs", "").strip()
    if graphs:
        if graphs not in ("0", "1"):
            raise ConfigError(f"row {row['row_id']}: cuda_graphs={graphs!r} not allowed; "
                              "allowed: 1, 0 (or blank)")
        profile = dataclasses.replace(profile, cuda_graphs=graphs == "1")
    return profile


def row_gpu(row: dict[str, str], fitted: FittedParams | None) -> GPUSpec | None:
    """The row's GPU at the efficiency asymptotes of ``fitted`` (None: the bundled fit's, as
    the catalog loads it); a GPU the fit does not list keeps its file's (the prior)."""
    if fitted is None:
        return None
    return fitted_gpu(load_gpu_prior(row["gpu"].strip()), fitted.gpu_efficiency)


def predict_row(
    row: dict[str, str], *, fitted: FittedParams | None = None, choice: Choice | None = None
) -> RowResult:
    """Simulate one row; blank micro-batch / recompute / vpp are chosen as the fastest that
    fits (or taken from ``choice``); ``fitted``: the free parameters (default: bundled)."""
    rid: int | str = int(row["row_id"]) if row["row_id"].strip().isdigit() else row["row_id"]
    try:
        measured = float(row["measured_tokens_per_s_per_gpu"])
    except ValueError:
        measured = math.nan
    if not math.isfinite(measured):
        measured = math.nan  # inf would make the error nan%: the row is unsupported instead

    def result(predicted: float | None, status: str, reason: str) -> RowResult:
        return RowResult(row_id=rid, source=row["source"], measured=measured,
                         predicted=predicted, status=status, reason=reason)

    try:
        if not measured > 0:
            raise ConfigError(
                f"row {rid}: measured_tokens_per_s_per_gpu="
                f"{row['measured_tokens_per_s_per_gpu']!r} must be a positive number"
            )
        model, cluster = model_of(row), cluster_of(row, row_gpu(row, fitted))
        profile = row_profile(row, fitted)
        best: tuple[Report, Choice] | None = None
        tried = [choice] if choice is not None else combinations(row)
        last_inf: Infeasible | None = None
        for b, r, v in tried:
            try:
                plan = plan_of(row, micro_batch=b, recompute=r, vpp=v)
                rep = simulate(model, cluster, plan, profile=profile)
            except Infeasible as e:
                last_inf = e
                continue
            if best is None or _better(rep, best[0]):
                best = (rep, (b, r, v))
        if best is None:
            assert last_inf is not None
            return result(None, "infeasible", str(last_inf))
    except ConfigError as e:
        return result(None, "unsupported", str(e))
    rep, (b, r, v) = best
    return _finish(row, result, rep, (b, r, v))


def _finish(row: dict[str, str], result: Callable[[float | None, str, str], RowResult],
            rep: Report, chosen: Choice) -> RowResult:
    """The row's result with ``reason`` naming each blank and what filled it."""
    b, r, v = chosen
    mbs, rec, vpps = choices(row)
    if len(vpps) > 1:
        mbs = choices({**row, "vpp": str(v)})[0]
    notes = []
    if len(mbs) > 1:
        notes.append(f"mbs blank: chose {b} (fastest that fits)")
    elif not row["mbs"].strip():
        notes.append(f"mbs blank: {b}, the framework's one micro-batch per pipeline stage")
    if len(rec) > 1:
        notes.append(f"recompute blank: chose {r} (fastest that fits)")
    if len(vpps) > 1:
        notes.append(f"vpp blank: chose {v} (fastest that fits)")
    elif not row["vpp"].strip() and v > 1:
        notes.append(f"vpp blank: {v}, the one chunk count per rank that divides its layers")
    sched_note = schedule_of(row, v)[1]
    if sched_note:
        notes.append(sched_note)
    if not row["scaleout_gbps_per_gpu"].strip():
        notes.append("scaleout_gbps_per_gpu blank: assumed 200")
    if rep.oom:
        # a measured run did fit: predicting OOM is a miss, not an ok row
        notes.insert(0, "simulator predicts out-of-memory")
        out = result(rep.tokens_per_s_per_gpu, "oom", "; ".join(notes))
        return dataclasses.replace(out, choice=(b, r, v), oom=rep.oom)
    out = result(rep.tokens_per_s_per_gpu, "ok", "; ".join(notes))
    return dataclasses.replace(out, choice=(b, r, v), oom=rep.oom)


def _better(a: Report, b: Report) -> bool:
    """Fits beats does-not-fit; then higher throughput."""
    if a.oom != b.oom:
        return not a.oom
    return a.tokens_per_s_per_gpu > b.tokens_per_s_per_gpu


def validate(rows: Iterable[dict[str, str]]) -> list[RowResult]:
    """Predictions for every row, in order."""
    return [predict_row(r) for r in rows]


def mape(results: Iterable[RowResult]) -> float | None:
    """Mean absolute percentage error over the rows that were predicted."""
    errs = [abs(e) for r in results if (e := r.error_pct) is not None]
    return sum(errs) / len(errs) if errs else None
