"""Which physical links a communicator or a send keeps busy (so concurrent traffic contends)."""

from __future__ import annotations

from collections.abc import Sequence

from hetpar.net.collectives import Level, Path
from hetpar.net.local import switches
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
    mates = _mates(view, devices)
    for lv in levels:
        if lv.size > 1:
            for d in devices:
                out.update(_device_links(view, d, lv.path, mates))
    return frozenset(out)


def send_links(view: NetworkView, a: Device, b: Device, path: Path) -> frozenset[LinkId]:
    """The links one point-to-point send from ``a`` to ``b`` over ``path`` keeps busy."""
    mates = _mates(view, (a, b))
    return frozenset(_device_links(view, a, path, mates) + _device_links(view, b, path, mates))


def _mates(view: NetworkView, devices: Sequence[Device]) -> dict[tuple[str, int], set[int]]:
    """Node-local indices of the devices on each (group, node)."""
    out: dict[tuple[str, int], set[int]] = {}
    for name, i in devices:
        gpn = view.groups[name].gpus_per_node
        out.setdefault((name, i // gpn), set()).add(i % gpn)
    return out


def _device_links(view: NetworkView, d: Device, path: Path,
                  mates: dict[tuple[str, int], set[int]]) -> list[LinkId]:
    g = view.groups[d[0]]
    node = d[1] // g.gpus_per_node
    kind = path.kind.name if path.kind else ""
    if path.scope == "scale-up":
        return [("port", kind, *d)]
    if path.scope == "node":
        out: list[LinkId] = [("pcie", *d)]
        # a switch's uplink carries only traffic that leaves it: not when every device of
        # the node that talks sits below the switch
        here = mates.get((g.name, node), set())
        out += [("switch", g.name, node, j) for j, lk in switches(g, shared=True)
                if d[1] % g.gpus_per_node in lk.gpus and not here <= set(lk.gpus)]
        if kind == "shm":
            out.append(("host", g.name, node))
        return out
    return [("nic", g.name, node) if g.nic_shared else ("nic", *d)]


def pipeline_flows(view: NetworkView, stages: Sequence[Sequence[Sequence[Device]]]
                   ) -> dict[tuple[str, int], int]:
    """Pipeline sends leaving each (group, node) together, for groups with a shared NIC.

    ``stages``: per replica, its chunks' devices in pipeline order. At a hop between nodes
    every device of the earlier chunk sends activations forward and every device of the
    later chunk sends gradients back. One device's sends are sequential (its own stream),
    while devices of one node send together, so each such device is one flow on its
    node's uplink.
    """
    senders: set[Device] = set()
    for chunks in stages:
        for a, b in zip(chunks, chunks[1:], strict=False):
            if a and b and _node(view, a[0]) != _node(view, b[0]):
                senders.update(a)
                senders.update(b)
    out: dict[tuple[str, int], int] = {}
    for d in senders:
        if view.groups[d[0]].nic_shared:
            key = _node(view, d)
            out[key] = out.get(key, 0) + 1
    return out


def _node(view: NetworkView, d: Device) -> tuple[str, int]:
    return (d[0], d[1] // view.groups[d[0]].gpus_per_node)
