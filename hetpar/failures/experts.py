"""A failed GPU in an expert-parallel plan: re-place the experts over the surviving replicas, or
drop the replicas of its expert-parallel group; both priced by the simulator.

Expert parallelism is carved from the data-parallel ranks (dp x cp, x tp when etp = 1;
``feasibility.expert_split``, torchtitan's ``parallel_dims.py``), so an EP group spans
several replicas and the NTP study's unit, one replica priced alone (``failures/simcost.py``),
cannot hold it. A failed GPU stops its replica's dense layers either way; the two policies
differ in what the experts do:

- ``re-place experts``: the other dp - 1 replicas keep running and the experts are laid out
  anew over their ranks: ep shrinks to the largest degree <= ep that divides both n_experts and
  the ranks it is carved from, so each GPU holds n_experts / ep' experts. Memory is re-checked
  by the one feasibility check (``feasibility.memory`` on the simulator's fullest rank).
- ``drop EP group``: ep is kept, so the replicas left must still form whole EP groups: the
  largest dp' < dp whose ranks ep divides (0 when one EP group spans every replica).

Each keeps the per-replica batch (the global batch shrinks with the replicas, as the NTP
study's ``drop``) and is priced by ``hetpar.sim.simulate``; throughput is tokens per second
relative to the healthy plan's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hetpar import feasibility
from hetpar.errors import ConfigError, Infeasible
from hetpar.sim import simulate
from hetpar.specs.cluster import ClusterSpec
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import Plan

POLICIES = ("re-place experts", "drop EP group")


@dataclass(frozen=True, kw_only=True)
class Option:
    """One policy's degraded plan and its throughput relative to the healthy plan."""

    policy: str
    plan: Plan | None
    """The degraded plan (None: no plan of this policy exists)."""
    throughput: float
    """Tokens per second over the healthy plan's; 0 when it cannot run."""
    iteration_s: float
    reason: str = ""
    """Why it cannot run ('' when it runs)."""


@dataclass(frozen=True, kw_only=True)
class ExpertFailure:
    """The healthy plan and every policy for one failed GPU."""

    healthy: Plan
    iteration_s: float
    options: tuple[Option, ...]

    @property
    def chosen(self) -> Option:
        """The policy with the highest throughput (the first on a tie)."""
        return max(self.options, key=lambda o: o.throughput)


def _room(plan: Plan, dp: int) -> int:
    """The ranks ep is carved from with ``dp`` replicas: dp x cp (x tp when etp = 1)."""
    return dp * plan.cp * (plan.tp if plan.degree("etp") == 1 else 1)


def _with(plan: Plan, dp: int, ep: int) -> Plan:
    per = plan.batch // plan.dp
    axes = tuple((a, d) for a, d in plan.axes if a != "ep") + (("ep", ep),)
    return replace(plan, dp=dp, global_batch=per * dp, axes=axes,
                   experts_per_rank=plan.split_at(ep))


def replace_experts(model: ModelSpec, plan: Plan) -> Plan | str:
    """The re-placed plan, or why there is none."""
    dp = plan.dp - 1
    if dp < 1:
        return "no replica survives"
    room = _room(plan, dp)
    ep = max(d for d in range(1, plan.degree("ep") + 1)
             if model.n_experts % d == 0 and room % d == 0)
    return _with(plan, dp, ep)


def drop_group(plan: Plan) -> Plan | str:
    """The plan without the failed GPU's EP group(s), or why there is none."""
    ep = plan.degree("ep")
    dp = next((d for d in range(plan.dp - 1, 0, -1) if _room(plan, d) % ep == 0), 0)
    if dp == 0:
        return f"one EP group (ep={ep}) spans all {plan.dp} replicas"
    return _with(plan, dp, ep)


def _price(model: ModelSpec, cluster: ClusterSpec, plan: Plan) -> tuple[float, str]:
    """(iteration seconds, '') or (inf, why it cannot run): the one feasibility check, the
    simulator, and the memory verdict on its fullest rank."""
    try:
        feasibility.check_costed(model, plan)
        r = simulate(model, cluster, plan)
    except Infeasible as e:
        return float("inf"), e.reason
    worst = max(r.memory, key=lambda m: m.total / m.capacity)
    fit = feasibility.memory(worst.total, worst.capacity,
                             f"replica {worst.replica} pipeline rank {worst.rank}")
    return (r.iteration_time_s, "") if fit.ok else (float("inf"), fit.reason)


def study(model: ModelSpec, cluster: ClusterSpec, plan: Plan) -> ExpertFailure:
    """Both policies for one failed GPU of ``plan`` (uniform, ep > 1)."""
    if not plan.uniform or plan.degree("ep") == 1:
        raise ConfigError("plan: the expert-parallel failure study needs a uniform plan with "
                          f"ep > 1; got ep={plan.degree('ep')}")
    t0, why = _price(model, cluster, plan)
    if why:
        raise Infeasible("plan", f"the healthy plan cannot run: {why}")
    rate0 = plan.batch / t0
    options = []
    for policy, built in zip(POLICIES, (replace_experts(model, plan), drop_group(plan)),
                             strict=True):
        if isinstance(built, str):
            options.append(Option(policy=policy, plan=None, throughput=0.0,
                                  iteration_s=float("inf"), reason=built))
            continue
        t, why = _price(model, cluster, built)
        options.append(Option(policy=policy, plan=built, iteration_s=t, reason=why,
                              throughput=0.0 if why else built.batch / t / rate0))
    return ExpertFailure(healthy=plan, iteration_s=t0, options=tuple(options))


def to_dict(r: ExpertFailure) -> dict[str, object]:
    """The study as JSON-ready data (``hetpar failures --json``)."""
    def one(o: Option) -> dict[str, object]:
        return {"policy": o.policy, "throughput": o.throughput,
                "iteration_s": o.iteration_s if o.plan and not o.reason else None,
                "dp": o.plan.dp if o.plan else None,
                "ep": o.plan.degree("ep") if o.plan else None,
                "global_batch": o.plan.batch if o.plan else None, "reason": o.reason}
    return {"ep": r.healthy.degree("ep"), "dp": r.healthy.dp, "iteration_s": r.iteration_s,
            "options": [one(o) for o in r.options], "chosen": r.chosen.policy}


def text(r: ExpertFailure, model: ModelSpec) -> list[str]:
    """The study as lines for the terminal."""
    ep = r.healthy.degree("ep")
    lines = [f"one failed GPU in an expert-parallel group (ep={ep}, {model.n_experts} experts, "
             f"dp={r.healthy.dp}; healthy iteration {r.iteration_s:.3f} s):"]
    for o in r.options:
        if o.plan is None or o.reason:
            shape = "" if o.plan is None else f"dp={o.plan.dp}, ep={o.plan.degree('ep')}: "
            lines.append(f"  {o.policy:>16}: {shape}cannot run ({o.reason})")
            continue
        per = model.n_experts // o.plan.degree("ep")
        lines.append(f"  {o.policy:>16}: dp={o.plan.dp}, ep={o.plan.degree('ep')} (experts "
                     f"per GPU: {per}), gbs={o.plan.batch}, iteration {o.iteration_s:.3f} s, "
                     f"throughput {o.throughput:.4f}")
    chosen = r.chosen
    lines.append(f"  chosen: {chosen.policy}" if chosen.throughput > 0 else
                 "  chosen: none runs (checkpoint-restart on repaired GPUs)")
    return lines
