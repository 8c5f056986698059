"""Pipeline schedules as data: actions, schedules, rank times and the traits a schedule declares."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

Kind = Literal["F", "B", "W"]
KINDS: tuple[Kind, ...] = ("F", "B", "W")


ChunkShape = Literal["single", "looped", "v"]
"""How model chunks sit on pipeline ranks: ``single`` = one chunk per rank (vpp = 1);
``looped`` = vpp >= 2 chunks per rank, chunk j*pp + r on rank r (Narayanan et al. 2021,
sec. 2.2.2); ``v`` = two chunks per rank in a V, chunk c on rank c for c < pp and on rank
2 pp - 1 - c after (Qi et al. 2024's ZB-V, arXiv 2401.10241 Sec. 6: the last rank holds chunks
pp - 1 and pp, so the forward turns there without a send)."""


def rank_of(chunk: int, pp: int, shape: ChunkShape = "looped") -> int:
    """The pipeline rank that runs model chunk ``chunk`` under placement ``shape``."""
    if shape == "v" and chunk >= pp:
        return 2 * pp - 1 - chunk
    return chunk % pp


@dataclass(frozen=True, kw_only=True, slots=True)
class Action:
    """One unit of pipeline work on one model chunk for one microbatch.

    ``F`` is the forward pass; ``B`` the backward pass w.r.t. the chunk's inputs (the whole
    backward when the schedule does not split it); ``W`` the backward w.r.t. its weights.
    """

    kind: Kind
    chunk: int
    """Virtual stage in model order, 0..pp*vpp-1; it runs on pipeline rank ``rank_of(chunk)``
    (``chunk % pp`` but for V-shaped schedules)."""
    microbatch: int

    def __str__(self) -> str:
        return f"{self.kind}{self.chunk}.{self.microbatch}"


@dataclass(frozen=True, kw_only=True)
class Schedule:
    """A pipeline schedule: for every pipeline rank, the ordered actions it performs."""

    name: str
    pp: int
    vpp: int
    num_microbatches: int
    splits_backward: bool
    """True when the backward is split into B (inputs) and W (weights) actions."""
    ranks: tuple[tuple[Action, ...], ...] = field(repr=False)
    shape: ChunkShape = "single"
    """How chunks sit on ranks (the schedule's ``Traits.chunks``)."""

    def rank_of(self, chunk: int) -> int:
        """The pipeline rank that runs model chunk ``chunk``."""
        return rank_of(chunk, self.pp, self.shape)

    @property
    def num_chunks(self) -> int:
        return self.pp * self.vpp

    @property
    def num_actions(self) -> int:
        return sum(len(r) for r in self.ranks)

    @cached_property
    def compiled(self) -> tuple[tuple[tuple[int, int, int], ...], ...]:
        """Per rank, ``(kind code 0/1/2 for F/B/W, chunk, microbatch)`` triples (for executors)."""
        code = {"F": 0, "B": 1, "W": 2}
        return tuple(
            tuple((code[a.kind], a.chunk, a.microbatch) for a in actions) for actions in self.ranks
        )


# A builder turns (pp, num_microbatches, vpp) into per-rank action lists, raising Infeasible
# for combinations it cannot schedule.
Builder = Callable[[int, int, int], Sequence[Sequence[Action]]]

@dataclass(frozen=True, slots=True)
class RankTimes:
    """Seconds per micro-batch on one pipeline rank, summed over its chunks.

    ``fwd`` and ``bwd`` include the blocking p2p sends of that rank; ``wgt`` is the
    weight-gradient part of the backward (separate only for zero-bubble schedules).
    """

    fwd: float
    bwd: float
    wgt: float

    @property
    def total(self) -> float:
        return self.fwd + self.bwd + self.wgt


Makespan = Callable[[Sequence[RankTimes], int, int], float]
"""Closed-form pipeline time ``(rank times, micro-batches, vpp) -> seconds`` (pp >= 2)."""
InFlight = Callable[[int, int, int, int], int]
"""Closed-form ``(pp, micro-batches, vpp, rank) -> chunk activations held at the peak``."""
Fill = Callable[[int], float]
"""``vpp -> f``: the planner bounds a replica by ``(m - f) max_rank + f sum_ranks``."""


@dataclass(frozen=True, kw_only=True)
class Traits:
    """What a schedule declares about itself. Other modules read these, never the name."""

    chunks: ChunkShape = "single"
    splits_backward: bool = False
    """True when the backward is split into B (inputs) and W (weights) actions."""
    min_pp: int = 1
    microbatches_per_pp: bool = False
    """Micro-batches per replica must be a multiple of pp (groups of pp, as Megatron-LM's
    interleaved schedule runs them)."""
    fill: Fill | None = None
    """Bound weight of the fill/drain; None = 0, i.e. only ``m x max_rank`` (every rank must
    run all its micro-batches), a lower bound on the makespan of any schedule."""
    makespan: Makespan | None = None
    """Closed form, or None: the simulator runs the event-driven executor."""
    in_flight: InFlight | None = None
    """Closed form, or None: counted from the action lists (held until W)."""
    in_flight_bounded: bool = False
    """The peak stash stops growing after a few rounds (so it may be counted on fewer
    micro-batches); False for GPipe-like schedules that hold every micro-batch."""
    lockstep: bool = False
    """A lock-step pipeline engine can run it: DeepSpeed's TrainSchedule alternates one
    forward and one backward per step on one chunk per rank (deepspeed/runtime/pipe/
    schedule.py), so a framework whose engine is lock-step times it step by step
    (sim/lockstep.py) rather than with the event-driven executor."""
    stands_for: tuple[str, ...] = ()
    """Schedules without a registered action list (names in published runs) that this one
    stands in for; it is simulated in their place and its time is an upper bound on theirs."""

    def vpp_ok(self, vpp: int) -> bool:
        """Whether this many chunks per rank fits the schedule's chunk shape."""
        if self.chunks == "v":
            return vpp == 2
        return vpp == 1 if self.chunks == "single" else vpp >= 2

    def microbatch_unit(self, pp: int) -> int:
        """Per-replica micro-batch counts must be multiples of this."""
        return pp if self.microbatches_per_pp and pp > 1 else 1

    def weights(self, pp: int, vpp: int, microbatches: int) -> tuple[float, float]:
        """``(a, b)``: the planner's replica time ``a max_rank + b sum_ranks`` (per micro-batch)."""
        if pp == 1:
            return float(microbatches), 0.0
        f = self.fill(vpp) if self.fill is not None else 0.0
        return microbatches - f, f

    def problem(self, name: str, pp: int, vpp: int, microbatches: int) -> str | None:
        """Why the schedule cannot run this (pp, vpp, micro-batches), or None."""
        if not self.vpp_ok(vpp):
            want = {"single": "one model chunk per rank", "looped": "vpp >= 2 chunks",
                    "v": "vpp = 2 chunks (a V)"}[self.chunks]
            return f"{name} needs {want}, got vpp={vpp}"
        if pp < self.min_pp:
            return f"{name} needs pp >= {self.min_pp}, got pp={pp}"
        unit = self.microbatch_unit(pp)
        if microbatches % unit:
            return f"{name} needs num_microbatches ({microbatches}) to be a multiple of pp ({pp})"
        return None
