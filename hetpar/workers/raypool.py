"""Long-lived workers on a Ray cluster (the optional `ray` extra), one actor per CPU."""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Iterator
from typing import Any

from hetpar.errors import ConfigError
from hetpar.workers.pool import NOTHING, Pool, R, S, T, Workers, chunk_size


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
        self._shared: object = NOTHING

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
        self._actors, self._shared = [], NOTHING
        if self.owned and self.ray.is_initialized():
            self.ray.shutdown()  # ends a local instance; only disconnects from a cluster
