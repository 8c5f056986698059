"""The registry of schedule builders: register by name, build (remembered per shape), look up."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from hetpar.errors import ConfigError, Infeasible
from hetpar.schedules.base import Builder, ChunkShape, Schedule, Traits, rank_of


@dataclass(frozen=True)
class _Entry:
    builder: Builder
    traits: Traits
    built: dict[tuple[int, int, int], Schedule] = field(default_factory=dict, compare=False)
    """Schedules built, by (pp, num_microbatches, vpp): the action lists depend on nothing
    else, so the planner's candidates of one pipeline shape share them and their compiled
    form; re-registering a name starts a new entry."""


_REGISTRY: dict[str, _Entry] = {}
_PLACED: dict[tuple[str, int, int], tuple[int, ...]] = {}
DEFAULT = "1f1b"
"""The schedule a plan gets when it names none, and the exports' fallback."""
DEFAULT_LOOPED = "interleaved"
"""The schedule a plan with vpp > 1 chunks per rank gets when it names none."""


def default_for(vpp: int) -> str:
    """The schedule a plan with ``vpp`` chunks per rank gets when it names none."""
    return DEFAULT_LOOPED if vpp > 1 else DEFAULT


def register(
    name: str, traits: Traits | None = None, *, splits_backward: bool = False
) -> Callable[[Builder], Builder]:
    """Decorator registering a schedule builder and its traits under ``name``."""

    def deco(fn: Builder) -> Builder:
        assert name not in _REGISTRY, f"schedule {name!r} registered twice"
        _PLACED.clear()
        _REGISTRY[name] = _Entry(fn, traits or Traits(splits_backward=splits_backward))
        return fn

    return deco


def unregister(name: str) -> None:
    """Remove a registered schedule (for tests and plug-ins that register temporarily)."""
    del _REGISTRY[name]
    _PLACED.clear()


def names() -> list[str]:
    """Names of the registered schedules."""
    return sorted(_REGISTRY)


def traits(name: str) -> Traits:
    """The traits of schedule ``name``; ConfigError naming the known ones if unknown."""
    entry = _REGISTRY.get(name)
    if entry is None:
        raise ConfigError(f"schedule: unknown schedule {name!r}; known: {', '.join(names())}")
    return entry.traits


def check(name: str, pp: int, vpp: int, microbatches: int) -> None:
    """ConfigError for an unknown name, Infeasible("schedule") for what it cannot run."""
    why = traits(name).problem(name, pp, vpp, microbatches)
    if why:
        raise Infeasible("schedule", why)


def vocabulary() -> tuple[str, ...]:
    """Every schedule name a runs file may give: the registered ones, then those they stand
    in for (``Traits.stands_for``)."""
    return (*names(), *(a for n in names() for a in _REGISTRY[n].traits.stands_for))


def stand_in(name: str) -> str | None:
    """The registered schedule simulated in place of ``name`` (itself when registered)."""
    if name in _REGISTRY:
        return name
    return next((n for n in names() if name in _REGISTRY[n].traits.stands_for), None)


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
    check(name, pp, vpp, num_microbatches)
    shape = (pp, num_microbatches, vpp)
    hit = entry.built.get(shape)
    if hit is None:
        if len(entry.built) >= 16:
            entry.built.clear()
        ranks = entry.builder(pp, num_microbatches, vpp)
        assert len(ranks) == pp, f"schedule {name} built {len(ranks)} ranks for pp={pp}"
        hit = entry.built[shape] = Schedule(
            name=name,
            pp=pp,
            vpp=vpp,
            num_microbatches=num_microbatches,
            splits_backward=entry.traits.splits_backward,
            ranks=tuple(tuple(r) for r in ranks),
            shape=entry.traits.chunks,
        )
    return hit


def shape_of(name: str) -> ChunkShape:
    """How schedule ``name`` places its chunks (an unknown name: looped, c % pp; ``build``
    and ``check`` refuse it where it matters)."""
    entry = _REGISTRY.get(name)
    return entry.traits.chunks if entry is not None else "looped"


def placement(name: str, pp: int, vpp: int) -> tuple[int, ...]:
    """The pipeline rank of every model chunk (model order) under schedule ``name``."""
    key = (name, pp, vpp)
    hit = _PLACED.get(key)
    if hit is None:  # the simulator asks per chunk: remembered until the registry changes
        shape = shape_of(name)
        if len(_PLACED) >= 256:
            _PLACED.clear()
        hit = _PLACED[key] = tuple(rank_of(c, pp, shape) for c in range(pp * vpp))
    return hit


def require_vpp1(name: str, vpp: int) -> None:
    """Schedules without model chunks reject vpp > 1."""
    if vpp != 1:
        raise Infeasible(
            "schedule", f"{name} has one model chunk per rank; got vpp={vpp} (use interleaved)"
        )
