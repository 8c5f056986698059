"""Adapters that let replay use hetpar.sim as its throughput model, and a factory for both."""

from __future__ import annotations

from typing import Literal

from hetpar.dynamic.cost import AnalyticThroughput, ThroughputModel
from hetpar.dynamic.planner import ShapePlanner
from hetpar.dynamic.state import ClusterState
from hetpar.errors import ConfigError, Infeasible
from hetpar.specs.job import Job
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import Plan

CostKind = Literal["analytic", "sim"]
COST_KINDS: tuple[CostKind, ...] = ("analytic", "sim")


class SimThroughput:
    """Tokens/s from ``hetpar.sim.simulate`` on the state's derived ClusterSpec (0 if OOM)."""

    def __init__(self, model: ModelSpec, job: Job) -> None:
        from hetpar.sim import simulate  # imported here: replay works without the simulator

        self.simulate = simulate
        self.model, self.job = model, job
        self._cache: dict[tuple[int, int], tuple[Plan, ClusterState, float]] = {}

    def tokens_per_s(self, plan: Plan, state: ClusterState) -> float:
        """The simulator's tokens/s, or 0.0 if the plan cannot run or runs out of memory."""
        if state.cluster is None:
            return 0.0
        key = (id(plan), id(state))
        hit = self._cache.get(key)
        if hit is not None and hit[0] is plan and hit[1] is state:
            return hit[2]
        try:
            report = self.simulate(self.model, state.cluster, plan, self.job)
            value = 0.0 if report.oom else float(report.tokens_per_s)
        except Infeasible:
            value = 0.0
        if len(self._cache) > 50_000:
            self._cache.clear()
        self._cache[key] = (plan, state, value)
        return value


def make_models(kind: str, model: ModelSpec, job: Job) -> tuple[ThroughputModel, ShapePlanner]:
    """The throughput model named ``kind`` and a ShapePlanner that scores plans with it."""
    cost: ThroughputModel
    if kind == "analytic":
        cost = AnalyticThroughput(model, job)
    elif kind == "sim":
        try:
            cost = SimThroughput(model, job)
        except ImportError as e:
            raise ConfigError(f"--cost sim: the simulator is not available ({e})") from None
    else:
        raise ConfigError(f"cost model {kind!r} is not allowed; allowed: {', '.join(COST_KINDS)}")
    return cost, ShapePlanner(model, job, cost)
