"""Links inside a node (``NodeGroup.local_links``): bridges that split, shared PCIe switches."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from hetpar.specs.cluster import LocalLink, NodeGroup


def splits(g: NodeGroup, idx: Sequence[int]) -> bool:
    """Whether a local link joining the devices ``idx`` declares ``split`` (LocalLink)."""
    local = {i % g.gpus_per_node for i in idx}
    return any(lk.split and local <= set(lk.gpus) for lk in g.local_links)


def switches(g: NodeGroup, *, shared: bool = False) -> list[tuple[int, LocalLink]]:
    """The PCIe switches of a node (local links of the node's link kind), by their index
    among the local links; ``shared``: only those with one uplink for all their GPUs."""
    return [(j, lk) for j, lk in enumerate(g.local_links)
            if lk.kind == g.node_kind and (lk.shared or not shared)]


def below_one_switch(g: NodeGroup, local: Collection[int]) -> bool:
    """Whether node-local GPUs ``local`` all sit below one switch: their traffic turns
    inside it (P2P where the cards have it) and never crosses its uplink."""
    return any(set(local) <= set(lk.gpus) for _, lk in switches(g))
