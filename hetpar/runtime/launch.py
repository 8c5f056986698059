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

from hetpar.errors import ConfigError, Infeasible

ERROR_GRACE_S = 3.0
"""After one rank fails, how long the others get to report before they are killed."""


class LaunchError(RuntimeError):
    """A forked rank failed (its traceback is in the message) or the launch timed out."""


class RankDied(LaunchError):
    """Ranks died by a signal (SIGKILL, the OOM killer); the launcher stopped the others."""

    def __init__(self, dead: dict[int, int], detail: str = "") -> None:
        names = ", ".join(f"rank {r} ({_signame(s)})" for r, s in sorted(dead.items()))
        super().__init__(f"{names} died" + (f"; {detail}" if detail else ""))
        self.dead = dead
        """Rank -> the signal number that ended it."""


def _signame(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def init_env(backend: str = "gloo", timeout_s: float = 30.0, *, store: Any = None,
             rank: int | None = None, world: int | None = None) -> Any:
    """Join the job torchrun started (``env://``: MASTER_ADDR, RANK, WORLD_SIZE...).

    When torchrun's elastic agent restarts the workers (``--max-restarts``) its store still
    holds the previous round's addresses, which gloo would dial; each round therefore
    rendezvouses under its own prefix (``TORCHELASTIC_RESTART_COUNT``). ``store``, ``rank``
    and ``world`` (from ``open_store`` and the failure lineage) let the survivors of a lost
    worker form a smaller group. Returns the shared store (it outlives a round when the
    agent hosts it), or None outside torchelastic.
    """
    timeout = timedelta(seconds=timeout_s)
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if restart is None:
        dist.init_process_group(backend, init_method="env://", timeout=timeout)
        return None
    store = store if store is not None else open_store(timeout_s)
    rank = int(os.environ["RANK"]) if rank is None else rank
    world = int(os.environ["WORLD_SIZE"]) if world is None else world
    dist.init_process_group(backend, store=dist.PrefixStore(f"hetpar/round{restart}/", store),
                            rank=rank, world_size=world, timeout=timeout)
    return store


def open_store(timeout_s: float = 30.0) -> Any:
    """The TCP store of a torchelastic job (the agent's when it hosts one, else rank 0's)."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                         is_master=not agent_store() and rank == 0,
                         timeout=timedelta(seconds=timeout_s))


def agent_store() -> bool:
    """Whether torchrun's agent hosts the store (it then outlives every worker)."""
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"


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
    except (ConfigError, Infeasible) as e:
        # Expected failures (bad checkpoint, non-finite loss, infeasible plan) cross the pipe
        # as themselves, so the command line prints them as one line.
        conn.send(("config", _portable(e)))
    except BaseException:  # noqa: BLE001 -- report any failure to the parent, then exit
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()
        os._exit(0)


def launch(fn: Callable[..., Any], world: int, *args: Any, timeout_s: float = 10.0,
           wall_s: float = 300.0, expect_killed: tuple[int, ...] = (),
           backend: str = "gloo", on_start: Callable[[list[int]], None] | None = None,
           ) -> list[Any]:
    """Run ``fn(rank, store, *args)`` on ``world`` forked ranks; return their results by rank.

    The parent hosts the TCP store, so it outlives any rank (the recovery tests kill one).
    ``timeout_s`` bounds every collective, so a hang fails fast; ``wall_s`` bounds the run.
    Ranks in ``expect_killed`` may die by SIGKILL; their result is None. ``on_start`` gets
    the ranks' process ids once they are forked.
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
    if on_start is not None:
        on_start([p.pid for p in procs if p.pid is not None])
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


def _portable(e: Exception) -> tuple[str, tuple[str, ...]]:
    if isinstance(e, Infeasible):
        return ("infeasible", (e.kind, e.reason))
    return ("config", (str(e),))


def _revive(payload: tuple[str, tuple[str, ...]], cls: type[ConfigError]) -> Exception:
    kind, args = payload
    if kind == "infeasible":
        return Infeasible(*args)
    return cls(*args)


def free_port() -> int:
    """A TCP port that is free now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _collect(procs: list[Any], conns: list[Any], wall_s: float,
             expect_killed: tuple[int, ...]) -> list[Any]:
    """Gather every rank's result; after the first failure wait only ``ERROR_GRACE_S`` more.

    A rank killed by a signal (and not expected to be) raises ``RankDied`` at once, so a
    supervisor can restart; a rank's ConfigError or Infeasible is re-raised as itself.
    """
    import time
    from multiprocessing.connection import wait

    deadline = time.monotonic() + wall_s
    results: list[Any] = [None] * len(procs)
    errors: list[str] = []
    expected: list[Exception] = []
    pending = dict(enumerate(conns))
    while pending:
        left = deadline - time.monotonic()
        if errors or expected:
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
                    code = procs[rank].exitcode
                    if code is not None and code < 0:
                        raise RankDied({rank: -code}) from None
                    errors.append(f"rank {rank} died (exit code {code})")
                continue
            if status == "ok":
                results[rank] = pickle.loads(payload)
            elif status == "config":
                expected.append(_revive(payload, ConfigError))
            else:
                errors.append(f"rank {rank}:\n{payload}")
    dead = {r: -p.exitcode for r, p in enumerate(procs) if results[r] is None
            and r not in expect_killed and p.exitcode is not None and p.exitcode < 0}
    if dead:
        raise RankDied(dead)
    if expected:
        raise expected[0]
    silent = [r for r in pending if r not in expect_killed]
    if silent and not errors:
        errors.append(f"ranks {silent} gave no result within {wall_s:.0f} s")
    if errors:
        raise LaunchError("\n".join(errors))
    return results
