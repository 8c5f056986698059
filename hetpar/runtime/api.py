"""``run(model, plan, ...)``: train a plan on local forked ranks or inside a torchrun job."""

from __future__ import annotations

import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hetpar.errors import ConfigError, Infeasible
from hetpar.runtime import faults, ncclenv
from hetpar.runtime.launch import RankDied, agent_store, init_env, launch, open_store
from hetpar.runtime.layout import Layout, build_layout, check_buildable, check_zero3, local_cluster
from hetpar.runtime.manifest import Resume, resolve
from hetpar.runtime.trainer import RankResult, train_rank
from hetpar.runtime.worker import RunConfig
from hetpar.specs.cluster import ClusterSpec
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import Plan


@dataclass(frozen=True, kw_only=True)
class RunSummary:
    """Per-step global losses and rank-0 step times of a run."""

    world_size: int
    losses: tuple[float, ...]
    step_times_s: tuple[float, ...]
    first_step: int = 0
    """Step of ``losses[0]``: the checkpoint resumed from (or restarted from after a failure)."""
    recoveries: tuple[str, ...] = ()
    """One line per lost rank recovered from, in order."""
    reports: bool = True
    """Whether this process prints the run's summary (under torchrun: the group's rank 0)."""

    @property
    def median_step_s(self) -> float:
        """Median step time, skipping the first (warm-up) step when there are more."""
        t = self.step_times_s[1:] or self.step_times_s
        return statistics.median(t) if t else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"world_size": self.world_size, "first_step": self.first_step,
                "losses": list(self.losses), "step_times_s": list(self.step_times_s),
                "median_step_s": self.median_step_s, "recoveries": list(self.recoveries)}


class RunFailed(ConfigError):
    """Ranks were lost and the plan's failure policy cannot continue (one line)."""


class PeerLost(ConfigError):
    """Under torchrun, a collective failed because another worker died: one line, non-zero
    exit, and torchrun's elastic agent restarts the workers (``--max-restarts``)."""


# What gloo and NCCL raise in the survivors when a peer's process is gone (the peer's socket
# closes: gloo's tcp/pair.cc read/write errors; NCCL's DistBackendError).
_PEER_GONE = ("Connection reset by peer", "Connection closed by peer", "Broken pipe",
              "gloo/transport")


def _peer_lost(e: RuntimeError) -> bool:
    return isinstance(e, dist.DistBackendError) or any(m in str(e) for m in _PEER_GONE)


def _failure_time(store: Any, round_: int) -> float | None:
    """When a survivor of torchrun round ``round_`` saw a peer die (None if none wrote it,
    e.g. the store died with rank 0 when the agent does not host it)."""
    from hetpar.runtime.torchrun import FAILED_AT

    key = FAILED_AT.format(round=round_)
    if store is None or not store.check([key]):
        return None
    return float(store.get(key).decode())


def _rank_main(rank: int, store: Any, layout: Layout, cfg: RunConfig, steps: int,
               checkpoint: str | None, every: int, progress: bool, resume: int,
               failed_at: float | None) -> RankResult:
    if failed_at is not None:  # restarted after a failure: an injected fault has fired
        faults.disarm()
    res = train_rank(layout, cfg, steps, checkpoint=checkpoint, every=every, progress=progress,
                     resume=resume, failed_at=failed_at)
    res.params = {}  # do not ship parameters back through the pipe
    return res


def resume_point(checkpoint: str | None, steps: int) -> Resume | None:
    """The verified checkpoint a run resumes from; ConfigError if it is past ``steps``."""
    r = resolve(checkpoint) if checkpoint else None
    if r is not None and r.step > steps:
        raise ConfigError(f"--steps {steps} is below the step {r.step} of the checkpoint "
                          f"{r.path}; pass --steps > {r.step} (or another --checkpoint)")
    return r


