"""Named pruning rules and the search statistics that count what each removed."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from hetpar import schedules
from hetpar.search.candidates import Knobs
from hetpar.search.structures import Structure, tp_fits
from hetpar.specs.cluster import ClusterSpec
from hetpar.specs.model import ModelSpec

RULES = ("tier_capacity", "divisibility", "unsupported", "budget", "memory", "throughput_bound")
"""Pruning rules in the order they apply; ``unsupported``: the cost model rejects a stage
outright (e.g. a precision the GPU lacks)."""


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

    @property
    def plans_per_s(self) -> float:
        return self.simulated / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def to_dict(self) -> dict[str, object]:
        """Plain-data form for --json."""
        return {
            "candidates": self.candidates,
            "removed": {r: self.removed.get(r, 0) for r in RULES},
            "simulated": self.simulated,
            "infeasible": dict(sorted(self.infeasible.items())),
            "elapsed_s": round(self.elapsed_s, 3),
            "plans_per_s": round(self.plans_per_s, 1),
            "polish_evaluations": self.polish_evaluations,
            "bound_violations": self.bound_violations,
        }

    def summary(self) -> str:
        """Two human-readable lines."""
        rem = ", ".join(f"{r} {self.removed.get(r, 0)}" for r in RULES)
        inf = ", ".join(f"{k} {v}" for k, v in sorted(self.infeasible.items())) or "none"
        return (
            f"{self.candidates} candidates; removed: {rem}\n"
            f"{self.simulated} evaluated ({self.polish_evaluations} polishing; {inf} infeasible)"
            f" in {self.elapsed_s:.2f} s, "
            f"{self.plans_per_s:.0f} plans/s"
        )


def tier_capacity(s: Structure, cluster: ClusterSpec) -> str | None:
    """TP must fit inside one scale-up domain of its node group."""
    for c in s.classes:
        for slot in c.ranks:
            dom = cluster.group(slot.group).domain_size
            if not tp_fits(slot.tp, dom):
                return (
                    f"tp={slot.tp} does not fit the {dom}-GPU scale-up domain "
                    f"of group {slot.group!r}"
                )
    return None


def head_divisibility(s: Structure, model: ModelSpec) -> str | None:
    """Attention heads and KV heads must split evenly over TP (KV heads may be replicated)."""
    for c in s.classes:
        for slot in c.ranks:
            t = slot.tp
            if model.n_heads % t:
                return f"n_heads ({model.n_heads}) not divisible by tp ({t})"
            if model.n_kv_heads % t and t % model.n_kv_heads:
                return f"n_kv_heads ({model.n_kv_heads}) and tp ({t}) do not divide one another"
    return None


def knob_divisibility(
    s: Structure, k: Knobs, model: ModelSpec, batch: int, seq_len: int, unit: int
) -> str | None:
    """Layers over pp*vpp chunks, batch over micro-batches and replicas, sequence over cp."""
    pp = max(c.pp for c in s.classes)
    if model.n_layers < pp * k.vpp:
        return f"{model.n_layers} layers < pp*vpp = {pp}*{k.vpp} chunks"
    need = schedules.traits(k.schedule).min_pp
    if min(c.pp for c in s.classes) < need:
        return f"{k.schedule} schedule needs pp >= {need}"
    if batch % k.micro_batch:
        return f"global batch ({batch}) not divisible by micro_batch ({k.micro_batch})"
    units = batch // k.micro_batch
    if units % unit or units // unit < s.replicas:
        return (
            f"global batch ({batch}) / micro_batch ({k.micro_batch}) = {units} micro-batches "
            f"cannot give each of {s.replicas} replicas a multiple of {unit}"
        )
    if s.uniform is not None and (units % s.uniform[2] or units // s.uniform[2] % unit):
        return f"{units} micro-batches not divisible by dp ({s.uniform[2]}) x {unit}"
    if seq_len % (2 * k.cp) and k.cp > 1:
        return f"seq_len ({seq_len}) not divisible by 2*cp ({2 * k.cp}) (load-balanced CP)"
    return None
