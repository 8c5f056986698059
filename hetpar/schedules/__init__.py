"""Pipeline schedules as data: per pipeline rank, an ordered list of F/B/W actions."""

from hetpar.schedules import classic, zero_bubble  # noqa: F401  (register the built-ins)
from hetpar.schedules.base import (
    DEFAULT,
    Action,
    Builder,
    FrameworkNames,
    RankTimes,
    Schedule,
    Traits,
    build,
    check,
    from_framework,
    names,
    register,
    traits,
    unregister,
)
from hetpar.schedules.execute import ChunkTimes, Timeline, execute, in_flight

__all__ = [
    "DEFAULT",
    "Action",
    "Builder",
    "ChunkTimes",
    "FrameworkNames",
    "RankTimes",
    "Schedule",
    "Timeline",
    "Traits",
    "build",
    "check",
    "execute",
    "from_framework",
    "in_flight",
    "names",
    "register",
    "traits",
    "unregister",
]
