"""FSDP2's all-gather and reduce-scatter in two levels under ``dp_sync = "hierarchical"``.

FSDP2 (``fully_shard``) issues one flat all-gather of the parameters and one flat
reduce-scatter of the gradients per wrapped block over its shard group; with the plan's
``dp_sync = "hierarchical"`` the simulator prices both level by level
(``net.collectives.hierarchical``: inside the node the whole message, across nodes only a
node's shard). FSDP2 lets a caller replace its collectives (``FSDPModule.set_custom_all_gather``
/ ``set_custom_reduce_scatter``: an object with ``allocate`` and ``__call__``); these run
``hiersync``'s two-level forms, which keep the flat calls' rank-major layout.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from hetpar.runtime import hiersync


class NodeGroups:
    """The inside-node and across-node process groups the two-level forms of ``shard_groups``
    need (``hiersync.needed_groups``); every rank creates all of them in the same order."""

    def __init__(self, shard_groups: set[tuple[int, ...]], nodes: tuple[int, ...],
                 timeout_s: float) -> None:
        me = dist.get_rank()
        self.by_ranks: dict[tuple[int, ...], Any] = {}
        for ranks in sorted(hiersync.needed_groups(shard_groups, nodes)):
            g = dist.new_group(list(ranks), timeout=timedelta(seconds=timeout_s))
            if me in ranks:
                self.by_ranks[ranks] = g
        self.flat: dict[tuple[int, ...], Any] = {}

    def get(self, ranks: tuple[int, ...]) -> Any:
        """The group of ``ranks`` (sorted); FSDP2's own shard group where it is that."""
        key = tuple(sorted(ranks))
        g = self.by_ranks.get(key, self.flat.get(key))
        assert g is not None, f"no process group for {ranks}"
        return g


class _Alloc:
    def allocate(self, size: Sequence[int | torch.SymInt], *, dtype: torch.dtype,
                 device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)


class HierAllGather(_Alloc):
    """FSDP2 all-gather: across nodes, then inside (``hiersync.all_gather_over``)."""

    def __init__(self, groups: NodeGroups, nodes: tuple[int, ...]) -> None:
        self.groups, self.nodes = groups, nodes

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                 group: Any, async_op: bool = False) -> None:
        ranks = tuple(sorted(dist.get_process_group_ranks(group)))
        self.groups.flat[ranks] = group
        hiersync.all_gather_over(output_tensor, input_tensor, ranks, self.nodes, self.groups)


class HierReduceScatter(_Alloc):
    """FSDP2 reduce-scatter: inside the node, then across (``hiersync.reduce_scatter_over``)."""

    def __init__(self, groups: NodeGroups, nodes: tuple[int, ...]) -> None:
        self.groups, self.nodes = groups, nodes

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                 group: Any, op: Any = None, async_op: bool = False) -> None:
        # train_fsdp forces plain sums (set_force_sum_reduction_for_comms): no pre-scaling
        assert op in (None, dist.ReduceOp.SUM), op
        ranks = tuple(sorted(dist.get_process_group_ranks(group)))
        self.groups.flat[ranks] = group
        hiersync.reduce_scatter_over(output_tensor, input_tensor.reshape(-1), ranks,
                                     self.nodes, self.groups)
