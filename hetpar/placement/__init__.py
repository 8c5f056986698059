"""One placement of a plan on a cluster: the ``Mesh`` of named dimensions every study reads.

``place(model, cluster, plan) -> Mesh`` (``placement/place.py``) is built once; consumers
ask it for groups by name (``mesh.groups("tp")``, ``"dp"``, ``"dp_cp"``; after
``unflatten("dp", ...)`` ``"dp_shard"``; after ``with_experts(ep, etp)`` ``"ep"`` and
``"edp"``), as torchtitan's ``ParallelDims`` hands out device meshes. ``Placement`` is the
old name of ``Mesh``. ``symmetric`` / ``block_offsets`` are the grid views the simulator's
fast path and the planner's structures lay devices out with (``placement/grid.py``).
"""

from hetpar.placement.grid import LAYOUTS, BlockClass, Symmetric, block_offsets, symmetric
from hetpar.placement.mesh import DIMS, EXPERT_DIMS, Axis, Groups, Mesh, RankPlace
from hetpar.placement.place import AXIS_RULES, place, placed_plan

Placement = Mesh
"""The old name of ``Mesh`` (one placed plan)."""

__all__ = [
    "AXIS_RULES", "DIMS", "EXPERT_DIMS", "LAYOUTS", "Axis", "BlockClass", "Groups", "Mesh",
    "Placement", "RankPlace", "Symmetric", "block_offsets", "place", "placed_plan", "symmetric",
]
