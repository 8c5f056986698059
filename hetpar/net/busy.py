"""Which physical links a communicator or a send keeps busy (so concurrent traffic contends)."""

from __future__ import annotations

from collections.abc import Sequence

from hetpar.net.collectives import Level, Path
from hetpar.net.topology import Device, NetworkView

LinkId = tuple[str | int, ...]
"""One physical link as (what, where...): ("pcie", group, device), ("nic", group, node), ..."""


def links(view: NetworkView, devices: Sequence[Device], levels: Sequence[Level]
          ) -> frozenset[LinkId]:
    """The links traffic over ``devices`` on ``levels`` keeps busy: the ids two
    communicators share when they use one link (``net.contention.share_link``).

    Per level it crosses: a scale-up level each GPU's NVLink ports (or bridge); a node level
    each GPU's PCIe link, the uplink of a shared PCIe switch it sits below (flows through one
    switch share it), and when staged through host memory (``shm``) its node's root complex
    and host memory; a network level its node's NIC when ``nic_shared``, else its own (rail).
    """
    out: set[LinkId] = set()
    for lv in levels:
        if lv.size > 1:
            for d in devices:
                out.update(_device_links(view, d, lv.path))
    return frozenset(out)


def send_links(view: NetworkView, a: Device, b: Device, path: Path) -> frozenset[LinkId]:
    """The links one point-to-point send from ``a`` to ``b`` over ``path`` keeps busy."""
    return frozenset(_device_links(view, a, path) + _device_links(view, b, path))


def _device_links(view: NetworkView, d: Device, path: Path) -> list[LinkId]:
    g = view.groups[d[0]]
    node = d[1] // g.gpus_per_node
    kind = path.kind.name if path.kind else ""
    if path.scope == "scale-up":
        return [("port", kind, *d)]
    if path.scope == "node":
        out: list[LinkId] = [("pcie", *d)]
        out += [("switch", g.name, node, j) for j, lk in enumerate(g.local_links)
                if lk.shared and d[1] % g.gpus_per_node in lk.gpus]
        if kind == "shm":
            out.append(("host", g.name, node))
        return out
    return [("nic", g.name, node) if g.nic_shared else ("nic", *d)]
