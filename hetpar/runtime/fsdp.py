"""ZeRO-3 through PyTorch's FSDP2 (``fully_shard``) for pure data-parallel plans.

The functional model is wrapped in one ``nn.Module`` per transformer block (plus embedding
and head) so ``fully_shard`` can gather one block's parameters at a time.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn

from hetpar.errors import RuntimeGap
from hetpar.runtime import model as M  # noqa: N812
from hetpar.runtime.data import global_batch, replica_rows
from hetpar.runtime.layout import Layout, check_zero3
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
            raise RuntimeGap("plan: zero=3 (FSDP2) needs tied_embeddings = false")
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


def _ckpt_state(net: nn.Module, state: dict[int, AdamState],
                step: torch.Tensor) -> dict[str, Any]:
    """Parameters and Adam moments as DTensors sharded like FSDP2's (DCP saves each shard)."""
    from torch.distributed.tensor import DTensor

    out: dict[str, Any] = {"step": step}
    for n, p in net.named_parameters():
        assert isinstance(p, DTensor)
        out["param|" + n] = p
        st = state[id(p)]
        for kind, t in (("m", st.m), ("v", st.v)):
            out[f"{kind}|{n}"] = DTensor.from_local(t, p.device_mesh, p.placements,
                                                    run_check=False, shape=p.shape,
                                                    stride=p.stride())
    return out


def _hybrid_mesh(layout: Layout, device: str) -> Any:
    """``zero_scope = "group"``: a 2-D (dp_replicate, dp_shard) mesh, one row per node group,
    so FSDP2 shards inside each node group and all-reduces the shards across the rows (its
    HSDP); None (FSDP2's default 1-D mesh over all ranks) otherwise."""
    from torch.distributed.device_mesh import DeviceMesh

    rows: dict[str, list[int]] = {}
    for r, g in enumerate(layout.node_groups):
        rows.setdefault(g, []).append(r)
    if layout.plan.zero_scope != "group" or len(rows) < 2:
        return None
    sizes = {g: len(v) for g, v in rows.items()}
    if len(set(sizes.values())) > 1:
        raise RuntimeGap(f"plan: zero=3 with zero_scope='group' (FSDP2 HSDP) needs as many "
                         f"ranks on every node group, got {sizes}; allowed: zero 1 or 2, or "
                         "zero_scope 'all'")
    return DeviceMesh(device.split(":")[0], list(rows.values()),
                      mesh_dim_names=("dp_replicate", "dp_shard"))


def _two_level(sharded: list[Any], layout: Layout, mesh: Any, timeout_s: float) -> None:
    """``dp_sync = "hierarchical"``: FSDP2's all-gathers and reduce-scatters in two levels
    over its shard group (all ranks, or a node group's row of the HSDP mesh)."""
    from hetpar.runtime.fsdp_comms import HierAllGather, HierReduceScatter, NodeGroups

    rows: set[tuple[int, ...]] = ({tuple(range(layout.world_size))} if mesh is None else
                                  {tuple(sorted(int(r) for r in row))
                                   for row in mesh.mesh.tolist()})
    groups = NodeGroups(rows, layout.nodes, timeout_s)
    for s in sharded:
        s.set_custom_all_gather(HierAllGather(groups, layout.nodes))
        s.set_custom_reduce_scatter(HierReduceScatter(groups, layout.nodes))


def _accumulate(net: _Net, sharded: list[Any], tokens: torch.Tensor, mb: int, denom: int,
                *, hsdp: bool) -> torch.Tensor:
    """Forward and backward of each micro-batch of ``mb`` rows; the summed loss.

    FSDP2 gathers each block's weights in every micro-batch's forward and backward and
    reduce-scatters its gradient after every backward (accumulating the shards), what
    ``sim/chunk.py`` ``_fsdp_comm`` prices per micro-batch; under HSDP the shards' all-reduce
    across node groups waits for the last micro-batch (``set_requires_all_reduce``), once per
    iteration as ``sim/structure.py`` ``_cross_sync`` prices it.
    """
    n = tokens.shape[0] // mb
    total = tokens.new_zeros((), dtype=torch.float64)
    for i in range(n):
        if hsdp:
            for s in sharded:
                s.set_requires_all_reduce(i == n - 1)
        loss = net(tokens[i * mb: (i + 1) * mb], denom)
        loss.backward()
        total = total + loss.detach().to(torch.float64)
    return total


