"""Starting ranks: forked from the calling process (tests, local runs) or torchrun's env://."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import signal
import socket
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

ERROR_GRACE_S = 3.0
"""After one rank fails, how long the others get to report before they are killed."""


class LaunchError(RuntimeError):
    """A forked rank failed (its traceback is in the message) or the launch timed out."""


def init_env(backend: str = "gloo", timeout_s: float = 30.0) -> None:
    """Join the job torchrun started (``env://``: MASTER_ADDR, RANK, WORLD_SIZE...)."""
    dist.init_process_group(backend, init_method="env://", timeout=timedelta(seconds=timeout_s))


def _die_with_parent() -> None:
    """Linux: SIGKILL this rank when the launching process dies (no orphaned ranks)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _child(fn: Callable[..., Any], rank: int, world: int, port: int, timeout_s: float,
           args: tuple[Any, ...], conn: Any, backend: str) -> None:
    torch.set_num_threads(1)
    _die_with_parent()
    try:
        store = dist.TCPStore("127.0.0.1", port, world + 1, is_master=False,
                              timeout=timedelta(seconds=60))
        if backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        dist.init_process_group(backend, store=dist.PrefixStore("g0/", store), rank=rank,
                                world_size=world, timeout=timedelta(seconds=timeout_s))
        out = fn(rank, store, *args)
        conn.send(("ok", pickle.dumps(out)))
    except BaseException:  # noqa: BLE001 -- report any failure to the parent, then exit
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()
        os._exit(0)


def launch(fn: Callable[..., Any], world: int, *args: Any, timeout_s: float = 10.0,
           wall_s: float = 300.0, expect_killed: tuple[int, ...] = (),
           backend: str = "gloo") -> list[Any]:
    """Run ``fn(rank, store, *args)`` on ``world`` forked ranks; return their results by rank.

    The parent hosts the TCP store, so it outlives any rank (the recovery tests kill one).
    ``timeout_s`` bounds every collective, so a hang fails fast; ``wall_s`` bounds the run.
    Ranks in ``expect_killed`` may die by SIGKILL; their result is None.
    """
    torch.set_num_threads(1)  # fork-safety: no OpenMP pool in the parent to inherit
    ctx = mp.get_context("fork")
    # Fork before the parent starts the store's server thread: a child forked while another
    # thread holds a lock (malloc, logging) can deadlock. Children retry until it is up.
    port = free_port()
    procs, conns = [], []
    for rank in range(world):
        recv, send = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_child, args=(fn, rank, world, port, timeout_s, args, send, backend))
        p.start()
        send.close()
        procs.append(p)
        conns.append(recv)
    store = dist.TCPStore("127.0.0.1", port, world + 1, is_master=True,
                          timeout=timedelta(seconds=60), wait_for_workers=False)
    try:
        return _collect(procs, conns, wall_s, expect_killed)
    finally:
        for p in procs:
            if p.is_alive() and p.pid is not None:
                os.kill(p.pid, signal.SIGKILL)
            p.join()
        del store


def free_port() -> int:
    """A TCP port that is free now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _collect(procs: list[Any], conns: list[Any], wall_s: float,
             expect_killed: tuple[int, ...]) -> list[Any]:
    """Gather every rank's result; after the first failure wait only ``ERROR_GRACE_S`` more."""
    import time
    from multiprocessing.connection import wait

    deadline = time.monotonic() + wall_s
    results: list[Any] = [None] * len(procs)
    errors: list[str] = []
    pending = dict(enumerate(conns))
    while pending:
        left = deadline - time.monotonic()
        if errors:
            left = min(left, ERROR_GRACE_S)
        ready = wait(list(pending.values()), timeout=max(left, 0.0))
        if not ready:
            break
        for rank in [r for r, c in pending.items() if c in ready]:
            c = pending.pop(rank)
            try:
                status, payload = c.recv()
            except EOFError:
                if rank not in expect_killed:
                    procs[rank].join(1)
                    errors.append(f"rank {rank} died (exit code {procs[rank].exitcode})")
                continue
            if status == "ok":
                results[rank] = pickle.loads(payload)
            else:
                errors.append(f"rank {rank}:\n{payload}")
    silent = [r for r in pending if r not in expect_killed]
    if silent and not errors:
        errors.append(f"ranks {silent} gave no result within {wall_s:.0f} s")
    if errors:
        raise LaunchError("\n".join(errors))
    return results
