"""Predict measured heterogeneous runs (one cluster + explicit plan file per run) and score them."""

from __future__ import annotations

import csv
import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetpar.catalog import gpu_spec, load_job, load_model, load_plan
from hetpar.errors import ConfigError, Infeasible
from hetpar.io import from_dict, read_document
from hetpar.sim import simulate
from hetpar.specs.cluster import ClusterSpec
from hetpar.specs.job import Job
from hetpar.specs.plan import Plan

COLUMNS = (
    "run_id", "source", "source_url", "model", "cluster_file", "plan_file", "job",
    "measured_tokens_per_s", "measured_from", "notes",
)
"""The index columns (../shared/validation/hetero/README.md); paths relative to the index."""
OPTIONAL = ("framework",)
"""Columns an index may add: ``framework`` names the software that ran the row (as the job's
``framework=``; catalog/frameworks), blank = the job's or the default profile."""

BUNDLED = Path(__file__).parent / "catalog" / "validation" / "hetero" / "runs.csv"
"""The development set shipped with the package (43 AMP runs and their files)."""


def is_hetero_index(path: str | Path) -> bool:
    """Whether a CSV's header names the heterogeneous index columns (the dispatch test)."""
    p = Path(path)
    if not p.is_file():
        return False
    try:
        with p.open(newline="", encoding="utf-8") as f:
            header = next(csv.reader(f), [])
    except (UnicodeDecodeError, csv.Error, OSError):
        return False  # not this index: the runs reader reports the file with its name
    return "cluster_file" in header and "plan_file" in header


@dataclass(frozen=True, kw_only=True)
class HeteroResult:
    """The prediction for one heterogeneous run (whole-job tokens/s)."""

    row_id: str
    source: str
    kind: str
    """Plan kind: DP-only, TP, PP or TP+PP (largest TP / stage count over the replicas)."""
    predicted: float | None
    measured: float
    status: str
    """ok | infeasible | unsupported"""
    reason: str

    @property
    def error_pct(self) -> float | None:
        if self.predicted is None or not self.measured > 0:
            return None
        return (self.predicted - self.measured) / self.measured * 100.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "row_id": self.row_id,
            "predicted_tokens_per_s": self.predicted,
            "measured_tokens_per_s": self.measured if self.measured > 0 else None,
            "error_pct": self.error_pct,
            "status": self.status,
            "reason": self.reason,
        }


def read_index(path: str | Path) -> list[dict[str, str]]:
    """Rows of a heterogeneous index; ConfigError unless its columns are exactly ``COLUMNS``."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: file not found")
    with p.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        cols = tuple(reader.fieldnames or ())
        missing = [c for c in COLUMNS if c not in cols]
        extra = [c for c in cols if c not in COLUMNS + OPTIONAL]
        if missing or extra:
            what = f"missing column {missing[0]!r}" if missing else f"unknown column {extra[0]!r}"
            raise ConfigError(f"{p}: {what}; expected columns: {', '.join(COLUMNS)}")
        rows = list(reader)
    base = str(p.resolve().parent)
    return [{**r, "_base": base} for r in rows]


def load_run_cluster(path: Path) -> ClusterSpec:
    """A cluster file whose GPU references may be paths relative to the file's own folder."""
    if not path.is_file():
        raise ConfigError(f"{path}: file not found")
    cluster = from_dict(ClusterSpec, read_document(path), str(path))
    groups = []
    for g in cluster.node_groups:
        gpu = g.gpu
        if isinstance(gpu, str) and gpu.endswith((".toml", ".json")) \
                and (path.parent / gpu).is_file():
            gpu = str((path.parent / gpu).resolve())
        try:
            gpu_spec(gpu)
        except ConfigError as e:
            raise ConfigError(f"{path}: node group {g.name!r}: {e}") from None
        groups.append(dataclasses.replace(g, gpu=gpu))
    return dataclasses.replace(cluster, node_groups=tuple(groups))


def plan_kind(plan: Plan) -> str:
    """DP-only, TP, PP or TP+PP, from the plan's widest TP and longest pipeline."""
    if plan.uniform:
        tp, pp = plan.tp, plan.pp
    else:
        tp = max(s.tp for r in plan.replicas for s in r.stages)
        pp = max(len(r.stages) for r in plan.replicas)
    return {(False, False): "DP-only", (True, False): "TP", (False, True): "PP",
            (True, True): "TP+PP"}[(tp > 1, pp > 1)]


