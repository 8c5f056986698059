"""Pipeline schedules as data: per pipeline rank, an ordered list of F/B/W actions."""

from hetpar.schedules import classic, zero_bubble  # noqa: F401  (register the built-ins)
from hetpar.schedules.base import Action, Builder, Schedule, build, names, register
from hetpar.schedules.execute import ChunkTimes, Timeline, execute, in_flight

__all__ = [
    "Action",
    "Builder",
    "ChunkTimes",
    "Schedule",
    "Timeline",
    "build",
    "execute",
    "in_flight",
    "names",
    "register",
]
