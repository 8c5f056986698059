"""Replay a trace: training throughput over time under a re-planning policy."""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Callable

from hetpar import feasibility
from hetpar.dynamic.cost import ThroughputModel
from hetpar.dynamic.flapping import best_on_mix, mix_throughput, recent_mix
from hetpar.dynamic.planner import Planner
from hetpar.dynamic.policy import (
    POLICIES,
    AdaptiveConfig,
    DwellHistory,
    PolicyName,
    remaining_s,
    switch_price,
    worth_switching,
)
from hetpar.dynamic.results import ReplayResult, Segment, Switch
from hetpar.dynamic.state import ClusterState, Step, relocate, timeline
from hetpar.dynamic.switching import SwitchCost, SwitchSettings, switch_cost
from hetpar.dynamic.trace import Trace
from hetpar.errors import ConfigError, Infeasible
from hetpar.placement import place
from hetpar.specs.cluster import ClusterSpec
from hetpar.specs.job import Job
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import Plan
from hetpar.workers import Pool


class Replayer:
    """Replays one trace on one cluster for one model and job; ``run`` once per policy."""

    def __init__(self, model: ModelSpec, job: Job, cluster: ClusterSpec, trace: Trace,
                 cost: ThroughputModel, planner: Planner, *,
                 config: AdaptiveConfig | None = None,
                 progress: Callable[[str], None] | None = None) -> None:
        self.model, self.job, self.trace = model, job, trace
        self.cost, self.planner = cost, planner
        self.config = config or AdaptiveConfig()
        self.settings = SwitchSettings(restart_s=trace.restart_s,
                                       storage_bandwidth_gbyte_s=trace.storage_bandwidth_gbyte_s)
        self.progress = progress
        self.steps: list[Step] = timeline(cluster, trace)
        self._cold: dict[ClusterSpec | None, Plan | None] = {}
        self._warm: dict[tuple[ClusterSpec | None, int], tuple[Plan | None, Plan | None]] = {}

    def best_cold(self, state: ClusterState) -> Plan | None:
        """The planner's best plan for ``state`` from scratch (cached per state)."""
        if state.cluster not in self._cold:
            self._cold[state.cluster] = self.planner.best(state)
        return self._cold[state.cluster]

    def best_warm(self, state: ClusterState, warm: Plan | None) -> Plan | None:
        """The planner's best plan for ``state`` warm-started from ``warm`` (cached per equal
        state and warm plan, so a link flapping between two states is planned twice)."""
        key = (state.cluster, id(warm))
        hit = self._warm.get(key)
        if hit is not None and hit[0] is warm:
            return hit[1]
        best = self.planner.best(state, warm)
        if len(self._warm) > 10_000:
            self._warm.clear()
        self._warm[key] = (warm, best)
        return best

    def run(self, policy: PolicyName, start: Plan | None = None) -> ReplayResult:
        """Replay the trace under ``policy`` from ``start`` (default: the best plan at t=0)."""
        if policy not in POLICIES:
            raise ConfigError(
                f"replay: policy {policy!r} is not allowed; allowed: {', '.join(POLICIES)}")
        return _Run(self, policy, start).result()


def _replay(work: tuple[Replayer, Plan | None], policy: PolicyName) -> ReplayResult:
    return work[0].run(policy, work[1])


def replay_policies(replayer: Replayer, policies: list[PolicyName], start: Plan | None = None,
                    pool: Pool | None = None) -> list[ReplayResult]:
    """``replayer.run`` for each policy (independent replays), on ``pool`` one task per policy
    (default: in turn in this process); the results do not depend on the pool, except the
    wall times in ``decision_s``."""
    pool = pool or Pool()
    if pool.remote and replayer.progress is not None:
        replayer = copy.copy(replayer)
        replayer.progress = None  # a callback of this process; the workers run silent
    return pool.map(_replay, policies, (replayer, start))


