"""Surviving a killed rank without a disk checkpoint: detect, re-form, restore, continue.

Detection: collectives time out or fail on a closed connection, and a heartbeat per rank in
the launcher's store shows which ranks are gone. Both deadlines stretch with the observed
step time (``deadlines.adaptive``: max(floor, 10 x median step)), so a loaded machine, which
slows every rank and its heartbeat thread alike, does not make a live rank look dead.
The survivors re-form a new process group (a fresh store prefix per generation), derive
the degraded plan (``elastic.degrade``), copy parameters and Adam moments from a healthy
replica by broadcast, and redo the failed step: its update was never applied (the world
all-reduce before the update failed).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from hetpar.errors import RuntimeGap
from hetpar.runtime.deadlines import adaptive
from hetpar.runtime.elastic import Degraded, degrade
from hetpar.runtime.layout import Layout, build_layout, local_cluster
from hetpar.runtime.model import ParamInfo, param_infos, shard
from hetpar.runtime.trainer import RankResult, make_worker, schedule_for, train_step
from hetpar.runtime.worker import RunConfig, Worker

HEARTBEAT_S = 0.25
STALE_S = 2.0
"""The least time a heartbeat must be silent before its rank is suspected (the floor of
``deadlines.adaptive``; 8 beats at HEARTBEAT_S)."""
REFORM_S = 25.0
"""The least time survivors wait for each other to agree on the dead ranks."""


def _heartbeat(host: str, port: int, rank: int, stop: threading.Event) -> None:
    client = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=30))
    while not stop.is_set():
        client.set(f"hb/{rank}", repr(time.time()))
        stop.wait(HEARTBEAT_S)


def _stale(store: Any, orig: list[int], stale_s: float = STALE_S) -> set[int]:
    """Ranks (current numbering) whose heartbeat (keyed by launch rank) has been silent for
    more than ``stale_s``."""
    now = time.time()
    return {r for r, o in enumerate(orig) if now - float(store.get(f"hb/{o}").decode()) > stale_s}


def _rendezvous(store: Any, gen: int, rank: int, orig: list[int], wall_s: float,
                stale_s: float = STALE_S) -> set[int]:
    """Survivors register under generation ``gen``; returns the dead ranks (current numbering).

    A survivor proceeds once some heartbeat has gone stale and every rank with a live
    heartbeat has registered; the registrations then name the same survivors for everyone.
    """
    store.set(f"g{gen}/alive/{rank}", "1")
    store.add(f"g{gen}/count", 1)
    deadline = time.monotonic() + wall_s
    while time.monotonic() < deadline:
        dead = _stale(store, orig, stale_s)
        if dead and store.add(f"g{gen}/count", 0) >= len(orig) - len(dead):
            return {r for r in range(len(orig)) if not store.check([f"g{gen}/alive/{r}"])}
        time.sleep(0.05)
    raise TimeoutError("survivors did not agree on the failed ranks in time")


def _restore(w: Worker, old: Worker, old_layout: Layout, deg: Degraded) -> None:
    """Broadcast every parameter and Adam moment from the donor replica's shards."""
    donor = old_layout.stage_ranks[deg.donor_replica]
    last = len(donor) - 1
    with torch.no_grad():
        for j, ranks in enumerate(donor):
            a, b = old_layout.stage_layers(deg.donor_replica, j)
            for name, info in param_infos(old_layout.model, range(a, b), j == 0, j == last).items():
                for kind in ("param", "m", "v"):
                    full = _gather_full(name, info, kind, ranks, old, deg)
                    _take(w, name, info, kind, full)
        step = torch.tensor([old.step], dtype=torch.int64)
        dist.broadcast(step, deg.new_rank[donor[0][0]])
        w.step = int(step.item())


def _gather_full(name: str, info: ParamInfo, kind: str, ranks: tuple[int, ...], old: Worker,
                 deg: Degraded) -> torch.Tensor:
    t = len(ranks)
    parts = []
    for src_old in ranks:
        shape = list(info.shape)
        if info.shard_dim is not None:
            shape[info.shard_dim] //= t
        buf = torch.empty(shape, dtype=old.cfg.dtype, device=old.device)
        if old.role.rank == src_old:
            buf.copy_(_get(old, name, kind))
        dist.broadcast(buf, deg.new_rank[src_old])
        parts.append(buf)
        if info.shard_dim is None:
            break
    return parts[0] if info.shard_dim is None else torch.cat(parts, dim=info.shard_dim)


