"""A failed GPU in an expert-parallel plan: re-place the experts over the surviving replicas, or
drop the replicas of its expert-parallel group; both priced by the simulator.

Expert parallelism is carved from the data-parallel ranks (dp x cp, x tp when etp = 1;
``feasibility.expert_split``, torchtitan's ``parallel_dims.py``), so an EP group spans
several replicas and the NTP study's unit, one replica priced alone (``failures/simcost.py``),
cannot hold it. A failed GPU stops its replica's dense layers either way; the two policies
differ in what the experts do:

- ``re-place experts``: the other replicas keep running and the experts are laid out anew over
  their ranks: ep shrinks to the largest degree <= ep that divides n_experts and the ranks it
  is carved from (the placed mesh's expert view, ``sim/ep_groups.py::expert_mesh``), so each
  GPU holds more experts, split by the plan's rule (``_split_at``). Memory is re-checked by
  the one feasibility check (``feasibility.memory`` on the simulator's fullest rank).
- ``drop EP group``: ep is kept, so the replicas left must still form whole EP groups. A
  uniform plan keeps the largest dp' < dp whose ranks ep divides (0 when one EP group spans
  every replica); an explicit plan drops every replica that shares an EP group with the
  failed one.

Each keeps the per-replica batch (the global batch shrinks with the replicas, as the NTP
study's ``drop``) and is priced by ``hetpar.sim.simulate``; throughput is tokens per second
relative to the healthy plan's. Replicas of a uniform plan are alike, so one study stands for
any failed GPU; an explicit plan is studied once per distinct replica (``failed_replicas``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from hetpar import feasibility
from hetpar.errors import ConfigError, Infeasible
from hetpar.sim import simulate
from hetpar.sim.ep_groups import expert_mesh
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
    split: tuple[int, ...] | None = None
    """Experts per EP rank where the simulator priced an uneven split (None: even)."""


@dataclass(frozen=True, kw_only=True)
class ExpertFailure:
    """The healthy plan and every policy for one failed GPU."""

    healthy: Plan
    iteration_s: float
    options: tuple[Option, ...]
    failed_replica: int | None = None
    """The replica holding the failed GPU (None: a uniform plan, whose replicas are alike)."""

    @property
    def chosen(self) -> Option:
        """The policy with the highest throughput (the first on a tie)."""
        return max(self.options, key=lambda o: o.throughput)


def split_at(plan: Plan, ep: int) -> str | tuple[int, ...]:
    """``plan``'s expert split at degree ``ep`` by its own rule: ``even`` and ``by_speed``
    kept (the simulator derives by_speed over the survivors' GPUs), counts re-derived. New
    coordinate j of a smaller EP group takes over the old coordinates j, j + ep, j + 2 ep, ...
    (EP groups are runs of consecutive ranks, ``placement/experts.py``) and holds the experts
    they held: the sum of their counts (all equal: the even split). Where ep grows (never
    here) or is 1, ``Plan.split_at``."""
    split = plan.experts_per_rank
    if isinstance(split, str) or len(split) <= ep:
        return plan.split_at(ep)
    counts = [sum(split[j::ep]) for j in range(ep)]
    return "even" if len(set(counts)) == 1 else tuple(counts)


def _room(plan: Plan, dp: int) -> int:
    """The ranks ep is carved from with ``dp`` replicas: dp x cp (x tp when etp = 1)."""
    return dp * plan.cp * (plan.tp if plan.degree("etp") == 1 else 1)


def _with_ep(plan: Plan, ep: int, **changes: Any) -> Plan:
    axes = tuple((a, d) for a, d in plan.axes if a != "ep") + (("ep", ep),)
    return replace(plan, axes=axes, experts_per_rank=split_at(plan, ep), **changes)


def _with(plan: Plan, dp: int, ep: int) -> Plan:
    """A uniform plan at ``dp`` replicas (each keeping its batch) and expert degree ``ep``."""
    return _with_ep(plan, ep, dp=dp, global_batch=plan.batch // plan.dp * dp)


def _survivors(plan: Plan, kept: list[int]) -> Plan:
    """An explicit plan of the replicas ``kept`` (global batch their sum)."""
    return replace(plan, replicas=tuple(plan.replicas[i] for i in kept), global_batch=None)


def _fits(model: ModelSpec, cluster: ClusterSpec, plan: Plan) -> bool:
    """Whether ``plan``'s ep divides the ranks of its placed mesh (``expert_mesh``)."""
    try:
        expert_mesh(model, cluster, plan)
    except Infeasible:
        return False
    return True


def replace_experts(model: ModelSpec, plan: Plan, cluster: ClusterSpec | None = None,
                    failed: int = 0) -> Plan | str:
    """The re-placed plan, or why there is none (``cluster``: explicit plans, whose EP
    groups are read from the placed mesh; ``failed``: the replica lost)."""
    ep0 = plan.degree("ep")
    degrees = [d for d in range(ep0, 0, -1) if model.n_experts % d == 0]
    if plan.uniform:
        dp = plan.dp - 1
        if dp < 1:
            return "no replica survives"
        return _with(plan, dp, next(d for d in degrees if _room(plan, dp) % d == 0))
    kept = [i for i in range(len(plan.replicas)) if i != failed]
    if not kept:
        return "no replica survives"
    assert cluster is not None, "an explicit plan's EP groups need its cluster"
    base = _survivors(plan, kept)
    return next(p for d in degrees if _fits(model, cluster, p := _with_ep(base, d)))


def drop_group(plan: Plan, model: ModelSpec | None = None, cluster: ClusterSpec | None = None,
               failed: int = 0) -> Plan | str:
    """The plan without the failed GPU's EP group(s), or why there is none."""
    ep = plan.degree("ep")
    if plan.uniform:
        dp = next((d for d in range(plan.dp - 1, 0, -1) if _room(plan, d) % ep == 0), 0)
        if dp == 0:
            return f"one EP group (ep={ep}) spans all {plan.dp} replicas"
        return _with(plan, dp, ep)
    assert model is not None and cluster is not None, "an explicit plan's EP groups"
    mesh = expert_mesh(model, cluster, plan)
    groups = [{mesh.ranks[r].replica for r in g} for g in mesh.groups("ep")]
    lost = set().union(*(g for g in groups if failed in g))
    kept = [i for i in range(len(plan.replicas)) if i not in lost]
    if not kept:
        return (f"the EP groups (ep={ep}) of replica {failed} span all "
                f"{len(plan.replicas)} replicas")
    return _survivors(plan, kept)


def failed_replicas(plan: Plan) -> tuple[int | None, ...]:
    """Where a failed GPU is studied: anywhere in a uniform plan (None), else the first replica
    of each distinct shape (its stages' layers, node group, tp, cp and its batch)."""
    if plan.uniform:
        return (None,)
    seen: dict[object, int] = {}
    for i, r in enumerate(plan.replicas):
        key = (tuple((s.layers, s.group, s.tp, s.cp) for s in r.stages), r.batch, r.micro_batch)
        seen.setdefault(key, i)
    return tuple(seen.values())


def _price(model: ModelSpec, cluster: ClusterSpec,
           plan: Plan) -> tuple[float, str, tuple[int, ...] | None]:
    """(iteration seconds, '', uneven split) or (inf, why it cannot run, None): the one
    feasibility check, the simulator, and the memory verdict on its fullest rank."""
    try:
        feasibility.check_costed(model, plan)
        r = simulate(model, cluster, plan)
    except Infeasible as e:
        return float("inf"), e.reason, None
    worst = max(r.memory, key=lambda m: m.total / m.capacity)
    fit = feasibility.memory(worst.total, worst.capacity,
                             f"replica {worst.replica} pipeline rank {worst.rank}")
    split = (r.experts or {}).get("experts_per_rank")
    return ((r.iteration_time_s, "", tuple(split) if split else None) if fit.ok else
            (float("inf"), fit.reason, None))


def study(model: ModelSpec, cluster: ClusterSpec, plan: Plan,
          failed: int | None = None) -> ExpertFailure:
    """Both policies for one failed GPU of ``plan`` (ep > 1), in replica ``failed`` of an
    explicit plan (default: the first; None for a uniform plan)."""
    if plan.degree("ep") == 1:
        raise ConfigError("plan: the expert-parallel failure study needs ep > 1; got ep=1")
    if not plan.uniform:
        failed = failed or 0
        if not 0 <= failed < len(plan.replicas):
            raise ConfigError(f"failed replica {failed}: the plan has "
                              f"{len(plan.replicas)} replicas")
    t0, why, _ = _price(model, cluster, plan)
    if why:
        raise Infeasible("plan", f"the healthy plan cannot run: {why}")
    rate0 = plan.batch / t0
    at = 0 if failed is None else failed
    built = (replace_experts(model, plan, cluster, at), drop_group(plan, model, cluster, at))
    options = []
    for policy, degraded in zip(POLICIES, built, strict=True):
        if isinstance(degraded, str):
            options.append(Option(policy=policy, plan=None, throughput=0.0,
                                  iteration_s=float("inf"), reason=degraded))
            continue
        t, why, split = _price(model, cluster, degraded)
        options.append(Option(policy=policy, plan=degraded, iteration_s=t, reason=why,
                              split=split,
                              throughput=0.0 if why else degraded.batch / t / rate0))
    return ExpertFailure(healthy=plan, iteration_s=t0, options=tuple(options),
                         failed_replica=failed)


def replicas(plan: Plan) -> int:
    """Data-parallel replicas: dp of a uniform plan, the listed replicas of an explicit one."""
    return plan.dp if plan.uniform else len(plan.replicas)


def to_dict(r: ExpertFailure) -> dict[str, object]:
    """The study as JSON-ready data (``hetpar failures --json``)."""
    def one(o: Option) -> dict[str, object]:
        return {"policy": o.policy, "throughput": o.throughput,
                "iteration_s": o.iteration_s if o.plan and not o.reason else None,
                "dp": replicas(o.plan) if o.plan else None,
                "ep": o.plan.degree("ep") if o.plan else None,
                "experts_per_rank": list(o.split) if o.split else None,
                "global_batch": o.plan.batch if o.plan else None, "reason": o.reason}
    return {"ep": r.healthy.degree("ep"), "dp": replicas(r.healthy),
            "failed_replica": r.failed_replica, "iteration_s": r.iteration_s,
            "options": [one(o) for o in r.options], "chosen": r.chosen.policy}


def _where(r: ExpertFailure) -> str:
    if r.failed_replica is None:
        return ""
    groups = dict.fromkeys(s.group for s in r.healthy.replicas[r.failed_replica].stages)
    return f" of replica {r.failed_replica} ({', '.join(groups)})"


def text(r: ExpertFailure, model: ModelSpec) -> list[str]:
    """The study as lines for the terminal."""
    ep = r.healthy.degree("ep")
    lines = [f"one failed GPU{_where(r)} in an expert-parallel group (ep={ep}, "
             f"{model.n_experts} experts, dp={replicas(r.healthy)}; healthy iteration "
             f"{r.iteration_s:.3f} s):"]
    for o in r.options:
        shape = "" if o.plan is None else f"dp={replicas(o.plan)}, ep={o.plan.degree('ep')}"
        if o.plan is None or o.reason:
            lines.append(f"  {o.policy:>16}: {shape + ': ' if shape else ''}cannot run "
                         f"({o.reason})")
            continue
        per = (f"experts per EP rank: {'/'.join(map(str, o.split))}" if o.split else
               f"experts per GPU: {model.n_experts // o.plan.degree('ep')}")
        lines.append(f"  {o.policy:>16}: {shape} ({per}), gbs={o.plan.batch}, iteration "
                     f"{o.iteration_s:.3f} s, throughput {o.throughput:.4f}")
    chosen = r.chosen
    lines.append(f"  chosen: {chosen.policy}" if chosen.throughput > 0 else
                 "  chosen: none runs (checkpoint-restart on repaired GPUs)")
    return lines
