"""A candidate = structure + knobs; its cheap costing (memory check, DP split, bounds)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from hetpar import schedules
from hetpar.search.space import SearchSpace
from hetpar.search.split import Split
from hetpar.search.structures import ReplicaClass, Structure
from hetpar.specs.collectives import Collectives
from hetpar.specs.plan import Plan, Recompute, ZeroScope


class Knobs(NamedTuple):
    """Plan-wide settings applied on top of a structure (a tuple: part of hot cache keys)."""

    cp: int = 1
    sequence_parallel: bool = False
    vpp: int = 1
    micro_batch: int = 1
    schedule: str = schedules.DEFAULT
    recompute: Recompute = "none"
    zero: int = 1
    zero_scope: ZeroScope = "all"
    axes: tuple[tuple[str, int], ...] = ()
    """(name, degree) of every ``plan``-scope axis of ``specs/axes.py`` (bundled: ep, etp)."""
    collectives: Collectives | None = None
    """What the plan forces on its collectives (``Plan.collectives``; None: all auto), set
    by the planner's collectives pass (``search/collsearch.py``)."""

    def key(self) -> str:
        sp = "sp" if self.sequence_parallel else "nosp"
        scope = "g" if self.zero_scope == "group" else ""
        return (
            f"cp{self.cp},{sp},v{self.vpp},mb{self.micro_batch},{self.schedule},"
            f"{self.recompute},z{self.zero}{scope}{self.axes_label(',')}"
        ) + (f",{self.collectives.label()}" if self.collectives else "")

    def plan_axes(self) -> dict[str, Any]:
        """The ``Plan`` keyword of the plan-scope axes not at degree 1 (``Plan.axes``; none:
        no keyword, the default)."""
        named = tuple((n, d) for n, d in self.axes if d != 1)
        return {"axes": named} if named else {}

    def plan(self, *, precision: str, name: str = "", **layout: Any) -> Plan:
        """The one constructor of the planner's plans: these knobs at ``precision`` with
        ``layout`` (uniform degrees, ``order``, ``group``, ``global_batch``; or ``replicas``).
        """
        return Plan(name=name, vpp=self.vpp, micro_batch=self.micro_batch,
                    sequence_parallel=self.sequence_parallel, schedule=self.schedule,
                    recompute=self.recompute, zero=self.zero, zero_scope=self.zero_scope,
                    precision=precision,  # type: ignore[arg-type]
                    collectives=self.collectives, **self.plan_axes(), **layout)

    @staticmethod
    def of(plan: Plan) -> Knobs:
        """The knobs of ``plan`` (its plan-wide settings)."""
        return Knobs(cp=plan.cp, sequence_parallel=plan.sequence_parallel, vpp=plan.vpp,
                     micro_batch=plan.micro_batch, schedule=plan.schedule,
                     recompute=plan.recompute, zero=plan.zero, zero_scope=plan.zero_scope,
                     axes=plan.axes, collectives=plan.collectives)

    def axes_label(self, sep: str) -> str:
        """``sep`` + name + degree per plan-scope axis not at degree 1 (names and keys)."""
        return "".join(f"{sep}{n}{d}" for n, d in self.axes if d != 1)


def knob_sets(space: SearchSpace, cp: int, any_tp: bool,
              axes: Sequence[tuple[tuple[str, int], ...]] | None = None) -> Iterator[Knobs]:
    """Every knob combination for one CP degree; vpp as each schedule's chunk shape allows
    (one chunk, or looped vpp >= 2); SP iff TP > 1; ZeRO scope ``group`` only with ZeRO >= 1
    (``Plan`` refuses it without sharding); every ``axes`` combination of the plan-scope
    axes (default: every combination of the space's degrees; ``search.experts.axis_combos``
    widens them for a mixture-of-experts model)."""
    sps = sorted(set(space.sequence_parallel)) if any_tp else [False]
    scopes = [s for s in ("all", "group") if s in space.zero_scope]
    if axes is None:
        names = [n for n, _ in space.axis_degrees()]
        axes = [tuple(zip(names, d, strict=True))
                for d in itertools.product(*(d for _, d in space.axis_degrees()))]
    for sp, vpp, mb, sched, rc, z, zs, degrees in itertools.product(
        sps,
        sorted(set(space.vpp)),
        sorted(set(space.micro_batch)),
        space.schedule,
        space.recompute,
        sorted(set(space.zero)),
        scopes,
        axes,
    ):
        if not schedules.traits(sched).vpp_ok(vpp) or (zs == "group" and z == 0):
            continue
        yield Knobs(
            cp=cp,
            sequence_parallel=sp,
            vpp=vpp,
            micro_batch=mb,
            schedule=sched,
            recompute=rc,
            zero=z,
            zero_scope=zs,
            axes=degrees,
        )


def share_unit(s: Structure, k: Knobs) -> int:
    """Micro-batches per share unit: the lcm of the schedule's unit over the replica classes."""
    tr = schedules.traits(k.schedule)
    if not tr.microbatches_per_pp:  # the hot path: asked for every candidate
        return 1
    out = 1
    for c in s.classes:
        u = tr.microbatch_unit(c.pp)
        out = out * u // math.gcd(out, u)
    return out


@dataclass(kw_only=True)
class ClassCost:
    """One replica class after the split: layers per rank and per-micro-batch rank times."""

    cls: ReplicaClass
    split: Split
    a_offset: float
    """``k - a`` of the pipeline weights (the per-replica time is (k - a_offset) max + b sum)."""
    b: float

    def replica_time(self, microbatches: int) -> float:
        """Predicted time of one replica of this class running ``microbatches``."""
        return (microbatches - self.a_offset) * self.split.max_time + self.b * self.split.sum_time


@dataclass(kw_only=True, slots=True)
class Candidate:
    """Structure + knobs, with what the planner learnt about it so far."""

    structure: Structure
    knobs: Knobs
    gpus: int
    price_per_hour: float = 0.0
    bound: float = 0.0
    """Upper bound on tokens/s (cheap one until refined, then from the DP split)."""
    refined: bool = False
    classes: list[ClassCost] = field(default_factory=list)

    @property
    def key(self) -> str:
        return f"{self.structure.key()}|{self.knobs.key()}"


def expert_dp(k: Knobs, dp: int, tp: int) -> int:
    """The expert-data-parallel peers of a rank whose ZeRO group has ``dp`` replicas:
    dp x cp x tp / (ep x etp) (``placement.experts``; 1 without EP)."""
    d = dict(k.axes)
    ep = d.get("ep", 1)
    if ep == 1:
        return dp
    return max(1, dp * k.cp * tp // (ep * d.get("etp", 1)))
