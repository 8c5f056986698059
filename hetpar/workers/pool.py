"""The `--workers` setting, the pool every backend extends (this process) and worker processes."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from hetpar.errors import ConfigError

S = TypeVar("S")
T = TypeVar("T")
R = TypeVar("R")

CHUNKS_PER_WORKER = 4
"""Items go out in about this many chunks per worker: a task per item costs more than a cheap
item (a plan, a failure placement), one chunk per worker leaves the early finishers idle."""


@dataclass(frozen=True, kw_only=True)
class Workers:
    """``--workers``: a number of processes on this machine, or a Ray address."""

    processes: int = 1
    ray_address: str | None = None
    """None: processes. "local": a Ray instance started on this machine for the command;
    ``auto``, ``HOST:PORT`` or ``ray://HOST:10001``: a running Ray cluster."""

    def __post_init__(self) -> None:
        if self.processes < 1:
            raise ConfigError(f"--workers must be >= 1, got {self.processes}")

    def __str__(self) -> str:
        if self.ray_address is None:
            return str(self.processes)
        return "ray" if self.ray_address == "local" else f"ray:{self.ray_address}"


SERIAL = Workers()
"""Everything in this process (``--workers 1``)."""


def parse_workers(text: str) -> Workers:
    """``N`` (processes), ``ray`` (Ray on this machine) or ``ray:ADDRESS`` (a Ray cluster)."""
    if text == "ray" or text.startswith("ray:"):
        if text.startswith("ray:") and not text[4:].strip():  # was a local Ray, unasked
            raise ConfigError(f"--workers {text!r}: empty address; give ray (on this machine) "
                              "or ray:ADDRESS")
        return Workers(ray_address=text[4:] or "local")
    try:  # ASCII digits only, as hetpar.io.parse_int (int() takes "1_6" and full-width digits)
        if not (text.isascii() and text.strip().isdigit()):
            raise ValueError(text)
        n = int(text)
    except ValueError:
        raise ConfigError(
            f"--workers: expected a number of processes or ray[:ADDRESS], got {text!r}"
        ) from None
    if n < 1:
        raise ConfigError(f"--workers must be >= 1, got {n}")
    check_processes(n, "--workers")
    return Workers(processes=n)


PROCESSES_PER_CPU = 4  # past the cores a process only adds memory (~250 MB of planner each)


def check_processes(n: int, what: str = "workers") -> None:
    """ConfigError when ``n`` worker processes exceed PROCESSES_PER_CPU x this machine's CPUs."""
    cpus = os.cpu_count() or 1
    if n > PROCESSES_PER_CPU * cpus:
        raise ConfigError(
            f"{what} {n} is more than {PROCESSES_PER_CPU} x this machine's {cpus} CPUs "
            f"({PROCESSES_PER_CPU * cpus}); use ray:ADDRESS to spread work over other machines"
        )


def chunk_size(items: int, workers: int) -> int:
    """Items per task: about ``CHUNKS_PER_WORKER`` tasks per worker, at least one item."""
    return max(1, -(-items // (CHUNKS_PER_WORKER * workers)))


class Pool:
    """Maps ``fn(shared, item)`` over items; results come back in item order, so they never
    depend on the backend or the chunking. ``shared`` goes to each worker once per object
    (a new object is shipped anew), items in chunks."""

    workers: int = 1
    remote = False
    """Whether ``fn`` runs in other processes (callbacks inside ``shared`` do not reach this
    one, and what ``fn`` caches there stays there)."""

    def map(self, fn: Callable[[S, T], R], items: Sequence[T], shared: S,
            tick: Callable[[], object] | None = None) -> list[R]:
        """``[fn(shared, x) for x in items]``; ``tick`` after each result (a progress bar).

        ``fn`` must be a module-level function (pickled by name), ``shared`` and the items
        picklable."""
        out = []
        for r in self._run(fn, list(items), shared):
            out.append(r)
            if tick is not None:
                tick()
        return out

    def _run(self, fn: Callable[[S, T], R], items: list[T], shared: S) -> Iterator[R]:
        return (fn(shared, x) for x in items)

    def close(self) -> None:
        """Stop the workers this pool started."""

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


NOTHING = object()
"""What a remote pool holds before its first ``shared`` object is sent."""


_SHARED: Any = None


def _init_process(shared: object, parent: int) -> None:
    global _SHARED
    die_with_parent(parent)
    _SHARED = shared
    marks = os.environ.get("HETPAR_WORKER_MARKERS")
    if marks:  # a folder: each worker says it started (tests wait for this, not for a time)
        with contextlib.suppress(OSError):
            Path(marks, str(os.getpid())).touch()


def _call(fn: Callable[[Any, T], R], item: T) -> R:
    return fn(_SHARED, item)


PR_SET_PDEATHSIG = 1  # prctl(2), linux/prctl.h


def die_with_parent(parent: int) -> None:
    """Have the kernel SIGKILL this worker when its parent dies (a SIGKILLed command cannot
    shut its pool down); elsewhere a worker notices on its next task at the latest."""
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


class Processes(Pool):
    """Worker processes on this machine; ``shared`` is handed over when they start (fork:
    no copy), so a new shared object starts new workers."""

    remote = True

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._pool: ProcessPoolExecutor | None = None
        self._shared: object = NOTHING

    def _run(self, fn: Callable[[S, T], R], items: list[T], shared: S) -> Iterator[R]:
        if self._pool is None or self._shared is not shared:
            self.close()
            ctx = mp.get_context("fork" if sys.platform.startswith("linux") else "spawn")
            self._pool = ProcessPoolExecutor(self.workers, mp_context=ctx,
                                             initializer=_init_process,
                                             initargs=(shared, os.getpid()))
            self._shared = shared
        size = chunk_size(len(items), self.workers)
        return self._pool.map(partial(_call, fn), items, chunksize=size)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
        self._pool, self._shared = None, NOTHING
