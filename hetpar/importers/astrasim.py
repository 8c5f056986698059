"""ASTRA-sim analytical network config (network.yml): one list entry per network dimension.

Format (astra-sim/astra-network-analytical README and the example inputs): ``topology``
(Ring, FullyConnected or Switch per dimension), ``npus_count``, ``bandwidth`` (GB/s per
link) and ``latency`` (ns per link), innermost dimension first; only the flow-list form
``key: [a, b]`` used by the examples is read. The NPUs are all of one (given) GPU type.
"""

from __future__ import annotations

import math
import re

from hetpar.errors import ConfigError
from hetpar.importers.devices import resolve
from hetpar.io import parse_float, parse_int
from hetpar.specs.cluster import ClusterSpec, NetworkTier, NodeGroup, TierKind

KEYS = ("topology", "npus_count", "bandwidth", "latency")
TOPOLOGIES = ("Ring", "FullyConnected", "Switch")
# dimensions above the node (dim 0) and the NIC (dim 1) become scale-out tiers
TIER_KINDS: tuple[TierKind, ...] = ("pod", "datacenter", "wan")


def parse_network(text: str) -> dict[str, list[str]]:
    """The four lists of a network.yml (comments and blank lines ignored)."""
    out: dict[str, list[str]] = {}
    for no, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z_-]+)\s*:\s*\[(.*)\]", line)
        if m is None:
            raise ConfigError(f"astra-sim network line {no}: {line!r} is not 'key: [a, b, ...]'")
        key = m.group(1)
        if key not in KEYS:
            raise ConfigError(f"astra-sim network: unknown key {key!r}; allowed: {', '.join(KEYS)}")
        out[key] = [v.strip() for v in m.group(2).split(",") if v.strip()]
    missing = [k for k in KEYS if k not in out]
    if missing:
        raise ConfigError(f"astra-sim network: missing key {missing[0]!r}")
    if len({len(v) for v in out.values()}) != 1 or not out["topology"]:
        raise ConfigError(
            "astra-sim network: topology, npus_count, bandwidth and latency "
            "must list the same (non-zero) number of dimensions"
        )
    return out


def _numbers(key: str, values: list[str], cast: type[float] | type[int]) -> list[float]:
    # the one strict parser: finite ASCII numbers (float("nan") would import as nan)
    parse = parse_int if cast is int else parse_float
    nums = [parse(v, f"astra-sim network: {key}[{i}]") for i, v in enumerate(values)]
    if min(nums) <= 0:
        raise ConfigError(f"astra-sim network: {key} must be > 0, got {values}")
    return [float(n) for n in nums]


def approximations(topology: list[str], npus: list[int]) -> list[str]:
    """What a node group + tiers (a switch per level, per-GPU bandwidth) cannot say about
    each dimension: a Switch is exact, a Ring or FullyConnected of more than 2 NPUs is not."""
    out = []
    for i, (topo, n) in enumerate(zip(topology, npus, strict=True)):
        if topo == "Ring" and n > 2:
            out.append(
                f"dimension {i} Ring({n}) approximated as a switch at one link's bandwidth per "
                f"NPU: ring collectives run at that rate, but traffic between non-neighbours "
                f"takes up to {n // 2} hops and shares links in ASTRA-sim"
            )
        elif topo == "FullyConnected" and n > 2:
            out.append(
                f"dimension {i} FullyConnected({n}) approximated as a switch at one link's "
                f"bandwidth per NPU: the other {n - 2} direct links of each NPU are not counted"
            )
    rings = [i for i, t in enumerate(topology) if t == "Ring" and npus[i] > 2]
    if len(rings) > 1:
        out.append(f"dimensions {rings} form a {len(rings)}-D torus: approximated dimension by "
                   "dimension as above (no wrap-around routing across dimensions)")
    return out


def read_astrasim(
    text: str, gpu: str, name: str = "astra-sim", gpu_map: dict[str, str] | None = None
) -> tuple[ClusterSpec, list[str]]:
    """A hetpar cluster of ``gpu`` devices laid out as the network.yml's dimensions.

    Dimension 0 is the node (scale-up), dimension 1 the NIC, higher ones tiers; GB/s become
    Gbit/s (x8) and ns become microseconds. Dimensions the model cannot represent exactly
    (rings and full meshes of more than 2 NPUs, tori) are approximated with a warning each.
    """
    net = parse_network(text)
    bad = [t for t in net["topology"] if t not in TOPOLOGIES]
    if bad:
        raise ConfigError(
            f"astra-sim network: topology {bad[0]!r}; allowed: {', '.join(TOPOLOGIES)}"
        )
    npus = [int(n) for n in _numbers("npus_count", net["npus_count"], int)]
    bw = [b * 8 for b in _numbers("bandwidth", net["bandwidth"], float)]
    lat = [v / 1000 for v in _numbers("latency", net["latency"], float)]
    if len(npus) > 2 + len(TIER_KINDS):
        raise ConfigError(
            f"astra-sim network: {len(npus)} dimensions; at most {2 + len(TIER_KINDS)} are mapped"
        )
    gpu_name, warnings = resolve(gpu, None, gpu_map)
    warnings += approximations(net["topology"], npus)
    group = NodeGroup(
        name="npus",
        gpu=gpu_name,
        num_nodes=math.prod(npus[1:]),
        gpus_per_node=npus[0],
        scaleup_bandwidth_gbps=bw[0],
        scaleup_latency_us=lat[0],
        nic_bandwidth_gbps=bw[1] if len(bw) > 1 else bw[0],
        nic_latency_us=lat[1] if len(lat) > 1 else lat[0],
    )
    tiers = tuple(
        NetworkTier(
            name=f"dim{i}",
            kind=TIER_KINDS[i - 2],
            size_gpus=math.prod(npus[: i + 1]),
            bandwidth_gbps=bw[i],
            latency_us=lat[i],
        )
        for i in range(2, len(npus))
    )
    shape = " x ".join(f"{t}({n})" for t, n in zip(net["topology"], npus, strict=True))
    cluster = ClusterSpec(
        name=name,
        node_groups=(group,),
        tiers=tiers,
        description=f"imported from an ASTRA-sim network config: {shape}",
        sources=("https://github.com/astra-sim/astra-network-analytical",),
    )
    return cluster, warnings
