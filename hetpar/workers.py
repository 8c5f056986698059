"""Where independent work runs: in this process, on worker processes, or on a Ray cluster."""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import signal
import socket
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
        self._shared: object = _NOTHING

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
        self._pool, self._shared = None, _NOTHING


_NOTHING = object()


class _Actor:
    """One Ray worker process for the pool's lifetime: it holds the last ``shared`` object it
    was sent and runs chunks of items against it, so what ``fn`` caches (the simulator's
    topology and layer-time caches, keyed on the identity of the cluster and GPU objects
    that ``shared`` holds) stays warm from one chunk and one map to the next."""

    def __init__(self) -> None:
        self.shared: Any = None

    def load(self, shared: object) -> None:
        """Keep ``shared`` (Ray resolves the object-store reference, once per worker)."""
        self.shared = shared

    def run(self, fn: Callable[[Any, T], R], chunk: list[T]) -> list[R]:
        """``fn(shared, x)`` for each item of ``chunk``."""
        return [fn(self.shared, x) for x in chunk]


def _check_reachable(address: str) -> None:
    """A ``HOST:PORT`` or ``ray://HOST:PORT`` address must accept a TCP connection (3 s):
    Ray itself waits minutes for an absent head."""
    hostport = address.removeprefix("ray://")
    if address in ("local", "auto") or ":" not in hostport:
        return
    host, _, port = hostport.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
    except (OSError, ValueError) as e:
        raise ConfigError(_unreachable(address, str(e))) from None


def _unreachable(address: str, why: str) -> str:
    where = "this machine" if address == "local" else address
    first = why.strip().splitlines()[0] if why.strip() else "no reason given"
    spec = Workers(ray_address=address)
    return f"--workers {spec}: cannot start or reach Ray at {where}: {first}"


class RayPool(Pool):
    """Long-lived workers on a Ray cluster (``ray`` is an optional extra), one Ray actor per
    cluster CPU: ``shared`` is put in the object store once and each actor fetches it once
    (a new object is sent anew), items go out in chunks, a few per actor, each chunk to the
    next actor that is free. Plain Ray tasks would each resolve ``shared`` from the object
    store into a new object, so the simulator's identity-keyed caches start cold every
    task (docs/issue16-checklist.md, section 3, measures the difference)."""

    remote = True
    IN_FLIGHT = 2
    """Chunks queued on each actor: the next one is there when the current one ends."""

    def __init__(self, address: str) -> None:
        try:
            import ray
        except ImportError:
            raise ConfigError(
                f"--workers {Workers(ray_address=address)}: the 'ray' package is not installed;"
                " install it with pip install 'hetpar[ray]' or use --workers N"
            ) from None
        self.ray = ray
        self.owned = not ray.is_initialized()  # a caller's connection is left open
        if self.owned:
            _check_reachable(address)
            try:
                ray.init(address=address, ignore_reinit_error=True, log_to_driver=False,
                         include_dashboard=False, logging_level=logging.WARNING)
            except (ConnectionError, RuntimeError, ValueError) as e:
                raise ConfigError(_unreachable(address, str(e) or type(e).__name__)) from None
        self.workers = max(1, int(ray.cluster_resources().get("CPU", 1)))
        self._actor_class: Any = ray.remote(num_cpus=1)(_Actor)
        self._actors: list[Any] = []
        self._shared: object = _NOTHING

    def _send(self, shared: object) -> None:
        """Start the actors (first map) and hand each the new ``shared`` object."""
        if not self._actors:
            self._actors = [self._actor_class.remote() for _ in range(self.workers)]
        ref = self.ray.put(shared)
        # an actor runs its calls in the order they were sent, so ``load`` precedes the
        # chunks; waiting here surfaces a failed start or an unpicklable object at once
        self.ray.get([a.load.remote(ref) for a in self._actors])
        self._shared = shared

    def _run(self, fn: Callable[[S, T], R], items: list[T], shared: S) -> Iterator[R]:
        if self._shared is not shared:
            self._send(shared)
        size = chunk_size(len(items), self.workers)
        chunks = [items[i : i + size] for i in range(0, len(items), size)]
        pending: dict[Any, tuple[int, Any]] = {}  # ref -> (chunk index, its actor)
        done: dict[int, list[R]] = {}
        sent = shown = 0
        for actor in self._actors * self.IN_FLIGHT:
            if sent < len(chunks):
                pending[actor.run.remote(fn, chunks[sent])] = (sent, actor)
                sent += 1
        while pending:
            ready, _ = self.ray.wait(list(pending), num_returns=1)
            index, actor = pending.pop(ready[0])
            done[index] = self.ray.get(ready[0])
            if sent < len(chunks):
                pending[actor.run.remote(fn, chunks[sent])] = (sent, actor)
                sent += 1
            while shown in done:  # results in item order, each as soon as all before it
                yield from done.pop(shown)
                shown += 1

    def close(self) -> None:
        if self.ray.is_initialized():
            for actor in self._actors:
                self.ray.kill(actor)  # frees its CPU, also on a cluster this pool only joined
        self._actors, self._shared = [], _NOTHING
        if self.owned and self.ray.is_initialized():
            self.ray.shutdown()  # ends a local instance; only disconnects from a cluster


def open_pool(workers: Workers) -> Pool:
    """The pool for ``workers``: this process, worker processes or Ray (close it, or use
    ``with``)."""
    if workers.ray_address is not None:
        return RayPool(workers.ray_address)
    check_processes(workers.processes)
    return Pool() if workers.processes == 1 else Processes(workers.processes)
