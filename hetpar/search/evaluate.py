"""Evaluating batches of plans: in-process, on worker processes, or on a Ray cluster."""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
import socket
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from hetpar.errors import ConfigError, Infeasible
from hetpar.search.costmodel import CostModel, Evaluation
from hetpar.specs.plan import Plan


@dataclass(frozen=True)
class Failed:
    """A plan the cost model rejected, with the Infeasible kind and reason."""

    kind: str
    reason: str


Outcome = Evaluation | Failed


def evaluate_one(cost: CostModel, plan: Plan) -> Outcome:
    """Evaluate ``plan``; Infeasible becomes ``Failed`` and an OOM report ``Failed('memory')``."""
    try:
        ev = cost.evaluate(plan)
    except Infeasible as e:
        return Failed(e.kind, e.reason)
    if ev.oom:
        return Failed("memory", f"out of memory (peak {ev.peak_memory_fraction:.0%} of capacity)")
    return ev


class Backend(Protocol):
    """Evaluates a list of plans and returns the outcomes in the same order."""

    def map(self, plans: list[Plan]) -> list[Outcome]: ...

    def close(self) -> None: ...


class Serial:
    """In this process (``--workers 1``)."""

    def __init__(self, cost: CostModel) -> None:
        self.cost = cost

    def map(self, plans: list[Plan]) -> list[Outcome]:
        return [evaluate_one(self.cost, p) for p in plans]

    def close(self) -> None:
        pass


_WORKER_COST: Any = None


def _init_worker(cost: CostModel, parent: int) -> None:
    global _WORKER_COST
    die_with_parent(parent)
    _WORKER_COST = cost


PR_SET_PDEATHSIG = 1  # prctl(2), linux/prctl.h


def die_with_parent(parent: int) -> None:
    """Have the kernel SIGKILL this worker when its parent dies (a SIGKILLed `hetpar plan`
    cannot shut its pool down); elsewhere a worker notices on its next task at the latest."""
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def _work(plan: Plan) -> Outcome:
    return evaluate_one(_WORKER_COST, plan)


class Processes:
    """Worker processes on this machine; the cost model is shipped once to each."""

    def __init__(self, cost: CostModel, workers: int) -> None:
        ctx = mp.get_context("fork" if sys.platform.startswith("linux") else "spawn")
        self.pool = ProcessPoolExecutor(
            workers, mp_context=ctx, initializer=_init_worker, initargs=(cost, os.getpid())
        )

    def map(self, plans: list[Plan]) -> list[Outcome]:
        return list(self.pool.map(_work, plans))

    def close(self) -> None:
        self.pool.shutdown(cancel_futures=True)


def evaluate_many(cost: CostModel, plans: list[Plan]) -> list[Outcome]:
    """A chunk of plans in one task (one Ray task per plan would cost more than the plan)."""
    return [evaluate_one(cost, p) for p in plans]


def _check_reachable(address: str) -> None:
    """A ``HOST:PORT`` or ``ray://HOST:PORT`` address must accept a TCP connection (3 s)."""
    hostport = address.removeprefix("ray://")
    if address in ("local", "auto") or ":" not in hostport:
        return
    host, _, port = hostport.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
    except (OSError, ValueError) as e:
        raise ConfigError(f"--workers ray:{address}: cannot start or reach Ray: {e}") from None


class RayBackend:
    """Tasks on a Ray cluster (``--workers ray[:ADDRESS]``); ``ray`` is an optional extra.

    ``address`` "local" starts a Ray instance on this machine for the search; anything else
    (``auto``, ``HOST:PORT``, ``ray://HOST:10001``) connects to a running cluster. Plans go
    out in chunks, a few per worker CPU, and come back in submission order.
    """

    def __init__(self, cost: CostModel, address: str) -> None:
        try:
            import ray
        except ImportError:
            raise ConfigError(
                "--workers ray: the 'ray' package is not installed; install it with "
                "pip install 'hetpar[ray]' or use --workers N"
            ) from None
        self.ray = ray
        _check_reachable(address)  # Ray itself waits minutes for an absent head
        try:
            ray.init(address=address, ignore_reinit_error=True, log_to_driver=False,
                     include_dashboard=False, logging_level=logging.WARNING)
        except (ConnectionError, RuntimeError, ValueError) as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            msg = f"--workers ray:{address}: cannot start or reach Ray: {first}"
            raise ConfigError(msg) from None
        self.cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
        self.cost_ref = ray.put(cost)
        self.task = ray.remote(evaluate_many)

    def map(self, plans: list[Plan]) -> list[Outcome]:
        size = max(1, -(-len(plans) // (4 * self.cpus)))  # ~4 chunks per CPU
        chunks = [plans[i : i + size] for i in range(0, len(plans), size)]
        refs = [self.task.remote(self.cost_ref, c) for c in chunks]
        return [o for chunk in self.ray.get(refs) for o in chunk]  # submission order

    def close(self) -> None:
        self.ray.shutdown()  # ends a local instance; only disconnects from a cluster


def make_backend(cost: CostModel, workers: int, ray_address: str | None) -> Backend:
    """The backend for ``--workers N`` / ``--workers ray[:ADDRESS]``; results never depend
    on it."""
    if ray_address:
        return RayBackend(cost, ray_address)
    if workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {workers}")
    return Serial(cost) if workers == 1 else Processes(cost, workers)


class Progress:
    """A one-line progress bar on stderr, drawn only for searches that take a while."""

    def __init__(self, enabled: bool, delay_s: float = 1.0) -> None:
        self.enabled, self.delay = enabled, delay_s
        self.start = time.perf_counter()
        self.drawn = False

    def update(self, done: int, todo: int, best: str) -> None:
        """Redraw: ``done`` plans evaluated, ``todo`` candidates still in the queue."""
        if not self.enabled or time.perf_counter() - self.start < self.delay:
            return
        frac = done / max(1, done + todo)
        bar = "#" * int(30 * frac)
        line = f"\rplanning [{bar:<30}] {done} evaluated, {todo} queued, best {best}"
        sys.stderr.write(line[:120])
        sys.stderr.flush()
        self.drawn = True

    def close(self) -> None:
        if self.drawn:
            sys.stderr.write("\n")
            sys.stderr.flush()
