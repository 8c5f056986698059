"""Metis (Um et al., USENIX ATC'24) cluster description: a hostfile plus a clusterfile JSON.

Format (SamsungLabs/Metis README and utils.py): the hostfile has one line per node,
``IP slots=N`` (or ``IP N``); the clusterfile maps each IP to ``instance_type``,
``inter_bandwidth``, ``intra_bandwidth`` and ``memory`` (GB per GPU). Metis's cost model
multiplies bandwidths by 2**20 to get bytes/s (model/cost_estimator.py), i.e. MiB/s.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

from hetpar.errors import ConfigError
from hetpar.importers.devices import resolve
from hetpar.io import parse_json
from hetpar.specs.cluster import ClusterSpec, NetworkTier, NodeGroup

BandwidthUnit = Literal["mib_s", "gbyte_s", "gbps", "byte_s"]
# unit -> factor to Gbit/s
TO_GBPS: dict[str, float] = {
    "mib_s": 2**20 * 8 / 1e9,
    "gbyte_s": 8.0,
    "gbps": 1.0,
    "byte_s": 8 / 1e9,
}
KEYS = ("instance_type", "inter_bandwidth", "intra_bandwidth", "memory")
# Per-GPU bandwidths outside this range are not a GPU link: 1 Gbit/s Ethernet up to 2x
# NVLink 5's 14.4 Tbit/s per GPU (B200: 1.8 TB/s, NVIDIA Blackwell datasheet).
PLAUSIBLE_GBPS = (1.0, 30_000.0)
DEFAULT_LATENCY_US = 5.0  # Metis has no latencies: hetpar's NodeGroup default NIC latency


def parse_hostfile(text: str) -> list[tuple[str, int]]:
    """(IP, GPUs) per node line; blank lines and ``#`` comments are skipped."""
    nodes = []
    seen: dict[str, int] = {}  # IP -> line: a node listed twice would count its GPUs twice
    for no, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"(\S+)\s+(?:slots=)?([0-9]+)", line, re.ASCII)
        if m is None or int(m.group(2)) < 1:
            raise ConfigError(f"metis hostfile line {no}: {line!r} is not 'IP slots=N' (N >= 1)")
        if m.group(1) in seen:
            raise ConfigError(f"metis hostfile line {no}: node {m.group(1)} is listed twice "
                              f"(first on line {seen[m.group(1)]}); one line per node")
        seen[m.group(1)] = no
        nodes.append((m.group(1), int(m.group(2))))
    if not nodes:
        raise ConfigError("metis hostfile: no nodes")
    return nodes


def parse_clusterfile(text: str) -> dict[str, dict[str, Any]]:
    """The clusterfile JSON, checked: every IP has the four keys with sensible values."""
    data = parse_json(text, "metis clusterfile")
    if not isinstance(data, dict) or not data:
        raise ConfigError("metis clusterfile: expected an object of IP -> node description")
    for ip, node in data.items():
        if not isinstance(node, dict) or sorted(node) != sorted(KEYS):
            got = sorted(node) if isinstance(node, dict) else node
            raise ConfigError(f"metis clusterfile: {ip}: keys {got}; expected {', '.join(KEYS)}")
        if not isinstance(node["instance_type"], str):
            raise ConfigError(f"metis clusterfile: {ip}.instance_type must be a string")
        for k in KEYS[1:]:
            v = node[k]
            if isinstance(v, bool) or not isinstance(v, int | float) or v <= 0:
                raise ConfigError(f"metis clusterfile: {ip}.{k} must be a number > 0, got {v!r}")
    return data


def read_metis(
    hostfile: str,
    clusterfile: str,
    name: str = "metis",
    unit: BandwidthUnit | None = None,
    gpu_map: Mapping[str, str] | None = None,
) -> tuple[ClusterSpec, list[str]]:
    """A hetpar cluster from Metis's two files, and warnings about the conversion.

    Consecutive hostfile lines with the same device and bandwidths form one node group;
    ``intra_bandwidth`` becomes the scale-up bandwidth and ``inter_bandwidth`` the NIC
    bandwidth of each GPU; one cluster-wide tier runs at the slowest inter-node bandwidth.
    ``unit`` None reads Metis's own MiB/s and refuses bandwidths outside PLAUSIBLE_GBPS
    (naming the units that would fit); a given unit only warns about them.
    """
    explicit = unit is not None
    unit = unit or "mib_s"
    if unit not in TO_GBPS:
        raise ConfigError(f"bandwidth unit {unit!r}; allowed: {', '.join(TO_GBPS)}")
    info = parse_clusterfile(clusterfile)
    warnings: list[str] = []
    runs: list[list[Any]] = []  # [key, nodes] in hostfile order
    for ip, gpus in parse_hostfile(hostfile):
        if ip not in info:
            raise ConfigError(
                f"metis hostfile: node {ip} not in the clusterfile; known: {', '.join(info)}"
            )
        node = info[ip]
        key = (
            node["instance_type"],
            gpus,
            node["inter_bandwidth"],
            node["intra_bandwidth"],
            node["memory"],
        )
        if runs and runs[-1][0] == key:
            runs[-1][1] += 1
        else:
            runs.append([key, 1])
    groups = []
    for i, ((dev, gpus, inter, intra, mem), count) in enumerate(runs):
        gpu, more = resolve(dev, float(mem), gpu_map)
        warnings += [w for w in more if w not in warnings]
        groups.append(
            NodeGroup(
                name=f"{dev.lower()}-{i}" if len(runs) > 1 else dev.lower(),
                gpu=gpu,
                num_nodes=count,
                gpus_per_node=gpus,
                scaleup_bandwidth_gbps=round(intra * TO_GBPS[unit], 3),
                nic_bandwidth_gbps=round(inter * TO_GBPS[unit], 3),
            )
        )
    raw = [v for (_, _, inter, intra, _), _ in runs for v in (inter, intra)]
    lo, hi = PLAUSIBLE_GBPS
    for g in groups:
        for bw in (g.scaleup_bandwidth_gbps, g.nic_bandwidth_gbps):
            if bw is None or lo <= bw <= hi:
                continue
            if not explicit:
                fits = [u for u, f in TO_GBPS.items() if all(lo <= v * f <= hi for v in raw)]
                raise ConfigError(
                    f"metis clusterfile: group {g.name}: bandwidth {bw:.3g} Gbit/s read as "
                    f"Metis's MiB/s is outside {lo:g}-{hi:g} Gbit/s; give the unit with "
                    f"--bandwidth-unit (values fit: {', '.join(fits) or 'no unit'})"
                )
            warnings.append(
                f"group {g.name}: {bw:.3g} Gbit/s looks implausible; is the "
                f"bandwidth unit {unit!r} right? (--bandwidth-unit)"
            )
    slowest = min(g.nic_bandwidth_gbps for g in groups)
    tier = NetworkTier(
        name="network",
        kind="pod",
        size_gpus=0,
        bandwidth_gbps=slowest,
        latency_us=DEFAULT_LATENCY_US,
    )
    cluster = ClusterSpec(
        name=name,
        node_groups=tuple(groups),
        tiers=(tier,),
        description=f"imported from Metis hostfile/clusterfile ({unit})",
        sources=("https://github.com/SamsungLabs/Metis",),
    )
    return cluster, warnings
