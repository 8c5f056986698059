"""Adapters that let replay use hetpar.sim (throughput) and hetpar.search (planning)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Literal

from hetpar.dynamic.cost import AnalyticThroughput, ThroughputModel
from hetpar.dynamic.incremental import Decision, Ranking, replan
from hetpar.dynamic.planner import Planner, ShapePlanner
from hetpar.dynamic.state import ClusterState
from hetpar.errors import ConfigError, Infeasible
from hetpar.placement import place
from hetpar.specs.cluster import ClusterSpec
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
        # Keyed on content: states of a flapping link repeat with new objects each time.
        self._cache: dict[tuple[Plan, ClusterSpec], float] = {}

    def tokens_per_s(self, plan: Plan, state: ClusterState) -> float:
        """The simulator's tokens/s, or 0.0 if the plan cannot run or runs out of memory."""
        if state.cluster is None:
            return 0.0
        key = (plan, state.cluster)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        try:
            # The plan sets the batch (the planner's probes of one group run a smaller one);
            # the job sets sequence length, precision and optimizer.
            job = self.job if plan.batch == self.job.global_batch else dataclasses.replace(
                self.job, global_batch=plan.batch)
            report = self.simulate(self.model, state.cluster, plan, job)
            value = 0.0 if report.oom else float(report.tokens_per_s)
        except Infeasible:
            value = 0.0
        if len(self._cache) > 50_000:
            self._cache.clear()
        self._cache[key] = value
        return value


class SearchPlanner:
    """The Planner interface on ``hetpar.search.search`` (its own cost model: the simulator).

    It explores more plan families than ShapePlanner (pipelines across groups,
    interleaving, recompute) but one search takes seconds (256 GPUs) to minutes (1,024).
    With ``incremental`` (the default) a state with the same GPUs as the last searched one
    re-simulates that search's ``keep`` best evaluated plans moved to the new state and answers
    with the best (``dynamic/incremental.py``); a changed GPU set searches again. ``warm``
    is not used. Answers are cached per cluster state; ``full_searches`` and ``decisions``
    count the work done.
    """

    def __init__(self, model: ModelSpec, job: Job, *, workers: int = 1,
                 incremental: bool = True, keep: int = 20) -> None:
        from hetpar.search import search  # imported here: replay works without the planner

        self.search = search
        self.model, self.job, self.workers = model, job, workers
        self.incremental, self.keep = incremental, keep
        self._cache: dict[ClusterSpec, Plan | None] = {}
        self._last: Ranking | None = None
        self.full_searches = 0
        self.decisions: list[Decision] = []

    def best(self, state: ClusterState, warm: Plan | None = None) -> Plan | None:
        """The search's best plan for ``state``, with devices assigned (None if none fits)."""
        if state.cluster is None:
            return None
        if state.cluster not in self._cache:
            if self.incremental:
                decision, self._last = replan(state, self._last, self._pick, self._full)
            else:
                ranking = self._full(state)
                decision = Decision(plan=ranking.plans[0] if ranking else None, full=True,
                                    priced=0)
            self.decisions.append(decision)
            self._cache[state.cluster] = decision.plan
        return self._cache[state.cluster]

    def _pick(self, plans: Sequence[Plan], state: ClusterState) -> Plan | None:
        """The fastest of ``plans`` on ``state`` under the search's simulator cost model,
        after its collectives pass (forced NCCL choices where their bound, the exposed
        network time, says they could win: a slower link can make them pay)."""
        from hetpar.search.collsearch import try_collectives
        from hetpar.search.evaluate import Failed, evaluate_one
        from hetpar.search.generate import Ranked, SearchState
        from hetpar.search.objectives import Objective
        from hetpar.search.rules import SearchStats
        from hetpar.search.simcost import SimCostModel
        from hetpar.search.space import SearchSpace

        assert state.cluster is not None
        cost = SimCostModel(self.model, state.cluster, self.job)
        found = SearchState(SearchStats())
        objective = Objective()
        for i, plan in enumerate(plans):
            out = evaluate_one(cost, plan)
            if isinstance(out, Failed):
                continue
            gpus = sum(len(st.devices or ()) for r in plan.replicas for st in r.stages)
            found.results.append(Ranked(plan=plan, evaluation=out, gpus=gpus, key=f"{i:06d}",
                                        score=objective.score(out.tokens_per_s, gpus, 0.0),
                                        price_per_hour=0.0, bound=out.tokens_per_s))
        if not found.results:
            return None
        try_collectives(found, SearchSpace(), objective, 1,
                        lambda ps: [evaluate_one(cost, p) for p in ps])
        # ties keep the previous ranking's order (the key), as the search's ranking does
        return min(found.results, key=lambda r: (tuple(-x for x in r.score), r.key)).plan

    def _full(self, state: ClusterState) -> Ranking | None:
        """A full search of ``state``: its ``keep`` best plans, placed (None if none fits)."""
        assert state.cluster is not None
        self.full_searches += 1
        try:
            result = self.search(self.model, state.cluster, self.job, workers=self.workers, top=1)
        except Infeasible:
            return None
        # every plan it evaluated, best first: the runners-up the next state re-prices
        ranked = result.evaluated[:self.keep]
        # the mesh's placed plans: the devices every study sees
        plans = tuple(place(self.model, state.cluster, r.plan).plan for r in ranked)
        return Ranking(state=state, plans=plans)


PlannerKind = Literal["shape", "search"]
PLANNER_KINDS: tuple[PlannerKind, ...] = ("shape", "search")


def make_models(kind: str, model: ModelSpec, job: Job,
                planner: str = "shape") -> tuple[ThroughputModel, Planner]:
    """The throughput model named ``kind`` and the planner named ``planner``.

    ``shape`` is a ShapePlanner scoring plans with that throughput model; ``search`` is
    hetpar.search (scored by the simulator whatever ``kind`` is).
    """
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
    if planner == "shape":
        return cost, ShapePlanner(model, job, cost)
    if planner == "search":
        try:
            return cost, SearchPlanner(model, job)
        except ImportError as e:
            raise ConfigError(f"--planner search: the planner is not available ({e})") from None
    raise ConfigError(f"planner {planner!r} is not allowed; allowed: {', '.join(PLANNER_KINDS)}")
