"""Pipeline schedules as data: actions, schedules, and the registry of schedule builders."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

from hetpar.errors import ConfigError, Infeasible

Kind = Literal["F", "B", "W"]
KINDS: tuple[Kind, ...] = ("F", "B", "W")


@dataclass(frozen=True, kw_only=True, slots=True)
class Action:
    """One unit of pipeline work on one model chunk for one microbatch.

    ``F`` is the forward pass; ``B`` the backward pass w.r.t. the chunk's inputs (the whole
    backward when the schedule does not split it); ``W`` the backward w.r.t. its weights.
    """

    kind: Kind
    chunk: int
    """Virtual stage in model order, 0..pp*vpp-1; it runs on pipeline rank ``chunk % pp``."""
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


@dataclass(frozen=True)
class _Entry:
    builder: Builder
    splits_backward: bool


_REGISTRY: dict[str, _Entry] = {}


def register(name: str, *, splits_backward: bool = False) -> Callable[[Builder], Builder]:
    """Decorator registering a schedule builder under ``name`` (one module per schedule)."""

    def deco(fn: Builder) -> Builder:
        assert name not in _REGISTRY, f"schedule {name!r} registered twice"
        _REGISTRY[name] = _Entry(fn, splits_backward)
        return fn

    return deco


def names() -> list[str]:
    """Names of the registered schedules."""
    return sorted(_REGISTRY)


def build(name: str, pp: int, num_microbatches: int, vpp: int = 1) -> Schedule:
    """Build schedule ``name`` for ``pp`` ranks, ``num_microbatches``, ``vpp`` chunks per rank.

    Raises ConfigError for an unknown name or non-positive sizes, Infeasible("schedule", ...)
    for a combination the schedule cannot express.
    """
    entry = _REGISTRY.get(name)
    if entry is None:
        raise ConfigError(f"schedule: unknown schedule {name!r}; known: {', '.join(names())}")
    for key, value in (("pp", pp), ("num_microbatches", num_microbatches), ("vpp", vpp)):
        if not isinstance(value, int) or value < 1:
            raise ConfigError(f"schedule: {key} must be an integer >= 1, got {value!r}")
    ranks = entry.builder(pp, num_microbatches, vpp)
    assert len(ranks) == pp, f"schedule {name} built {len(ranks)} ranks for pp={pp}"
    return Schedule(
        name=name,
        pp=pp,
        vpp=vpp,
        num_microbatches=num_microbatches,
        splits_backward=entry.splits_backward,
        ranks=tuple(tuple(r) for r in ranks),
    )


def require_vpp1(name: str, vpp: int) -> None:
    """Schedules without model chunks reject vpp > 1."""
    if vpp != 1:
        raise Infeasible(
            "schedule", f"{name} has one model chunk per rank; got vpp={vpp} (use interleaved)"
        )
