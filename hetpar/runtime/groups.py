"""Process groups from a layout: a DeviceMesh (pp, dp, tp) when uniform, else explicit groups."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch.distributed as dist

from hetpar.runtime.layout import MESH_AXES, Layout


class Groups:
    """Process groups keyed by their sorted rank tuple; every rank builds the same set.

    ``torch.distributed.new_group`` is collective over the world, so all ranks create the
    same groups in the same (sorted) order, members or not.
    """

    def __init__(self, layout: Layout, needed: set[tuple[int, ...]], timeout_s: float,
                 device_type: str = "cpu") -> None:
        self.by_ranks: dict[tuple[int, ...], Any] = {}
        self.mesh: Any = None
        rank = dist.get_rank()
        needed = set(needed) | tp_groups(layout)
        if layout.is_mesh() and layout.world_size > 1:
            self._from_mesh(layout, rank, device_type)
        for ranks in sorted(needed):
            if len(ranks) < 2 or ranks in self.by_ranks:
                continue
            g = dist.new_group(list(ranks), timeout=timedelta(seconds=timeout_s))
            if rank in ranks:
                self.by_ranks[ranks] = g
        self.by_ranks = {k: v for k, v in self.by_ranks.items() if rank in k}

    def _from_mesh(self, layout: Layout, rank: int, device_type: str) -> None:
        from torch.distributed.device_mesh import DeviceMesh

        self.mesh = DeviceMesh(device_type, layout.mesh_ranks(), mesh_dim_names=MESH_AXES)
        for axis in ("tp", "dp"):
            g = self.mesh.get_group(axis)
            self.by_ranks[tuple(sorted(dist.get_process_group_ranks(g)))] = g
        # Mesh groups exist on every rank for its own coordinates only; record the others'
        # rank tuples so the explicit pass below does not create them a second time.
        for axis in ("tp", "dp"):
            for ranks in mesh_axis_groups(layout, axis):
                self.by_ranks.setdefault(ranks, None)

    def get(self, ranks: tuple[int, ...]) -> Any:
        """The group of ``ranks`` (sorted), which this rank must belong to."""
        g = self.by_ranks.get(tuple(sorted(ranks)))
        assert g is not None, f"no process group for {ranks}"
        return g


def tp_groups(layout: Layout) -> set[tuple[int, ...]]:
    """Rank tuples of every stage's TP group (the mesh's ``tp`` groups of two or more)."""
    return {g for g in mesh_axis_groups(layout, "tp") if len(g) > 1}


def mesh_axis_groups(layout: Layout, axis: str) -> list[tuple[int, ...]]:
    """All groups of ``axis`` (a mesh name: ``tp``, ``dp``...), as sorted rank tuples."""
    return [tuple(sorted(g)) for g in layout.mesh.groups(axis)]
