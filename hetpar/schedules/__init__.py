"""Pipeline schedules as data: per pipeline rank, an ordered list of F/B/W actions."""

import importlib
import pkgutil

from hetpar.schedules.base import Action, Builder, ChunkShape, RankTimes, Schedule, Traits, rank_of
from hetpar.schedules.execute import ChunkTimes, Timeline, execute, in_flight, in_flight_weighted
from hetpar.schedules.registry import (
    DEFAULT,
    DEFAULT_LOOPED,
    build,
    check,
    default_for,
    names,
    placement,
    register,
    shape_of,
    stand_in,
    traits,
    unregister,
    vocabulary,
)

# Every other module of this package registers schedules when imported: adding a schedule is
# adding one module (builder + traits), as adding a GPU is adding one catalog file.
for _module in pkgutil.iter_modules(__path__):
    if _module.name not in ("base", "execute", "registry"):
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = [
    "DEFAULT",
    "DEFAULT_LOOPED",
    "Action",
    "Builder",
    "ChunkShape",
    "ChunkTimes",
    "RankTimes",
    "Schedule",
    "Timeline",
    "Traits",
    "build",
    "check",
    "default_for",
    "execute",
    "in_flight",
    "in_flight_weighted",
    "names",
    "placement",
    "rank_of",
    "register",
    "shape_of",
    "stand_in",
    "traits",
    "unregister",
    "vocabulary",
]
