"""``run(model, plan, ...)``: train a plan on local forked ranks or inside a torchrun job."""

from __future__ import annotations

import os
import statistics
import sys
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from hetpar.runtime.launch import init_env, launch
from hetpar.runtime.layout import Layout, build_layout
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

    @property
    def median_step_s(self) -> float:
        """Median step time, skipping the first (warm-up) step when there are more."""
        t = self.step_times_s[1:] or self.step_times_s
        return statistics.median(t) if t else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"world_size": self.world_size, "losses": list(self.losses),
                "step_times_s": list(self.step_times_s), "median_step_s": self.median_step_s}


def _rank_main(rank: int, store: Any, layout: Layout, cfg: RunConfig, steps: int,
               checkpoint: str | None, every: int, progress: bool) -> RankResult:
    res = train_rank(layout, cfg, steps, checkpoint=checkpoint, every=every, progress=progress)
    res.params = {}  # do not ship parameters back through the pipe
    return res


def run(model: ModelSpec, plan: Plan, *, steps: int = 10, cluster: ClusterSpec | None = None,
        checkpoint: str | None = None, every: int = 0, cfg: RunConfig | None = None,
        progress: bool = False) -> RunSummary:
    """Train ``plan`` for ``steps`` iterations and return the losses and step times.

    Under torchrun (``WORLD_SIZE`` set) this process is one rank of the job and the world must
    match the plan; otherwise the plan's ranks are forked here, one process each.
    """
    cfg = cfg or RunConfig()
    layout = build_layout(plan, model, cluster)
    if "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1:
        world = int(os.environ["WORLD_SIZE"])
        if world != layout.world_size:
            from hetpar.errors import ConfigError

            raise ConfigError(f"plan needs {layout.world_size} ranks, torchrun started {world}")
        if not dist.is_initialized():
            init_env("nccl" if cfg.device.startswith("cuda") else "gloo", cfg.timeout_s)
        if cfg.device.startswith("cuda"):
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        res = train_rank(layout, cfg, steps, checkpoint=checkpoint, every=every,
                         progress=progress)
        return RunSummary(world_size=world, losses=tuple(res.losses),
                          step_times_s=tuple(res.step_times))
    if progress:
        print(f"hetpar run: forking {layout.world_size} local rank(s)", file=sys.stderr)
    results = launch(_rank_main, layout.world_size, layout, cfg, steps, checkpoint, every,
                     progress, timeout_s=cfg.timeout_s, wall_s=max(600.0, steps * 60.0),
                     backend="nccl" if cfg.device.startswith("cuda") else "gloo")
    r0 = results[0]
    return RunSummary(world_size=layout.world_size, losses=tuple(r0.losses),
                      step_times_s=tuple(max(r.step_times[i] for r in results)
                                         for i in range(len(r0.step_times))))
