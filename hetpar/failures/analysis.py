"""One failure analysis of a (model, cluster, plan): its setup and its results as plain data."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from hetpar.errors import ConfigError
from hetpar.failures.cost import AnalyticCost, ReplicaCost
from hetpar.failures.layout import Layout, layout
from hetpar.failures.montecarlo import MonteCarloResult
from hetpar.failures.policies import POLICIES, Evaluator, PolicyConfig
from hetpar.failures.rates import FailureRates
from hetpar.failures.sweep import SweepResult, drop_loss, healthy_fraction
from hetpar.specs.cluster import ClusterSpec
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import Plan

PAPER_PLAN = "tp=32,pp=8,dp=128,mbs=1,gbs=1024,sp=true,schedule=zb-h1"
"""The NTP paper's job shape (TP32, DP replicas of 8 NVL32 domains, 1,024 x 16K sequences);
pipeline schedule and sequence parallelism are this project's choice (the paper's are not
stated): ZB-H1 runs any micro-batch count, which the shrunken NTP batch shares need."""

COSTS = ("sim", "analytic")


@dataclass(frozen=True, kw_only=True)
class Setup:
    """Everything a failure analysis runs on."""

    model: ModelSpec
    cluster: ClusterSpec
    plan: Plan
    lay: Layout
    ev: Evaluator
    pool_units: int
    cost: str


def make_setup(model: ModelSpec, cluster: ClusterSpec, plan: Plan, *, config: PolicyConfig,
               cost: str = "sim", spares: int = 0) -> Setup:
    """Layout, replica cost and policy evaluator; ``spares`` units join the cluster's idle ones."""
    if cost not in COSTS:
        raise ConfigError(f"cost model {cost!r} unknown; allowed: {', '.join(COSTS)}")
    if spares < 0:
        raise ConfigError(f"spares {spares} not allowed; allowed: >= 0")
    lay = layout(model, cluster, plan)
    rc: ReplicaCost
    if cost == "sim":
        from hetpar.failures.simcost import SimCost

        rc = SimCost(model, cluster, plan, lay)
    else:
        rc = AnalyticCost(model, cluster, plan, lay)
    ev = Evaluator(lay, rc, config)
    return Setup(model=model, cluster=cluster, plan=plan, lay=lay, ev=ev,
                 pool_units=lay.units + lay.spare_units + spares, cost=cost)


def parse_policies(text: str) -> tuple[str, ...]:
    """``drop,ntp`` -> ("drop", "ntp"); ``all`` -> every policy; ConfigError for others."""
    if text == "all":
        return POLICIES
    items = [x.strip() for x in text.split(",")]
    if len(items) > 1 and (not all(items) or len(set(items)) < len(items)):
        raise ConfigError(f"--policy {text!r}: an empty or repeated policy; give each once")
    out = tuple(x for x in items if x)
    bad = [x for x in out if x not in POLICIES]
    if bad or not out:
        raise ConfigError(f"--policy {bad[0] if bad else text!r} unknown; allowed: all, "
                          f"{', '.join(POLICIES)}")
    return out


def setup_dict(s: Setup, rates: FailureRates | None) -> dict[str, Any]:
    """The layout and the per-degree answers of the cost model (for --json and the text)."""
    lay, ev = s.lay, s.ev
    out: dict[str, Any] = {
        "model": s.model.name, "cluster": s.cluster.name, "cost_model": s.cost,
        "domain_size": lay.domain_size, "tp": lay.tp, "units_per_replica": lay.units_per_replica,
        "domains_per_replica": lay.domains_per_replica, "replicas": lay.replicas,
        "pool_units": s.pool_units, "batch_per_replica": lay.batch_per_replica,
        "iteration_s": ev.t0, "replica_s": ev.pace,
        "ntp_batch": {str(t): ev.bmax[t] for t in ev.degrees},
        "boost_power": {str(t): ev.boost[t] for t in ev.degrees},
    }
    if rates is not None:
        out["rates"] = {"name": rates.name, "per_gpu_day": rates.per_gpu_day,
                        "mean_failed_fraction": rates.mean_failed_fraction()}
    return out


def sweep_dict(s: Setup, r: SweepResult) -> dict[str, Any]:
    """Sweep results with the closed forms beside them."""
    n, k = s.lay.tp, s.lay.units_per_replica
    return {
        "fractions": list(r.fractions), "samples": r.samples, "loss": r.loss,
        "loss_std": r.loss_std, "batch": r.batch, "healthy_units": r.healthy_units,
        "healthy_units_closed_form": [healthy_fraction(p, n) for p in r.fractions],
        "drop_loss_closed_form": [drop_loss(p, n, k) for p in r.fractions],
    }


def mc_dict(r: MonteCarloResult) -> dict[str, Any]:
    """Monte Carlo summary plus the throughput time series (hours, fraction per policy)."""
    ff = r.failed_fraction()
    return {
        "days": r.trace.horizon_s / 86400, "events": int(len(r.trace.times) - 1),
        "failures": int((r.trace.interrupt & (r.trace.unit < r.pool_units)).sum()),
        "checkpoint_interval_s": r.checkpoint_interval_s,
        "failed_fraction_mean": float((ff * r.trace.durations).sum() / r.trace.horizon_s),
        "failed_fraction_max": float(ff.max()),
        "policies": {
            p: {"mean_throughput": x.mean, "goodput": x.goodput,
                "loss_percentiles": x.loss_percentiles, "spares_needed": x.spares_needed,
                "boosted_max": x.boosted_max, "boost_power_gpus": x.boost_power}
            for p, x in r.runs.items()
        },
        "series": {"hours": np.round(r.hours, 4).tolist(),
                   "failed_fraction": np.round(ff, 6).tolist(),
                   "throughput": {p: np.round(x.throughput, 5).tolist()
                                  for p, x in r.runs.items()}},
    }