def run(model: ModelSpec, plan: Plan, *, steps: int = 10, cluster: ClusterSpec | None = None,
        checkpoint: str | None = None, every: int = 0, cfg: RunConfig | None = None,
        progress: bool = False) -> RunSummary:
    """Train ``plan`` for ``steps`` iterations and return the losses and step times.

    Under torchrun (``WORLD_SIZE`` set) this process is one rank of the job and the world must
    match the plan; otherwise the plan's ranks are forked here, one process each, and a rank
    killed by a signal is recovered (see ``_supervise``).
    """
    cfg = cfg or RunConfig()
    faults.spec()  # a malformed HETPAR_FAULT is refused before any rank starts
    check_buildable(model)
    layout = build_layout(plan, model, cluster)
    check_zero3(layout)
    line = ncclenv.apply(layout.plan, "nccl" if cfg.device.startswith("cuda") else "gloo")
    if line and os.environ.get("RANK", "0") == "0":  # once per job, not once per rank
        print(f"hetpar run: {line}", file=sys.stderr)
    if "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1:
        return _under_torchrun(layout, cfg, steps, checkpoint, every, progress)
    r = resume_point(checkpoint, steps)
    if progress and r is not None:
        if r.note:
            print(f"hetpar run: {r.note}", file=sys.stderr)
        print(f"hetpar run: resuming from {r.path} step {r.step}", file=sys.stderr)
    if r is not None and r.step == steps:
        if progress:
            print(f"hetpar run: the checkpoint is at step {steps} already; nothing to train",
                  file=sys.stderr)
        return RunSummary(world_size=layout.world_size, losses=(), step_times_s=(),
                          first_step=steps)
    return _supervise(layout, cfg, steps, checkpoint, every, progress, r.step if r else 0)


def _supervise(layout: Layout, cfg: RunConfig, steps: int, checkpoint: str | None, every: int,
               progress: bool, start: int) -> RunSummary:
    """Fork the ranks; when one dies by a signal, stop the others, derive the degraded plan
    (``plan.on_failure``: NTP shrink or drop) and restart the survivors from the last
    verified checkpoint (step 0 without one). The reference for the result is therefore the
    run of the degraded plan from that checkpoint (docs/runtime.md, "Losing a rank")."""
    backend = "nccl" if cfg.device.startswith("cuda") else "gloo"
    _preload(layout, checkpoint)
    recoveries: list[str] = []
    failed_at: float | None = None
    while True:
        try:
            results = launch(_rank_main, layout.world_size, layout, cfg, steps, checkpoint,
                             every, progress, start, failed_at, timeout_s=cfg.timeout_s,
                             wall_s=max(600.0, steps * 60.0), backend=backend,
                             on_start=_announce if progress else None)
            break
        except RankDied as e:
            failed_at = time.time()
            layout, start, line = _degraded(layout, e, checkpoint, len(recoveries) + 1)
            recoveries.append(line)
            if progress:
                print(f"hetpar run: {line}", file=sys.stderr, flush=True)
    r0 = results[0]
    return RunSummary(world_size=layout.world_size, losses=tuple(r0.losses),
                      step_times_s=tuple(max(r.step_times[i] for r in results)
                                         for i in range(len(r0.step_times))),
                      first_step=start, recoveries=tuple(recoveries))


def _preload(layout: Layout, checkpoint: str | None) -> None:
    """Import here, once, the modules every forked rank would import on its own.

    DCP (``runtime/checkpoint.py``, and FSDP2 for zero 3) pulls in DTensor and sympy: about
    1 s of CPU per process, paid by each rank of each launch (a restart forks again), where
    the forked ranks inherit what this process has already loaded."""
    if checkpoint:
        import hetpar.runtime.checkpoint  # noqa: F401
    if layout.plan.zero == 3:
        import hetpar.runtime.fsdp  # noqa: F401


def _announce(pids: list[int]) -> None:
    print(f"hetpar run: forked {len(pids)} local rank(s), pids "
          + " ".join(map(str, pids)), file=sys.stderr, flush=True)


def _degraded(layout: Layout, e: RankDied, checkpoint: str | None,
              n: int) -> tuple[Layout, int, str]:
    """The layout, start step and report line after ranks ``e.dead`` are lost."""
    from hetpar.runtime.elastic import degrade

    try:
        deg = degrade(layout, set(e.dead), need_donor=False)
    except Infeasible as err:
        raise RunFailed(f"run: {e}; cannot continue ({err.reason})") from None
    new = build_layout(deg.plan, layout.model, local_cluster(len(deg.new_rank)))
    r = resolve(checkpoint) if checkpoint else None
    start = r.step if r else 0
    where = (f"{r.path} step {start}" if r else
             "step 0 (no checkpoint saved yet)" if checkpoint else "step 0 (no --checkpoint)")
    tps = "+".join(str(rep.stages[0].tp) for rep in deg.plan.replicas)
    line = (f"{e}; on_failure={layout.plan.on_failure}: continuing on {new.world_size} "
            f"rank(s), {new.replicas} replica(s) at tp {tps}, resuming from {where}")
    if checkpoint:
        from hetpar.failures.ntp_plan import write_plan

        path = Path(checkpoint) / f"plan-after-failure-{n}.toml"
        write_plan(deg.plan, path)
        line += f"; degraded plan written to {path}"
    return new, start, line