def predict_run(row: dict[str, str]) -> HeteroResult:
    """Simulate one indexed run with its own model, cluster, plan and inline job."""
    base = Path(row.get("_base", "."))
    rid = row["run_id"]
    try:
        measured = float(row["measured_tokens_per_s"])
    except ValueError:
        measured = math.nan
    kind = "?"

    def result(predicted: float | None, status: str, reason: str) -> HeteroResult:
        return HeteroResult(row_id=rid, source=row["source"], kind=kind, predicted=predicted,
                            measured=measured, status=status, reason=reason)

    try:
        if not measured > 0:
            raise ConfigError(f"run {rid}: measured_tokens_per_s="
                              f"{row['measured_tokens_per_s']!r} must be a positive number")
        model_ref = row["model"].strip()
        model = load_model(str(base / model_ref) if (base / model_ref).is_file() else model_ref)
        cluster = load_run_cluster(base / row["cluster_file"].strip())
        plan = load_plan(str(base / row["plan_file"].strip()))
        kind = plan_kind(plan)
        job = _with_framework(load_job(row["job"].strip()), row.get("framework") or "", rid)
        rep = simulate(model, cluster, plan, job)
    except Infeasible as e:
        return result(None, "infeasible", str(e))
    except ConfigError as e:
        return result(None, "unsupported", str(e))
    return result(rep.tokens_per_s, "ok", "simulator predicts out-of-memory" if rep.oom else "")


def _with_framework(job: Job, column: str, rid: str) -> Job:
    """The job with the row's ``framework`` column (a job stating another one is an error)."""
    fw = column.strip()
    if not fw or fw == job.framework:
        return job
    if job.framework:
        raise ConfigError(f"run {rid}: framework column {fw!r} conflicts with the job's "
                          f"framework={job.framework!r}")
    return dataclasses.replace(job, framework=fw)


def validate(rows: Iterable[dict[str, str]]) -> list[HeteroResult]:
    """Predictions for every run, in order."""
    return [predict_run(r) for r in rows]


def mape(results: Iterable[HeteroResult]) -> float | None:
    """Mean absolute percentage error over the runs that were predicted."""
    errs = [abs(e) for r in results if (e := r.error_pct) is not None]
    return sum(errs) / len(errs) if errs else None


def render(results: list[HeteroResult], *, per_row: bool = False) -> str:
    """Table per source and per plan kind: runs, ok, MAPE, mean signed error, worst."""
    def line(name: str, rs: list[HeteroResult]) -> str:
        errs = [e for r in rs if (e := r.error_pct) is not None]
        ok = sum(r.status == "ok" for r in rs)
        if not errs:
            return f"{name[:44]:44s} {len(rs):5d} {ok:5d}       -       -       -"
        m = sum(abs(e) for e in errs) / len(errs)
        bias = sum(errs) / len(errs)
        worst = max(errs, key=abs)
        return f"{name[:44]:44s} {len(rs):5d} {ok:5d} {m:6.1f}% {bias:+6.1f}% {worst:+6.1f}%"

    out = [f"{'runs':44s} {'n':>5s} {'ok':>5s} {'MAPE':>7s} {'bias':>7s} {'worst':>7s}"]
    for key in ("source", "kind"):
        groups: dict[str, list[HeteroResult]] = {}
        for r in results:
            groups.setdefault(getattr(r, key), []).append(r)
        out += [line(f"{key} {k}", rs) for k, rs in groups.items()]
    out.append(line("all", results))
    out += [f"run {r.row_id}: {r.status}: {r.reason}" for r in results if r.status != "ok"]
    if per_row:
        out += ["", f"{'run':>10s} {'kind':>7s} {'predicted':>10s} {'measured':>10s} {'error':>8s}"]
        for r in results:
            pred = f"{r.predicted:10.0f}" if r.predicted is not None else f"{'-':>10s}"
            err = f"{r.error_pct:+7.1f}%" if r.error_pct is not None else f"{'-':>8s}"
            out.append(f"{r.row_id:>10s} {r.kind:>7s} {pred} {r.measured:10.0f} {err}  {r.reason}")
    return "\n".join(out)


def run_cli(path: str | Path, *, as_json: bool, per_row: bool) -> int:
    """``hetpar validate INDEX.csv`` for a heterogeneous index (dispatched by cli/validate)."""
    import json
    import sys

    results = validate(read_index(path))
    if as_json:
        json.dump({"rows": [r.to_dict() for r in results], "mape_pct": mape(results)},
                  sys.stdout, indent=1)
        print()
    else:
        print(render(results, per_row=per_row))
    return 0
