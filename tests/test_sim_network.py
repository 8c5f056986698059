"""Collective costs and tier classification against hand derivations."""

import math

import pytest

from hetpar.sim import network as net
from hetpar.sim.profile import resolve
from hetpar.specs.cluster import ClusterSpec, Link, NetworkTier, NodeGroup

EFF = resolve().net_efficiency


def _cluster(nodes: int = 4, tiers=(), links=(), groups=None) -> ClusterSpec:
    groups = groups or (NodeGroup(name="g", gpu="A100-SXM4-80GB", num_nodes=nodes,
                                  gpus_per_node=8, nic_bandwidth_gbps=200.0,
                                  nic_latency_us=5.0, scaleup_latency_us=3.0),)
    return ClusterSpec(name="t", node_groups=groups, tiers=tuple(tiers), links=tuple(links))


def test_all_reduce_inside_a_node_is_a_ring_on_nvlink():
    topo = net.Topology(_cluster())
    shape = topo.shape([("g", i) for i in range(8)])
    assert shape.outer is None and shape.scope == "scale-up"
    nbytes = 1e9
    bw = 2400e9 / 8 * EFF  # NVLink3: 2400 Gbit/s per direction
    # ring: 2 (n-1)/n bytes / bw; latency: min(ring 7 steps, tree 2 log2 8 = 6) per half
    expect = 2 * (7 / 8 * nbytes / bw + 6 * 3e-6)
    assert net.all_reduce(shape, nbytes) == pytest.approx(expect, rel=1e-12)
    assert net.reduce_scatter(shape, nbytes) == pytest.approx(expect / 2, rel=1e-12)


def test_all_reduce_across_nodes_is_hierarchical():
    topo = net.Topology(_cluster())
    shape = topo.shape([("g", i) for i in range(16)])  # two full nodes
    assert (shape.n, shape.k) == (16, 8)
    assert shape.outer is not None and shape.outer.scope == "network"
    s = 8e8
    inner = 7 / 8 * s / (2400e9 / 8 * EFF) + 6 * 3e-6
    outer = 1 / 2 * (s / 8) / (200e9 / 8 * EFF) + 1 * 5e-6  # 2 nodes: 1 step
    assert net.all_reduce(shape, s) == pytest.approx(2 * (inner + outer), rel=1e-12)


def test_one_gpu_per_node_uses_the_nic_share():
    topo = net.Topology(_cluster())
    shape = topo.shape([("g", 0), ("g", 8), ("g", 16), ("g", 24)])
    assert shape.k == 1
    s = 1e9
    expect = 2 * (3 / 4 * s / (200e9 / 8 * EFF) + 3 * 5e-6)
    assert net.all_reduce(shape, s) == pytest.approx(expect, rel=1e-12)


def test_single_rank_and_empty_messages_cost_nothing():
    topo = net.Topology(_cluster())
    assert net.all_reduce(topo.shape([("g", 3)]), 1e9) == 0.0
    assert net.all_reduce(topo.shape([("g", 0), ("g", 1)]), 0.0) == 0.0


def test_tiers_pick_the_smallest_instance_and_oversubscription_slows():
    tiers = (NetworkTier(name="rack", kind="rack", size_gpus=16, bandwidth_gbps=200.0,
                         latency_us=2.0),
             NetworkTier(name="spine", kind="pod", size_gpus=0, bandwidth_gbps=200.0,
                         latency_us=4.0, oversubscription=4.0))
    topo = net.Topology(_cluster(tiers=tiers))
    in_rack = topo.shape([("g", 0), ("g", 8)])
    across = topo.shape([("g", 0), ("g", 16)])
    assert in_rack.outer.scope == "rack" and across.outer.scope == "spine"
    assert in_rack.outer.latency == pytest.approx(7e-6)
    assert across.outer.bandwidth == pytest.approx(200e9 / 8 * EFF / 4)
    assert net.p2p(across.outer, 1e8) > 3.9 * net.p2p(in_rack.outer, 1e8) - 1e-3


def test_an_explicit_link_between_groups_is_used():
    groups = (
        NodeGroup(name="a", gpu="A100-SXM4-80GB", num_nodes=1, gpus_per_node=8, zone="x"),
        NodeGroup(name="b", gpu="A100-SXM4-80GB", num_nodes=1, gpus_per_node=8, zone="y"),
    )
    link = Link(a="a", b="b", bandwidth_gbps=10.0, latency_us=1000.0)
    topo = net.Topology(_cluster(groups=groups, links=(link,)))
    path = topo.shape([("a", 0), ("b", 0)]).outer
    assert path.scope == "link a-b"
    assert path.bandwidth == pytest.approx(10e9 / 8 * EFF)
    assert net.p2p(path, 1e6) == pytest.approx(1e-3 + 1e6 / (10e9 / 8 * EFF))


def test_p2p_on_the_local_path_is_free():
    assert net.p2p(net.LOCAL.inner, 1e9) == 0.0
    assert math.isinf(net.LOCAL.inner.bandwidth)
