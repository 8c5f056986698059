"""The link model: physical paths between devices, the one in use, and bandwidth queries.

Between two GPUs of one node there are several physical paths -- NVLink (the scale-up
domain), PCIe peer-to-peer, and the NIC through the switch -- but a collective uses one
at a time (NCCL picks NVLink, else PCIe P2P, else the network; NCCL_P2P_LEVEL and the
transport order in the NCCL docs). So the usable bandwidth is that of the best path that
is up, not the sum, and losing NVLink reroutes TP traffic onto PCIe or the NIC. Between
node groups, traffic uses an explicit link when it is up, else the network tiers (the wide
area tier between zones); with neither, the groups are partitioned.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from hetpar.catalog import gpu_spec
from hetpar.specs.cluster import ClusterSpec, NodeGroup
from hetpar.specs.gpu import GPUSpec


@dataclass(frozen=True, kw_only=True)
class NodeCondition:
    """One node's paths (current Gbit/s per GPU, up or down) and its slowdown (time x)."""

    nvlink_gbps: float
    pcie_gbps: float | None
    """None: the node group declares no separate PCIe path."""
    nic_gbps: float
    nvlink_up: bool = True
    pcie_up: bool = True
    slowdown: float = 1.0


def intra_node_paths(c: NodeCondition) -> list[tuple[str, float]]:
    """Usable paths between two GPUs of one node, in the order traffic prefers them."""
    paths = [("nvlink", c.nvlink_gbps)] if c.nvlink_up else []
    if c.pcie_gbps is not None and c.pcie_up:
        paths.append(("pcie", c.pcie_gbps))
    paths.append(("nic", c.nic_gbps))  # loops through the top-of-rack switch; always there
    return paths


def derive_group(g: NodeGroup, *, name: str, num_nodes: int, cond: NodeCondition,
                 gpu: str | GPUSpec) -> NodeGroup:
    """Node group ``g`` restricted to ``num_nodes`` nodes in condition ``cond``."""
    paths = intra_node_paths(cond)
    domain = g.domain_size
    if cond.nvlink_up:
        # A scale-up domain spanning nodes (NVL72) shrinks with the nodes that are left.
        gpus = num_nodes * g.gpus_per_node
        if domain > gpus:
            domain = max(g.gpus_per_node, (gpus // g.gpus_per_node) * g.gpus_per_node)
        node_bw = g.node_bandwidth_gbps if g.node_bandwidth_gbps is None else paths[1][1]
        scale_bw = cond.nvlink_gbps
    else:
        # No NVLink: every GPU is its own "domain"; GPUs of a node talk over the next path.
        domain, scale_bw = 1, paths[0][1]
        node_bw = paths[0][1]
    return dataclasses.replace(
        g, name=name, gpu=gpu, num_nodes=num_nodes,
        scaleup_size=domain if (g.scaleup_size is not None or domain != g.domain_size) else None,
        scaleup_bandwidth_gbps=scale_bw, node_bandwidth_gbps=node_bw,
        nic_bandwidth_gbps=cond.nic_gbps,
        # with NVLink down the "domain" path is the node's PCIe: its link kind too
        scaleup_kind=g.scaleup_kind if cond.nvlink_up else g.node_kind,
    )


def slowed_gpu(gpu: GPUSpec, factor: float) -> GPUSpec:
    """``gpu`` made ``factor`` times slower (a straggler): compute and memory rates divided.

    A value, carried by the derived node group, so every consumer of the derived
    ClusterSpec (the simulator included) sees the same GPU.
    """
    factor = round(factor, 6)
    return dataclasses.replace(
        gpu,
        name=f"{gpu.name}-slow{factor:g}x",
        peak_tflops={k: v / factor for k, v in gpu.peak_tflops.items()},
        memory_bandwidth_gbyte_s=gpu.memory_bandwidth_gbyte_s / factor,
        sources=(*gpu.sources, f"derived by hetpar.dynamic: {factor:g}x slower straggler"),
    )


class Network:
    """Per-GPU bandwidth (Gbit/s, one direction) between devices of a derived ClusterSpec."""

    def __init__(self, cluster: ClusterSpec) -> None:
        self.cluster = cluster
        self.groups = {g.name: g for g in cluster.node_groups}
        self.offset = {g.name: cluster.group_offset(g.name) for g in cluster.node_groups}
        self.total = cluster.num_gpus
        self.links = {}
        for lk in cluster.links:
            self.links[(lk.a, lk.b)] = self.links[(lk.b, lk.a)] = lk.bandwidth_gbps

    def _tier(self, first: int, last: int) -> float | None:
        """Bandwidth of the smallest tier instance holding global devices first..last."""
        total = self.total
        for t in self.cluster.tiers:
            size = t.size_gpus or total
            if first // size == last // size:
                return t.bandwidth_gbps / t.oversubscription
        return None

    def within(self, group: str, span: int, first: int = 0) -> float:
        """Between ``span`` consecutive devices of ``group`` starting at device ``first``."""
        g = self.groups[group]
        if span <= 1:
            return float("inf")
        same_domain = first // g.domain_size == (first + span - 1) // g.domain_size
        if same_domain:
            return g.scaleup_bandwidth_gbps or gpu_spec(g.gpu).scaleup_bandwidth_gbps
        if first // g.gpus_per_node == (first + span - 1) // g.gpus_per_node:
            return g.node_bandwidth_gbps or g.scaleup_bandwidth_gbps or g.nic_bandwidth_gbps
        off = self.offset[group]
        tier = self._tier(off + first, off + first + span - 1)
        return min(g.nic_bandwidth_gbps, tier) if tier else g.nic_bandwidth_gbps

    def between(self, a: str, b: str) -> float | None:
        """Between a device of group ``a`` and one of group ``b`` (None: partitioned)."""
        if a == b:
            return self.within(a, self.groups[a].num_gpus)
        if (a, b) in self.links:
            return self.links[(a, b)]
        ga, gb = self.groups[a], self.groups[b]
        nic = min(ga.nic_bandwidth_gbps, gb.nic_bandwidth_gbps)
        if ga.zone != gb.zone:
            wan = [t for t in self.cluster.tiers if t.kind == "wan"]
            return min(nic, wan[-1].bandwidth_gbps / wan[-1].oversubscription) if wan else None
        lo = min(self.offset[a], self.offset[b])
        hi = max(self.offset[a] + ga.num_gpus, self.offset[b] + gb.num_gpus) - 1
        tier = self._tier(lo, hi)
        return min(nic, tier) if tier else nic
