"""Named pruning rules and the search statistics that count what each removed."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from hetpar import feasibility, schedules
from hetpar.feasibility import Verdict
from hetpar.search.candidates import Knobs
from hetpar.search.structures import Structure
from hetpar.specs.cluster import ClusterSpec
from hetpar.specs.model import ModelSpec

RULES = ("wrap_limit", "dominated", "zero_scope", "tier_capacity", "divisibility", "unsupported",
         "budget", "memory", "throughput_bound", "collectives_bound")
"""Pruning rules in the order they apply; ``wrap_limit``: wrapped pipelines beyond the two
splits generated of the wrapping group; ``dominated``: a ZeRO stage the cost model says is
never faster than another of the space that needs no more memory; ``zero_scope``: ZeRO
scope ``group`` on a structure none of whose data-parallel groups spans two node groups (the
same plan as scope ``all``, also in the space); ``unsupported``: the
cost model rejects a stage outright (e.g. a precision the GPU lacks); ``collectives_bound``: a
forced NCCL algorithm / protocol / DP sync on a top plan whose exposed network time (and
bubble) is too small for any choice to beat the top-K-th plan (``search/collsearch.py``)."""


@dataclass
class SearchStats:
    """What the search did: candidates, removals per rule, evaluations, failures, speed."""

    candidates: int = 0
    removed: Counter[str] = field(default_factory=Counter)
    simulated: int = 0
    infeasible: Counter[str] = field(default_factory=Counter)
    elapsed_s: float = 0.0
    polish_evaluations: int = 0
    """Evaluations spent hill-climbing the top plans (included in ``simulated``)."""
    bound_violations: int = 0
    """Evaluated plans that beat their own upper bound (the bound was not one)."""
    collective_evaluations: int = 0
    """Evaluations of the top plans with forced collectives (included in ``simulated``)."""
    expert_split_evaluations: int = 0
    """Evaluations of the top EP plans with more experts on faster GPUs (included in
    ``simulated``; ``search/expert_speed.py``, tried on clusters of several GPU types)."""
    widened: int = 0
    """Candidates added beyond the space: the top plans with other vpp values."""
    widened_vpp: set[int] = field(default_factory=set)
    predicates: Counter[str] = field(default_factory=Counter)
    """Of ``removed``'s tier_capacity and divisibility: candidates by the feasibility
    predicate that removed them (``hetpar.feasibility``; ``batch_split`` is the planner's)."""

    @property
    def plans_per_s(self) -> float:
        return self.simulated / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def to_dict(self) -> dict[str, object]:
        """Plain-data form for --json."""
        return {
            "candidates": self.candidates,
            "removed": {r: self.removed.get(r, 0) for r in RULES},
            "removed_by_predicate": dict(sorted(self.predicates.items())),
            "simulated": self.simulated,
            "infeasible": dict(sorted(self.infeasible.items())),
            "elapsed_s": round(self.elapsed_s, 3),
            "plans_per_s": round(self.plans_per_s, 1),
            "polish_evaluations": self.polish_evaluations,
            "collective_evaluations": self.collective_evaluations,
            "bound_violations": self.bound_violations,
            "widened": self.widened,
            "widened_vpp": sorted(self.widened_vpp),
        } | (self._expert_split() if self._tried_experts else {})

    @property
    def _tried_experts(self) -> bool:
        return bool(self.expert_split_evaluations or self.removed.get("expert_split_even"))

    def _expert_split(self) -> dict[str, object]:
        """The expert split's counts (``search/expert_speed.py``), shown where it was tried:
        a search of one GPU type prints and returns what it did before the option existed."""
        return {"expert_split_evaluations": self.expert_split_evaluations,
                "expert_split_even": self.removed.get("expert_split_even", 0)}

    def summary(self) -> str:
        """Three human-readable lines."""
        rem = ", ".join(f"{r} {self.removed.get(r, 0)}" for r in RULES)
        inf = ", ".join(f"{k} {v}" for k, v in sorted(self.infeasible.items())) or "none"
        pred = ", ".join(f"{k} {v}" for k, v in sorted(self.predicates.items())) or "none"
        return (
            f"{self.candidates} candidates; removed: {rem}\n"
            f"feasibility predicates: {pred}\n"
            f"{self.simulated} evaluated ({self.polish_evaluations} polishing, "
            f"{self.collective_evaluations} forced collectives; {inf} infeasible)"
            f" in {self.elapsed_s:.2f} s, "
            f"{self.plans_per_s:.0f} plans/s"
        ) + (
            f"\nvpp widened beyond the space to {_ranges(sorted(self.widened_vpp))} on the top "
            f"plans' structures: {self.widened} candidates (in the counts above)"
            if self.widened else ""
        ) + (
            f"\nexperts by speed: {self.expert_split_evaluations} of the top EP plans evaluated "
            f"with more experts on faster GPUs, {self.removed.get('expert_split_even', 0)} "
            "removed (expert_split_even: their EP groups on one GPU speed; in the counts above)"
            if self._tried_experts else ""
        )


def _ranges(vals: list[int]) -> str:
    """[3, 4, 5, 7] -> '3-5, 7'."""
    out: list[str] = []
    for v in vals:
        if out and v == int(out[-1].split("-")[-1]) + 1:
            out[-1] = out[-1].split("-")[0] + f"-{v}"
        else:
            out.append(str(v))
    return ", ".join(out)


def tier_capacity(s: Structure, cluster: ClusterSpec) -> Verdict | None:
    """TP must fit inside one scale-up domain of its node group (planner restriction)."""
    for c in s.classes:
        for slot in c.ranks:
            v = feasibility.scale_up_domain(slot.tp, cluster.group(slot.group).domain_size,
                                            slot.group)
            if not v.ok:
                return v
    return None


def head_divisibility(s: Structure, model: ModelSpec) -> Verdict | None:
    """Heads, KV heads and MLP columns split evenly over every slot's TP (``tp_shards``)."""
    for tp in sorted({slot.tp for c in s.classes for slot in c.ranks}):
        v = feasibility.tp_shards(model, tp)
        if not v.ok:
            return v
    return None


def knob_divisibility(
    s: Structure, k: Knobs, model: ModelSpec, batch: int, seq_len: int, unit: int
) -> Verdict | None:
    """Layers over pp*vpp chunks, the schedule's limits, batch over micro-batches and
    replicas (``batch_split``, the planner's own), sequence over cp, and the predicate of
    every plan-scope axis (``feasibility.axis_verdicts``)."""
    pp = max(c.pp for c in s.classes)
    v = feasibility.layers_per_chunk(model, pp, k.vpp)
    if not v.ok:
        return v
    tr = schedules.traits(k.schedule)
    for c in s.classes:  # the share unit makes every class's micro-batch count a multiple
        v = feasibility.schedule_fit(k.schedule, c.pp, k.vpp, tr.microbatch_unit(c.pp))
        if not v.ok:
            return v
    why = _batch_split(s, k, batch, unit)
    if why:
        return Verdict(name="batch_split", ok=False, reason=why)
    v = feasibility.context_split(seq_len, k.cp, model)
    if not v.ok:
        return v
    if k.axes:  # the plan-scope axes (bundled: ep, etp)
        degrees = {"tp": max(sl.tp for c in s.classes for sl in c.ranks), "cp": k.cp,
                   "dp": s.replicas, "pp": pp, **dict(k.axes)}
        for v in feasibility.axis_verdicts(model, degrees):
            if not v.ok:
                return v
    return None


def _batch_split(s: Structure, k: Knobs, batch: int, unit: int) -> str | None:
    if batch % k.micro_batch:
        return f"global batch ({batch}) not divisible by micro_batch ({k.micro_batch})"
    units = batch // k.micro_batch
    if units % unit or units // unit < s.replicas:
        return (
            f"global batch ({batch}) / micro_batch ({k.micro_batch}) = {units} micro-batches "
            f"cannot give each of {s.replicas} replicas a multiple of {unit}"
        )
    return None