def train_fsdp(layout: Layout, cfg: RunConfig, steps: int, checkpoint: str | None = None,
               every: int = 0, start: int = 0, progress: bool = False,
               failed_at: float | None = None) -> RankResult:
    """Train a pure-DP ``zero=3`` plan with FSDP2; parameters sharded over all ranks, or
    with ``zero_scope = "group"`` over each node group's ranks (``_hybrid_mesh``).

    With ``checkpoint``, resume from step ``start`` saved there and save every ``every``
    steps and at the end, through DCP with DTensor shards (which DCP reshards on load, so
    a run on fewer ranks resumes them).
    """
    from torch.distributed.fsdp import fully_shard

    from hetpar.runtime import checkpoint as ck
    from hetpar.runtime.manifest import step_dir
    from hetpar.runtime.trainer import check_loss, report_step

    plan, m = layout.plan, layout.model
    check_zero3(layout)
    rank = dist.get_rank()
    net = _Net(layout, cfg)
    mesh = _hybrid_mesh(layout, cfg.device)
    sharded = [fully_shard(part, mesh=mesh) for part in [net.embed, *net.blocks, net.head]]
    sharded.append(fully_shard(net, mesh=mesh))
    for s in sharded:
        # Losses are already divided by the global token count; FSDP2 must sum, not average.
        s.set_gradient_divide_factor(1.0)
        # float32 would otherwise use PREMUL_SUM, which gloo lacks; a plain SUM is exact.
        s.set_force_sum_reduction_for_comms(True)
    if layout.hierarchical:
        _two_level(sharded, layout, mesh, cfg.timeout_s)
    state = {id(p): AdamState(_local(p)) for p in net.parameters()}
    batches = [r.batch for r in plan.replicas]
    a, b = replica_rows(batches, layout.roles[rank].replica)
    mb = plan.replicas[layout.roles[rank].replica].micro_batch
    res = RankResult(rank)
    if checkpoint and start:
        saved = _ckpt_state(net, state, torch.zeros(1, dtype=torch.int64))
        dcp.load(saved, checkpoint_id=str(step_dir(checkpoint, start)))
        assert int(saved["step"].item()) == start
    else:
        start = 0
    for step in range(start, steps):
        t0 = time.perf_counter()
        tokens = global_batch(m, step, plan.batch, m.seq_len, cfg.seed, cfg.device)[a:b]
        loss = _accumulate(net, sharded, tokens, mb, plan.batch * m.seq_len, hsdp=mesh is not None)
        t = loss.reshape(1).to(torch.float64)
        dist.all_reduce(t)
        apply = check_loss(float(t.item()), step, cfg)
        with torch.no_grad():
            for p in net.parameters():
                assert p.grad is not None
                if apply:
                    adam_update(_local(p), _local(p.grad), state[id(p)], step + 1, cfg.adam)
                p.grad = None
        res.losses.append(float(t.item()))
        res.step_times.append(time.perf_counter() - t0)
        if rank == 0:
            report_step(step, res, progress, failed_at if step == start else None)
        if checkpoint and ((every and (step + 1) % every == 0) or step + 1 == steps):
            ck.save_state(_ckpt_state(net, state, torch.tensor([step + 1])), checkpoint,
                          step + 1, cfg.keep)
    for part in [net.embed, *net.blocks, net.head]:
        for n, p in part.tensors().items():
            res.params[n] = p.full_tensor().detach().clone()
    return res
