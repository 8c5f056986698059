"""Time sends and collectives between ranks and between nodes, for `hetpar probe` (torch).

Ranks are grouped into nodes by host name. Each level is measured on a communicator that spans
only it, so its fit has one unknown pair: ``scale-up`` on each node's ranks (all nodes at once,
as a training job loads them), ``network`` on one rank per node. Timing follows nccl-tests
(src/common.cu): warm-up calls, then per repetition a barrier and ``iters`` back-to-back calls,
the time per call being the slowest participant's; a send is timed as half a ping-pong. Each
repetition sweeps every operation and size before the next one starts.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from hetpar.errors import ConfigError

ITER_BYTES = 1 << 20
"""Calls per repetition: enough that one repetition moves about this much (at most MAX_ITERS);
small calls are then timed over many, as nccl-tests' -n does, so the barrier's skew averages out."""
MAX_ITERS = 20


@dataclass(frozen=True, kw_only=True)
class Sweep:
    """What to measure: operations, requested sizes (bytes), repetitions, and the trace."""

    ops: tuple[str, ...]
    sizes: tuple[int, ...]
    repeats: int
    warmup: int
    device: str = "cpu"
    trace_duration_s: float = 0.0
    trace_interval_s: float = 1.0
    trace_bytes: int = 0
    progress: bool = False
    """Rank 0 draws the repetition it is at on stderr (the command's terminal)."""


@dataclass(frozen=True, kw_only=True)
class Sample:
    """One timed all-reduce of the bandwidth trace: on one node's ranks or across nodes."""

    t_s: float
    level: str
    node: int | None
    ranks: int
    size_bytes: int
    seconds: float


@dataclass(frozen=True, kw_only=True)
class Measured:
    """What rank 0 gathered: the host of each rank, nodes as rank lists, points and samples."""

    hosts: tuple[str, ...]
    nodes: tuple[tuple[int, ...], ...]
    points: tuple[dict[str, Any], ...]
    """Keyword arguments of ``hetpar.net.fit.Point`` (level, op, ranks, size_bytes, seconds)."""
    samples: tuple[Sample, ...]
    backend: str


def group_by_host(hosts: Sequence[str]) -> tuple[tuple[int, ...], ...]:
    """Ranks per node, nodes in order of their first rank; ConfigError for unequal nodes
    (the cluster schema's node group has one gpus_per_node)."""
    nodes: dict[str, list[int]] = {}
    for rank, h in enumerate(hosts):
        nodes.setdefault(h, []).append(rank)
    sizes = {h: len(r) for h, r in nodes.items()}
    if len(set(sizes.values())) > 1:
        got = ", ".join(f"{h}: {n}" for h, n in sizes.items())
        raise ConfigError(f"ranks per host differ ({got}); allowed: the same number on every "
                          "node (torchrun --nproc-per-node)")
    return tuple(tuple(r) for r in nodes.values())


def level_size(size: int, ranks: int) -> int:
    """``size`` rounded up to whole float32 shards of ``ranks`` ranks (at least one each)."""
    unit = 4 * ranks
    return max(unit, -(-size // unit) * unit)


def _iters(size: int) -> int:
    return max(1, min(MAX_ITERS, ITER_BYTES // max(size, 1)))


class _Rank:
    """One rank's view: its communicators and the timing loop."""

    def __init__(self, sweep: Sweep, nodes: tuple[tuple[int, ...], ...]) -> None:
        import torch
        import torch.distributed as dist

        self.torch, self.dist, self.sweep = torch, dist, sweep
        self.rank = dist.get_rank()
        self.dev = torch.device(sweep.device)
        self.node = next(i for i, r in enumerate(nodes) if self.rank in r)
        # every rank creates every group, in one order (torch.distributed.new_group's rule)
        node_groups = [dist.new_group(list(r)) for r in nodes]
        leaders = [r[0] for r in nodes]
        lead_group = dist.new_group(leaders) if len(nodes) > 1 else None
        self.levels: list[tuple[str, Any, list[int]]] = []
        if len(nodes[0]) > 1:
            self.levels.append(("scale-up", node_groups[self.node], list(nodes[self.node])))
        if lead_group is not None:
            self.levels.append(("network", lead_group, leaders))

    def _sync(self) -> None:
        if self.dev.type == "cuda":
            self.torch.cuda.synchronize(self.dev)

    def _call(self, op: str, size: int, group: Any, members: list[int]) -> Callable[[], Any]:
        t, dist, n = self.torch, self.dist, len(members)
        x = t.ones(size // 4, device=self.dev)
        if op == "all_reduce":
            return lambda: dist.all_reduce(x, group=group)
        if op == "all_gather":
            shard = t.ones(size // 4 // n, device=self.dev)
            return lambda: dist.all_gather_single(x, shard, group=group)
        if op == "reduce_scatter":
            out = t.empty(size // 4 // n, device=self.dev)
            return lambda: dist.reduce_scatter_single(out, x, group=group)
        a, b = members[0], members[1]  # p2p: half a ping-pong between the first two
        if self.rank == a:
            return lambda: (dist.send(x, b), dist.recv(x, b))
        if self.rank == b:
            return lambda: (dist.recv(x, a), dist.send(x, a))
        return lambda: None

    def time(self, op: str, size: int, level: int, reps: int, warmup: int) -> list[float]:
        """Seconds per call of each repetition on this rank (nan where it takes no part)."""
        _, group, members = self.levels[level]
        inside = self.rank in members and (op != "p2p" or self.rank in members[:2])
        fn = self._call(op, size, group, members) if inside else (lambda: None)
        iters = _iters(size)
        for _ in range(warmup):
            fn()
        self._sync()
        out = []
        for _ in range(reps):
            self.dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            self._sync()
            dt = (time.perf_counter() - t0) / iters
            out.append((dt / 2 if op == "p2p" else dt) if inside else float("nan"))
        return out


def probe_rank(rank: int, store: Any, sweep: Sweep) -> Measured | None:
    """Run on every rank at once; rank 0 returns what all measured, the others None."""
    import torch.distributed as dist

    hosts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(hosts, socket.gethostname())
    nodes = group_by_host(hosts)
    me = _Rank(sweep, nodes)
    mine: dict[tuple[str, str, int], list[float]] = {}
    # repetition-major: each repetition sweeps every op and size in a short window, so a burst
    # of load on a shared host lands on one repetition of many sizes (the per-repetition fits
    # show it) rather than on every repetition of a few sizes (which no statistic then removes)
    for r in range(sweep.repeats):
        if sweep.progress and me.rank == 0:
            print(f"\rhetpar probe: repetition {r + 1}/{sweep.repeats}", end="",
                  file=sys.stderr, flush=True)
        for i, (level, _, members) in enumerate(me.levels):
            for op in sweep.ops:
                for s in sorted({level_size(s, len(members)) for s in sweep.sizes}):
                    t = me.time(op, s, i, 1, sweep.warmup if r == 0 else 0)
                    mine.setdefault((level, op, s), []).extend(t)
    if sweep.progress and me.rank == 0:
        print("\r" + " " * 40 + "\r", end="", file=sys.stderr, flush=True)
    samples = _trace(me, sweep, nodes) if sweep.trace_duration_s > 0 else []
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (mine, samples))
    dist.barrier()
    if dist.get_rank() != 0:
        return None
    return _merge(tuple(hosts), nodes, everyone, dist.get_backend())


def _trace(me: _Rank, sweep: Sweep, nodes: tuple[tuple[int, ...], ...]) -> list[Sample]:
    """Every ``interval`` for ``duration``: one all-reduce per level (its bandwidth over time).

    The sample count is fixed up front, so every rank issues the same collectives."""
    count = max(1, int(sweep.trace_duration_s / sweep.trace_interval_s - 1e-9) + 1)
    me.dist.barrier()
    start = time.perf_counter()
    out = []
    for k in range(count):
        delay = start + k * sweep.trace_interval_s - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        for i, (level, _, members) in enumerate(me.levels):
            size = level_size(sweep.trace_bytes, len(members))
            dt = me.time("all_reduce", size, i, 1, 0)[0]
            node = me.node if level == "scale-up" else None
            if dt == dt:  # this rank took part
                out.append(Sample(t_s=k * sweep.trace_interval_s, level=level, node=node,
                                  ranks=len(members), size_bytes=size, seconds=dt))
    return out


def _merge(hosts: tuple[str, ...], nodes: tuple[tuple[int, ...], ...], everyone: list[Any],
           backend: str) -> Measured:
    """Per (level, op, size) and repetition the slowest rank (and node): what a synchronous
    job waits for; trace samples likewise per (time, level, node)."""
    merged: dict[tuple[str, str, int], list[float]] = {}
    for mine, _ in everyone:
        for key, times in mine.items():
            old = merged.setdefault(key, [float("nan")] * len(times))
            merged[key] = [max((x for x in (a, b) if x == x), default=float("nan"))
                           for a, b in zip(old, times, strict=True)]
    ranks = {"scale-up": len(nodes[0]), "network": len(nodes)}
    points = tuple({"level": lv, "op": op, "ranks": 2 if op == "p2p" else ranks[lv],
                    "size_bytes": s, "seconds": tuple(t)} for (lv, op, s), t in merged.items())
    best: dict[tuple[float, str, int | None], Sample] = {}
    for _, samples in everyone:
        for smp in samples:
            key = (smp.t_s, smp.level, smp.node)
            if key not in best or smp.seconds > best[key].seconds:
                best[key] = smp
    return Measured(hosts=hosts, nodes=nodes, points=points, backend=backend,
                    samples=tuple(sorted(best.values(), key=lambda s: (s.t_s, s.level,
                                                                          s.node or 0))))


def measure(ranks: int, sweep: Sweep) -> Measured:
    """Fork ``ranks`` local ranks (``hetpar run``'s launcher) or, under torchrun, join its job;
    returns rank 0's ``Measured`` (under torchrun, other ranks raise ``NotRankZero``)."""
    from hetpar.runtime.launch import init_env, launch

    backend = "nccl" if sweep.device.startswith("cuda") else "gloo"
    wall = 900.0 + sweep.trace_duration_s
    if "WORLD_SIZE" in os.environ:
        import torch
        import torch.distributed as dist

        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            sweep = replace(sweep, device=f"cuda:{torch.cuda.current_device()}")
        init_env(backend, timeout_s=wall)
        try:
            out = probe_rank(dist.get_rank(), None, sweep)
        finally:
            dist.destroy_process_group()
        if out is None:
            raise NotRankZero
        return out
    res = launch(probe_rank, ranks, sweep, timeout_s=wall, wall_s=wall, backend=backend)
    assert isinstance(res[0], Measured)
    return res[0]


def local_ranks(requested: int, device: str) -> int:
    """Ranks this probe runs: torchrun's world, else ``requested`` forked ranks (on CUDA at
    most one per GPU: NCCL refuses two ranks on one device); ConfigError without a GPU."""
    if "WORLD_SIZE" in os.environ:
        world = int(os.environ["WORLD_SIZE"])
        if world < 2:
            raise ConfigError(f"torchrun started {world} rank; allowed: 2 or more (a probe "
                              "times what passes between ranks)")
        return world
    if not device.startswith("cuda"):
        return requested
    import torch

    # device_count asks NVML and leaves CUDA uninitialised, so forking ranks stays safe
    count = torch.cuda.device_count()
    if count < 2:
        raise ConfigError(f"--device {device}: {count} CUDA device(s) here; NCCL needs one "
                          "per rank, allowed: 2 or more, or --device cpu")
    return min(requested, count)


class NotRankZero(Exception):
    """Under torchrun, this process is not rank 0: it measured, rank 0 reports."""
