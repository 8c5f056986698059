"""One rank's share of the model: its chunks' parameters (TP shards), forward, sync and update."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from hetpar.runtime import hybrid
from hetpar.runtime import model as M  # noqa: N812
from hetpar.runtime.gradsync import (
    Bucket,
    all_infos,
    all_reduce_buckets,
    pack,
    plan_buckets,
    unpack,
)
from hetpar.runtime.groups import Groups
from hetpar.runtime.hybrid import Shard, shard_of
from hetpar.runtime.layout import Layout, RankRole
from hetpar.runtime.moe import EPContext
from hetpar.runtime.optim import AdamConfig, AdamState, adam_update
from hetpar.runtime.pipeline import ChunkRunner
from hetpar.runtime.tp import TPContext


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """Numerics of a run (dtype, seed, optimizer, bucket size, collective timeout) and its
    policies: what a non-finite loss does, how many checkpoints are kept."""

    dtype: torch.dtype = torch.float64
    seed: int = 0
    adam: AdamConfig = AdamConfig()
    bucket_mib: float = 4.0
    timeout_s: float = 10.0
    device: str = "cpu"
    pp_engine: Literal["hetpar", "torch"] = "hetpar"
    """Pipeline executor: hetpar's p2p executor or torch.distributed.pipelining (tp = 1)."""
    on_nan: Literal["stop", "skip"] = "stop"
    """A NaN/inf global loss stops the run (before the update) or skips that step's update."""
    keep: int = 0
    """Checkpoint steps kept on disk (0: all)."""


