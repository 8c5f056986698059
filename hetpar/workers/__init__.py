"""Where independent work runs: in this process, on worker processes, or on a Ray cluster."""

from __future__ import annotations

from hetpar.workers.pool import (
    CHUNKS_PER_WORKER,
    PROCESSES_PER_CPU,
    SERIAL,
    Pool,
    Processes,
    Workers,
    check_processes,
    chunk_size,
    die_with_parent,
    parse_workers,
)
from hetpar.workers.raypool import RayPool

__all__ = ["CHUNKS_PER_WORKER", "PROCESSES_PER_CPU", "SERIAL", "Pool", "Processes", "RayPool",
           "Workers", "check_processes", "chunk_size", "die_with_parent", "open_pool",
           "parse_workers"]


def open_pool(workers: Workers) -> Pool:
    """The pool for ``workers``: this process, worker processes or Ray (close it, or use
    ``with``)."""
    if workers.ray_address is not None:
        return RayPool(workers.ray_address)
    check_processes(workers.processes)
    return Pool() if workers.processes == 1 else Processes(workers.processes)