class _Run:
    """The state of one replay: current plan, busy time, tokens, history."""

    def __init__(self, r: Replayer, policy: PolicyName, start: Plan | None) -> None:
        self.r, self.policy = r, policy
        s0 = r.steps[0].state
        t0 = time.perf_counter()
        if start is None:
            plan = r.best_cold(s0)
            if plan is None:
                raise Infeasible("plan", "no plan fits the cluster at t=0")
        else:
            assert s0.cluster is not None
            # the start plan meets simulate's verdict, whatever cost model replays it
            feasibility.check_costed(r.model, start, seq_len=r.job.seq_len or None)
            plan = place(r.model, s0.cluster, start).plan  # the mesh's placed plan
            if not plan.name:
                plan = dataclasses.replace(plan, name="start plan")
        self.decisions = [time.perf_counter() - t0]
        self.plan: Plan | None = plan
        self.plan_state = s0
        self.busy_until = 0.0
        self.tokens = 0.0
        self.segments: list[Segment] = []
        self.switches: list[Switch] = []
        self.history = DwellHistory()
        self.regret, self.regret_gain = 0.0, 0.0
        self.regret_t: float | None = None
        self.flap_since: float | None = None
        self.i = 0

    def result(self) -> ReplayResult:
        steps, horizon = self.r.steps, self.r.trace.horizon_s
        for i, step in enumerate(steps):
            self.i = i
            end = steps[i + 1].t_s if i + 1 < len(steps) else horizon
            for ev in step.events:
                self.history.record(ev)
            t = step.t_s
            again = self.decide(step, t)
            while again is not None and again < end:
                self.integrate(step.state, t, again)
                t = again
                again = self.decide(step, t)
            self.integrate(step.state, t, end)
            if self.r.progress and (i % 50 == 0 or i == len(steps) - 1):
                self.r.progress(f"{self.policy}: t={end:.0f}/{horizon:.0f} s, "
                                f"{len(self.switches)} switches")
        return ReplayResult(policy=self.policy, trace=self.r.trace.name, horizon_s=horizon,
                            tokens=self.tokens, segments=tuple(self.segments),
                            switches=tuple(self.switches), decision_s=tuple(self.decisions))

    def current(self, state: ClusterState) -> tuple[Plan | None, float]:
        """The current plan in ``state``'s names and its throughput (None, 0 if it cannot run)."""
        if self.plan is None:
            return None, 0.0
        try:
            plan = relocate(self.plan, self.plan_state, state)
        except Infeasible:
            return None, 0.0
        self.plan, self.plan_state = plan, state
        return plan, self.r.cost.tokens_per_s(plan, state)

    def integrate(self, state: ClusterState, a: float, b: float) -> None:
        plan, thr = self.current(state)
        training = max(0.0, b - max(a, self.busy_until))
        self.tokens += thr * training
        name = plan.name if plan is not None else "(none)"
        self.segments.append(
            Segment(t_s=a, end_s=b, plan=name, tokens_per_s=thr, training_s=training))

    def decide(self, step: Step, t: float) -> float | None:
        """Act at time ``t`` in ``step``; return when to look again (adaptive), or None."""
        t0 = time.perf_counter()
        try:
            return self._decide(step, t)
        finally:
            self.decisions.append(time.perf_counter() - t0)

    def _decide(self, step: Step, t: float) -> float | None:
        state = step.state
        cur, thr = self.current(state)
        if thr <= 0:
            warm = None if self.policy == "oracle" else self.plan
            best = self.r.best_cold(state) if warm is None else self.r.planner.best(state, warm)
            why = "current plan cannot run: " + _why_not(self, state)
            self.switch(state, t, best, why, forced=True, before=0.0)
            return None
        if self.policy == "static" or (self.policy == "oracle" and t != step.t_s):
            return None
        if self.policy == "oracle":
            best = self.r.best_cold(state)
            if best is not None and self.r.cost.tokens_per_s(best, state) > thr * (1 + 1e-9):
                self.switch(state, t, best, "oracle: a better plan exists", forced=False,
                            before=thr)
            return None
        return self._adaptive(step, t, cur, thr)

    def _adaptive(self, step: Step, t: float, cur: Plan | None, thr: float) -> float | None:
        cfg, state = self.r.config, step.state
        # Regret: tokens lost so far by staying, at the gain seen at the previous decision
        # (the state, hence the gain, is constant between decisions).
        if self.regret_t is not None:
            self.regret += self.regret_gain * (t - self.regret_t)
        best = self.r.best_warm(state, cur)
        gain = self.r.cost.tokens_per_s(best, state) - thr if best is not None else 0.0
        if gain <= cfg.min_gain * thr:
            self.regret, self.regret_gain, self.regret_t = 0.0, 0.0, None
            return None
        self.regret_gain, self.regret_t = gain, t
        if t - step.t_s < cfg.settle_s:
            if cur is not None:
                self._flapping(step, t, cur)
            return step.t_s + cfg.settle_s
        assert cur is not None and best is not None
        c = switch_cost(cur, state, best, state, self.r.model, self.r.job, self.r.settings)
        left = self.r.trace.horizon_s - t
        dwell = self.history.expected_dwell(step.events, cfg.prior_dwell_s)
        remaining = min(remaining_s(dwell, t - step.t_s), left)
        # If the condition is expected to end before the job, switching now means switching
        # back then, at the rate the current plan had before the condition began.
        back = self._rate_before(step, cur) if remaining < left else 0.0
        price = switch_price(cfg, c.total_s, thr, back)
        what = ", ".join(e.target for e in step.events) or "start"
        if worth_switching(gain, c.total_s, remaining, price):
            why = (f"gain {gain / thr:+.1%} expected for {remaining:.0f} s ({what}) "
                   f"pays for a {c.total_s:.0f} s switch{' and one back' if back else ''}")
        elif self.regret >= price and left > c.total_s:
            why = (f"gain {gain / thr:+.1%}: tokens lost by staying ({self.regret:.3g}) reached "
                   f"the price of a {c.total_s:.0f} s switch (rent-or-buy)")
        else:
            wake = t + (price - self.regret) / gain * 1.001 + 1e-6
            return wake if wake < self.r.trace.horizon_s else None
        self.switch(state, t, best, why, forced=False, before=thr, cost=c)
        return None

    def _rate_before(self, step: Step, cur: Plan) -> float:
        """Tokens/s of ``cur`` in the state before ``step`` (0 if it could not run there)."""
        if self.i == 0:
            return 0.0
        before = self.r.steps[self.i - 1].state
        try:
            return self.r.cost.tokens_per_s(relocate(cur, step.state, before), before)
        except Infeasible:
            return 0.0

    def _flapping(self, step: Step, t: float, cur: Plan) -> None:
        """During flapping, switch once to the plan best on the mix of recent states."""
        cfg, state = self.r.config, step.state
        mix = recent_mix(self.r.steps, self.i, t, cfg.flap_window_s, cfg.flap_changes)
        if mix is None:
            self.flap_since = None
            return
        if self.flap_since is None:
            steps, j = self.r.steps, self.i
            while j > 0 and steps[j - 1].t_s >= t - cfg.flap_window_s:
                j -= 1
            self.flap_since = steps[j].t_s  # the first change of this episode we saw
        now = mix_throughput(cur, state, mix, self.r.cost)
        best, home, value = best_on_mix(cur, state, mix, self.r.cost, self.r.best_cold)
        if best is cur or value <= (1 + cfg.min_gain) * now:
            return
        try:
            best = relocate(best, home, state)
        except Infeasible:
            return
        c = switch_cost(cur, state, best, state, self.r.model, self.r.job, self.r.settings)
        age = t - self.flap_since  # an episode that lasted this long is expected to go on
        # The switch must pay for itself and for the switch back once the flapping ends.
        if (value - now) * (age - c.total_s) > 2 * (1 + cfg.hysteresis) * now * c.total_s:
            why = (f"flapping for {age:.0f} s: mean {value / now - 1:+.1%} over the states "
                   f"it alternates between pays for this switch and one back")
            self.switch(state, t, best, why, forced=False, before=self.r.cost.tokens_per_s(
                cur, state), cost=c)

    def switch(self, state: ClusterState, t: float, new: Plan | None, reason: str, *,
               forced: bool, before: float, cost: SwitchCost | None = None) -> None:
        old, old_state = self.plan, self.plan_state
        if new is None:
            self.plan = None
            return
        if self.policy != "oracle" and old is not None and cost is None:
            cost = switch_cost(old, old_state, new, state, self.r.model, self.r.job,
                               self.r.settings)
        if self.policy == "oracle":
            cost = None
        if cost is not None:
            self.busy_until = max(self.busy_until, t) + cost.total_s
        self.regret, self.regret_gain, self.regret_t = 0.0, 0.0, None
        self.plan, self.plan_state = new, state
        self.switches.append(Switch(
            t_s=t, from_plan=old.name if old else "(none)", to_plan=new.name, reason=reason,
            forced=forced, cost=cost, tokens_per_s_before=before,
            tokens_per_s_after=self.r.cost.tokens_per_s(new, state)))


def _why_not(run: _Run, state: ClusterState) -> str:
    if run.plan is None:
        return "no plan"
    try:
        relocate(run.plan, run.plan_state, state)
    except Infeasible as e:
        return str(e)
    return "it does not fit (memory or partitioned network)"
