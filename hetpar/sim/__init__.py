"""The iteration simulator: ``simulate(model, cluster, plan, job) -> Report``."""

from hetpar.sim import moe as _moe  # noqa: F401  (registers the ep axis's cost)
from hetpar.sim.core import simulate
from hetpar.sim.memory import MemoryRow
from hetpar.sim.report import Report, TraceEvent

__all__ = ["MemoryRow", "Report", "TraceEvent", "simulate"]