class Worker(ChunkRunner):
    """Parameters and optimizer state of one rank; runs forward for its chunks."""

    def __init__(self, layout: Layout, role: RankRole, groups: Groups, cfg: RunConfig) -> None:
        self.layout, self.role, self.cfg = layout, role, cfg
        self.model = layout.model
        self.device = torch.device(cfg.device)
        rep = layout.plan.replicas[role.replica]
        self.num_chunks = len(layout.stage_ranks[role.replica])
        self.tp_ranks = layout.stage_ranks[role.replica][role.pp_rank]
        group = groups.get(self.tp_ranks) if role.tp > 1 else None
        self.ctx = TPContext(group, role.tp, role.tp_rank, layout.plan.sequence_parallel)
        self.micro_batch = rep.micro_batch
        self.infos = all_infos(layout)
        experts = layout.experts_of(role.rank)
        ep_ranks = layout.ep_ranks(role.rank)
        self.ep = EPContext(groups.get(ep_ranks) if len(ep_ranks) > 1 else None,
                            len(ep_ranks), experts[0] if experts else 0, layout.expert_counts)
        self.chunk_names: dict[int, list[str]] = {}
        self.params: dict[str, torch.Tensor] = {}
        for c in role.chunks:
            a, b = rep.stages[c].layers
            names = list(M.param_infos(self.model, range(a, b), c == 0,
                                       c == self.num_chunks - 1, experts))
            self.chunk_names[c] = names
            for n in names:
                if n not in self.params:
                    full = M.init_param(n, self.infos[n], cfg.seed, cfg.dtype, self.device)
                    self.params[n] = M.shard(full, self.infos[n], role.tp_rank, role.tp)
                    self.params[n].requires_grad_(True)
        self.grads = {n: torch.zeros_like(p) for n, p in self.params.items()}
        itemsize = torch.empty((), dtype=cfg.dtype).element_size()
        numel = int(cfg.bucket_mib * 2**20 / itemsize)
        self.buckets = plan_buckets(layout, role.rank, numel)
        self.groups = groups
        # ZeRO-1 and -2 alike: each bucket's gradient is reduce-scattered over the ZeRO group
        # (the simulator prices both so, sim/structure.py _dp_sync); ZeRO-2's gradient sharding
        # is not reproduced (the full gradient buffer is kept; the arithmetic is the same).
        self.zero = layout.plan.zero in (1, 2)
        self.zero_buckets = [b for b in self.buckets if self.zero]
        self.shards = [shard_of(layout, b, role.rank) for b in self.zero_buckets]
        zb_names = {e.name for b in self.zero_buckets for e in b.entries}
        self.state = {n: AdamState(p) for n, p in self.params.items() if n not in zb_names}
        self.zero_state = [AdamState(torch.zeros(sh.per, dtype=cfg.dtype, device=self.device))
                           for sh in self.shards]
        self.tokens: torch.Tensor | None = None
        self.denom = 1
        self.step = 0

    # -- ChunkRunner -------------------------------------------------------------------------
    def forward(self, chunk: int, x: torch.Tensor | None, mb: int) -> torch.Tensor:
        assert self.tokens is not None
        rows = self.tokens[mb * self.micro_batch: (mb + 1) * self.micro_batch]
        a, b = self.layout.stage_layers(self.role.replica, chunk)
        if chunk == 0:
            x = M.embed(self.model, self.params, rows[:, :-1], self.ctx)
        assert x is not None
        x = M.blocks(self.model, self.params, range(a, b), x, self.ctx,
                     self.layout.plan.recompute, self.ep)
        if chunk == self.num_chunks - 1:
            return M.head_loss(self.model, self.params, x, rows[:, 1:], self.ctx, self.denom)
        return x

    def chunk_params(self, chunk: int) -> list[tuple[str, torch.Tensor]]:
        return [(n, self.params[n]) for n in self.chunk_names[chunk]]

    def peer(self, chunk: int) -> int | None:
        stages = self.layout.stage_ranks[self.role.replica]
        return stages[chunk][self.role.tp_rank] if 0 <= chunk < len(stages) else None

    def act_shape(self) -> tuple[int, ...]:
        s = self.tokens.shape[1] - 1 if self.tokens is not None else self.model.seq_len
        if self.ctx.sp:
            s //= self.ctx.size
        return (self.micro_batch, s, self.model.hidden)

    # -- step --------------------------------------------------------------------------------
    def zero_grads(self) -> None:
        for g in self.grads.values():
            g.zero_()

    def reduce_grads(self) -> list[torch.Tensor]:
        """Sum gradients over replicas in buckets; returns, per bucket, the reduced flat
        buffer, or under ZeRO this rank's reduced shard of it (``hybrid.reduce``: a
        reduce-scatter, the gradients of that bucket stay local). Under ``dp_sync =
        "hierarchical"`` every collective goes in two levels (``hiersync``)."""
        nodes = self.layout.nodes if self.layout.hierarchical else None
        sharded = {id(b): sh for b, sh in zip(self.zero_buckets, self.shards, strict=True)}
        plain = [b for b in self.buckets if id(b) not in sharded]
        out = dict(zip(map(id, plain), all_reduce_buckets(plain, self.grads, self.infos,
                                                          self.groups, nodes), strict=True))
        for b in self.zero_buckets:
            out[id(b)] = hybrid.reduce(sharded[id(b)], pack(b, self.grads, self.infos),
                                       self.groups, nodes)
        return [out[id(b)] for b in self.buckets]

    def update(self, flats: list[torch.Tensor]) -> None:
        """One Adam step on every parameter (ZeRO-1 sharded where enabled)."""
        self.step += 1
        for n, st in self.state.items():
            adam_update(self.params[n].data, self.grads[n], st, self.step, self.cfg.adam)
        by_bucket = {id(b): f for b, f in zip(self.buckets, flats, strict=True)}
        for b, sh, st in zip(self.zero_buckets, self.shards, self.zero_state, strict=True):
            self._zero_update(b, sh, by_bucket[id(b)], st)

    def _zero_update(self, b: Bucket, sh: Shard, grad: torch.Tensor, st: AdamState) -> None:
        # ZeRO-1 (Rajbhandari et al. 2020, sec. 5.1): each of the n ranks of the ZeRO group
        # keeps Adam state for 1/n of the flat buffer, updates that slice, and the slices are
        # all-gathered back (inside the node group under hybrid sharding).
        full_infos = self.infos
        pflat = pack(b, {n: p.detach() for n, p in self.params.items()}, full_infos, force=True)
        mine = sh.slice(pflat)
        adam_update(mine, grad, st, self.step, self.cfg.adam)
        nodes = self.layout.nodes if self.layout.hierarchical else None
        new = hybrid.gather(sh, mine, self.groups, nodes)[: b.numel]
        with torch.no_grad():
            unpack(b, new, {n: p.detach() for n, p in self.params.items()}, full_infos)