def _under_torchrun(layout: Layout, cfg: RunConfig, steps: int, checkpoint: str | None,
                    every: int, progress: bool) -> RunSummary:
    """This process is one rank of a torchrun job (its elastic agent restarts failed jobs).

    After a restart the workers a failure took sit out and the rest continue on the degraded
    plan (``runtime/torchrun.py``), from the last verified checkpoint, as the forked
    launcher does; without the agent's store (it then dies with rank 0) the same plan
    restarts."""
    from hetpar.runtime import torchrun as tr

    world = int(os.environ["WORLD_SIZE"])
    if world != layout.world_size:
        raise ConfigError(f"plan needs {layout.world_size} ranks, torchrun started {world}")
    backend = "nccl" if cfg.device.startswith("cuda") else "gloo"
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if restart > 0:  # the agent restarted the workers: an injected fault has fired
        faults.disarm()
    rank = int(os.environ.get("RANK", "0"))
    store, lin = None, tr.Lineage(layout=layout, ranks={k: k for k in range(world)})
    if not dist.is_initialized() and tr.under_torchelastic():
        store = open_store(cfg.timeout_s)
        if agent_store():
            lin = tr.lineage(layout, store, restart, world)
    if rank not in lin.ranks:
        if progress:
            print(f"hetpar run: torchrun rank {rank} was lost in round "
                  f"{lin.failures[-1][0]}; its slot sits this round out", file=sys.stderr)
        return RunSummary(world_size=lin.layout.world_size, losses=(), step_times_s=(),
                          reports=False)
    if not dist.is_initialized():
        init_env(backend, cfg.timeout_s, store=store, rank=lin.ranks[rank],
                 world=lin.layout.world_size)
    tr.register(store, restart, rank)
    layout = lin.layout
    r = resume_point(checkpoint, steps)
    recoveries = tr.recovery_lines(lin, checkpoint, r, write=dist.get_rank() == 0)
    if progress and dist.get_rank() == 0:
        for line in recoveries:
            print(f"hetpar run: {line}", file=sys.stderr)
        if r is not None:
            if r.note:
                print(f"hetpar run: {r.note}", file=sys.stderr)
            print(f"hetpar run: resuming from {r.path} step {r.step}", file=sys.stderr)
    failed_at = _failure_time(store, restart - 1) if restart > 0 else None
    if cfg.device.startswith("cuda"):
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    pids: list[Any] = [None] * layout.world_size
    dist.all_gather_object(pids, os.getpid())
    if progress and dist.get_rank() == 0:
        print(f"hetpar run: torchrun round {restart}, rank pids " + " ".join(map(str, pids)),
              file=sys.stderr, flush=True)
    try:
        res = train_rank(layout, cfg, steps, checkpoint=checkpoint, every=every,
                         progress=progress, resume=r.step if r else 0, failed_at=failed_at)
    except RuntimeError as e:
        if not _peer_lost(e):
            raise
        tr.mark_alive()
        why = next((m for m in _PEER_GONE[:3] if m in str(e)), type(e).__name__)
        raise PeerLost(f"run: torchrun rank {rank} lost a peer ({why}); "
                       "exiting so that the elastic agent restarts the workers "
                       "(--max-restarts) from the last checkpoint") from None
    reports = dist.get_rank() == 0
    # Leave the group before the interpreter exits: a gloo group torn down by static
    # destructors can abort the process ("terminate called without an active exception",
    # SIGABRT) while its peer still shuts down, and the agent then reports a failed job.
    dist.barrier()
    dist.destroy_process_group()
    return RunSummary(world_size=layout.world_size, losses=tuple(res.losses),
                      step_times_s=tuple(res.step_times), first_step=r.step if r else 0,
                      recoveries=tuple(recoveries), reports=reports)
