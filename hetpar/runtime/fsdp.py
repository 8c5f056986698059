"""ZeRO-3 through PyTorch's FSDP2 (``fully_shard``) for pure data-parallel plans.

The functional model is wrapped in one ``nn.Module`` per transformer block (plus embedding
and head) so ``fully_shard`` can gather one block's parameters at a time.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import nn

from hetpar.errors import ConfigError
from hetpar.runtime import model as M  # noqa: N812
from hetpar.runtime.data import global_batch, replica_rows
from hetpar.runtime.layout import Layout
from hetpar.runtime.optim import AdamState, adam_update
from hetpar.runtime.tp import SINGLE
from hetpar.runtime.trainer import RankResult
from hetpar.runtime.worker import RunConfig


def _local(t: torch.Tensor) -> torch.Tensor:
    """The local shard of an FSDP2 (DTensor) parameter or gradient."""
    from torch.distributed.tensor import DTensor

    assert isinstance(t, DTensor)
    return t.to_local()


class _Part(nn.Module):
    """A group of named parameters; ``tensors()`` gives them back under their model names."""

    def __init__(self, names: list[str], infos: dict[str, M.ParamInfo], cfg: RunConfig) -> None:
        super().__init__()
        self.names = names
        for n in names:
            t = M.init_param(n, infos[n], cfg.seed, cfg.dtype, cfg.device)
            self.register_parameter(n.replace(".", "__"), nn.Parameter(t))

    def tensors(self) -> dict[str, torch.Tensor]:
        return {n: getattr(self, n.replace(".", "__")) for n in self.names}


class _Embed(_Part):
    def forward(self, tokens: torch.Tensor, spec: object) -> torch.Tensor:
        return M.embed(spec, self.tensors(), tokens, SINGLE)  # type: ignore[arg-type]


class _Block(_Part):
    def __init__(self, i: int, recompute: str, *a: object) -> None:
        super().__init__(*a)  # type: ignore[arg-type]
        self.i, self.recompute = i, recompute

    def forward(self, x: torch.Tensor, spec: object) -> torch.Tensor:
        return M.blocks(spec, self.tensors(), range(self.i, self.i + 1), x,  # type: ignore[arg-type]
                        SINGLE, self.recompute)


class _Head(_Part):
    def forward(self, x: torch.Tensor, targets: torch.Tensor, spec: object,
                denom: int) -> torch.Tensor:
        return M.head_loss(spec, self.tensors(), x, targets, SINGLE, denom)  # type: ignore[arg-type]


class _Net(nn.Module):
    """Embedding, blocks and head in model order; FSDP2's root module."""

    def __init__(self, layout: Layout, cfg: RunConfig) -> None:
        super().__init__()
        m = self.spec = layout.model
        if m.tied_embeddings:
            raise ConfigError("plan: zero=3 (FSDP2) needs tied_embeddings = false")
        infos = M.param_infos(m, range(m.n_layers), True, True)
        emb: list[str] = [n for n in ("tok_emb", "pos_emb") if n in infos]
        head = [n for n in infos if n.startswith("lnf") or n == "head"]
        self.embed = _Embed(emb, infos, cfg)
        self.blocks = nn.ModuleList(
            _Block(i, layout.plan.recompute, [n for n in infos if n.startswith(f"layers.{i}.")],
                   infos, cfg)
            for i in range(m.n_layers)
        )
        self.head = _Head(head, infos, cfg)

    def forward(self, tokens: torch.Tensor, denom: int) -> torch.Tensor:
        x = self.embed(tokens[:, :-1], self.spec)
        for blk in self.blocks:
            x = blk(x, self.spec)
        out: torch.Tensor = self.head(x, tokens[:, 1:], self.spec, denom)
        return out


def train_fsdp(layout: Layout, cfg: RunConfig, steps: int) -> RankResult:
    """Train a pure-DP ``zero=3`` plan with FSDP2; parameters sharded over all ranks."""
    from torch.distributed.fsdp import fully_shard

    plan, m = layout.plan, layout.model
    if any(len(s) > 1 for r in layout.stage_ranks for s in r) or any(
        len(r) > 1 for r in layout.stage_ranks
    ):
        raise ConfigError("plan: zero=3 (FSDP2) is supported with tp=1, pp=1; allowed: dp only")
    rank = dist.get_rank()
    net = _Net(layout, cfg)
    sharded = [fully_shard(part) for part in [net.embed, *net.blocks, net.head]]
    sharded.append(fully_shard(net))
    for s in sharded:
        # Losses are already divided by the global token count; FSDP2 must sum, not average.
        s.set_gradient_divide_factor(1.0)
    state = {id(p): AdamState(_local(p)) for p in net.parameters()}
    batches = [r.batch for r in plan.replicas]
    a, b = replica_rows(batches, layout.roles[rank].replica)
    res = RankResult(rank)
    for step in range(steps):
        t0 = time.perf_counter()
        tokens = global_batch(m, step, plan.batch, m.seq_len, cfg.seed, cfg.device)[a:b]
        loss = net(tokens, plan.batch * m.seq_len)
        loss.backward()
        t = loss.detach().reshape(1).to(torch.float64)
        dist.all_reduce(t)
        with torch.no_grad():
            for p in net.parameters():
                assert p.grad is not None
                adam_update(_local(p), _local(p.grad), state[id(p)], step + 1, cfg.adam)
                p.grad = None
        res.losses.append(float(t.item()))
        res.step_times.append(time.perf_counter() - t0)
    for part in [net.embed, *net.blocks, net.head]:
        for n, p in part.tensors().items():
            res.params[n] = p.full_tensor().detach().clone()
    return res