def _get(w: Worker, name: str, kind: str) -> torch.Tensor:
    if kind == "param":
        return w.params[name].detach()
    st = w.state[name]
    return st.m if kind == "m" else st.v


def _take(w: Worker, name: str, info: ParamInfo, kind: str, full: torch.Tensor) -> None:
    if name not in w.params:
        return
    piece = shard(full, info, w.role.tp_rank, w.role.tp)
    _get(w, name, kind).copy_(piece)


def train_elastic(rank: int, store: Any, layout: Layout, cfg: RunConfig, steps: int,
                  kill: tuple[int, int] | None = None) -> RankResult:
    """Train ``steps`` iterations, surviving lost ranks; ``kill=(rank, step)`` injects a loss.

    Returns this rank's losses, the list of steps it completed (``events``) and its final
    parameters; a rank the new plan leaves idle returns what it had when it left.
    """
    if layout.plan.zero:
        raise RuntimeGap("plan: recovery without disk needs zero=0 (ZeRO shards the moments)")
    if layout.plan.degree("ep") > 1:
        raise RuntimeGap(f"plan: recovery without disk needs ep=1, got ep="
                         f"{layout.plan.degree('ep')} (no replica holds every expert; "
                         "`hetpar run --checkpoint` recovers EP plans from disk)")
    stop = threading.Event()
    threading.Thread(target=_heartbeat, args=("127.0.0.1", store.port, rank, stop),
                     daemon=True).start()
    res = RankResult(rank)
    w = make_worker(layout, cfg)
    sched = schedule_for(layout, w.role.replica)
    step, gen, orig = 0, 0, list(range(layout.world_size))
    times: list[float] = []  # seconds of each completed step: the deadlines scale with them
    while step < steps:
        if kill is not None and gen == 0 and (rank, step) == kill:
            _die_mid_step(w)
        t0 = time.monotonic()
        try:
            res.losses.append(train_step(w, step, sched))
            times.append(time.monotonic() - t0)
            res.events.append(f"step {step}")
            step += 1
        except (RuntimeError, dist.DistBackendError) as e:
            gen += 1
            stale_s = adaptive(STALE_S, times)
            dead = _rendezvous(store, gen, rank, orig, wall_s=max(REFORM_S, 4 * stale_s),
                               stale_s=stale_s)
            deg = degrade(layout, dead)
            res.events.append(f"failure at step {step}: {type(e).__name__}; dead {sorted(dead)}")
            dist.destroy_process_group()
            if rank not in deg.new_rank:
                res.events.append("idle after re-forming")
                break
            dist.init_process_group("gloo", store=dist.PrefixStore(f"g{gen}/", store),
                                    rank=deg.new_rank[rank], world_size=len(deg.new_rank),
                                    timeout=timedelta(seconds=adaptive(cfg.timeout_s, times)))
            old, old_layout = w, layout
            layout = build_layout(deg.plan, layout.model, local_cluster(len(deg.new_rank)))
            w = make_worker(layout, cfg)
            _restore(w, old, old_layout, deg)
            sched = schedule_for(layout, w.role.replica)
            orig = [orig[o] for o in sorted(deg.new_rank)]
            rank = deg.new_rank[rank]
            res.events.append(f"resumed {time.monotonic() - t0:.2f} s after the step began")
    stop.set()
    res.params = {n: p.detach().clone() for n, p in w.params.items()}
    res.rank = rank
    return res


def _die_mid_step(w: Worker) -> None:
    """Arm a SIGKILL of this process inside the first forward of the step (mid-iteration)."""
    orig = w.forward

    def forward(chunk: int, x: torch.Tensor | None, mb: int) -> torch.Tensor:
        out = orig(chunk, x, mb)
        os.kill(os.getpid(), signal.SIGKILL)
        return out

    w.forward = forward  # type: ignore[method-assign]


