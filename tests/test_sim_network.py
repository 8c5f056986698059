"""Collective costs and tier classification against hand derivations."""

import math

import pytest

from hetpar.errors import ConfigError
from hetpar.net.links import load_link_kind
from hetpar.sim import network as net
from hetpar.specs.cluster import ClusterSpec, Link, NetworkTier, NodeGroup

NVL = load_link_kind("nvlink")
IB = load_link_kind("ib")


def _cluster(nodes: int = 4, tiers=(), links=(), groups=None) -> ClusterSpec:
    groups = groups or (NodeGroup(name="g", gpu="A100-SXM4-80GB", num_nodes=nodes,
                                  gpus_per_node=8, nic_bandwidth_gbps=200.0,
                                  nic_latency_us=5.0, scaleup_latency_us=3.0),)
    return ClusterSpec(name="t", node_groups=groups, tiers=tuple(tiers), links=tuple(links))


def _ring_simple(n: int, nbytes: float, bw: float, hop: float, base_us: float) -> float:
    """NCCL's ring on the Simple protocol by hand: base + 2(n-1) hops + 2(n-1)/n bytes / bw."""
    return base_us * 1e-6 + 2 * (n - 1) * hop + 2 * (n - 1) / n * nbytes / bw


def test_all_reduce_inside_a_node_is_a_ring_on_nvlink():
    topo = net.Topology(_cluster())
    shape = topo.shape([("g", i) for i in range(8)])
    assert shape.outer is None and shape.scope == "scale-up"
    nbytes = 1e9
    bw = 2400e9 / 8 * NVL.efficiency  # NVLink3: 2400 Gbit/s per direction
    expect = _ring_simple(8, nbytes, bw, 3e-6, NVL.simple.base_latency_us)
    assert net.all_reduce(shape, nbytes) == pytest.approx(expect, rel=1e-12)
    half = NVL.simple.base_latency_us * 1e-6 + 7 * 3e-6 + 7 / 8 * nbytes / bw
    assert net.reduce_scatter(shape, nbytes) == pytest.approx(half, rel=1e-12)


def test_small_messages_pick_the_low_latency_protocol():
    topo = net.Topology(_cluster())
    shape = topo.shape([("g", i) for i in range(8)])
    ll = next(p for p in NVL.protocols if p.name == "LL")
    bw = 2400e9 / 8 * NVL.efficiency
    hop = 3e-6 * ll.hop_latency_us / NVL.simple.hop_latency_us
    ring = ll.base_latency_us * 1e-6 + 14 * hop + 14 / 8 * 1e3 / (bw * ll.bandwidth_fraction)
    tree_hop = 3e-6 * ll.tree_hop_latency_us / NVL.simple.tree_hop_latency_us
    # inside one node NCCL's tree is a chain through the 8 GPUs, up and down
    tree_bytes = 2 * 1e3 / (0.92 * bw * ll.tree_bandwidth_fraction)
    tree = ll.base_latency_us * 1e-6 + 2 * 7 * tree_hop + tree_bytes
    assert tree < ring  # NCCL's tuner picks the tree's LL, priced on all its channels ...
    # ... and runs 1 KB on one of them (enqueue.cc: 1e3 B < 512 threads x 8 B): channels,
    # by hand (search.cc, connect.cc): 12 NVLink3 links at NCCL's 20 GB/s (topo.h) carry 6
    # at 40 GB/s, duplicated (>= 25 GB/s) to 12, doubled to 24 (NCCL_DEBUG=INFO logs of
    # 8 x A100 SXM4 print "24 coll channels"), each at 1/24 of the bandwidth
    assert net.all_reduce(shape, 1e3) == pytest.approx(tree + 23 * tree_bytes, rel=1e-12)


def test_all_reduce_across_two_nodes_is_what_nccls_tuner_prices():
    # NCCL's tuning.cc by hand, 2 nodes x 8 GPUs, 8e8 B on Simple. Ring: 2(n-1) = 30 steps, of
    # which 2(nodes-1) = 2 cross the NICs (interLat = the NIC's 5 us; the flush adds the fabric's
    # own latency, 0 on InfiniBand); the other 28 cost max(NVLink hop, 3 x 1 us net overhead);
    # x 1.4 (ring plateau); 8 rings cross the node boundary: 8 x the per-GPU NIC share.
    # Tree: a chain of 8 inside each node and one edge between the two nodes: every GPU sends
    # 2 S over NVLink and each node 2 S over its NICs, at 0.92 of the ring's bandwidth.
    topo = net.Topology(_cluster())
    shape = topo.shape([("g", i) for i in range(16)])  # two full nodes
    assert (shape.n, shape.k) == (16, 8)
    assert shape.outer is not None and shape.outer.scope == "network"
    s = 8e8
    nic, nvl = 200e9 / 8 * IB.efficiency, 2400e9 / 8 * NVL.efficiency
    ring_a = (IB.simple.base_latency_us * 1e-6 + 28 * 3e-6 + 2 * 5e-6) * 1.4
    ring = ring_a + 30 / 16 * s / min(8 * nic, nvl)
    # a path's latency is its Simple hop latency, for rings and trees alike (hetpar.net.nccl)
    tree_a = NVL.simple.base_latency_us * 1e-6 + 2 * (7 * 3e-6 + 1 * 5e-6)
    tree = tree_a + max(2 / nvl, 2 / (8 * nic)) * s / 0.92
    assert ring < tree
    assert net.all_reduce(shape, s) == pytest.approx(min(ring, tree), rel=1e-12)
    from hetpar.net import collectives as algo

    assert algo.nccl_choice(shape.levels, "all_reduce", s) == ("ring", "Simple")


def test_one_gpu_per_node_uses_the_nic_share():
    # ppn = 1: every ring step crosses a NIC at the tree's network latency (tuning.cc: "with
    # ppn=1 latencies are fully exposed"), 5 us here; 2(n-1) = 6 steps, x 1.4 ring plateau
    topo = net.Topology(_cluster())
    shape = topo.shape([("g", 0), ("g", 8), ("g", 16), ("g", 24)])
    assert shape.k == 1
    s = 1e9
    a = (IB.simple.base_latency_us * 1e-6 + 6 * 5e-6) * 1.4
    expect = a + 6 / 4 * s / (200e9 / 8 * IB.efficiency)
    assert net.all_reduce(shape, s) == pytest.approx(expect, rel=1e-12)


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
    assert across.outer.bandwidth == pytest.approx(200e9 / 8 * IB.efficiency / 4)
    assert net.p2p(across.outer, 1e8) > 3.9 * net.p2p(in_rack.outer, 1e8) - 1e-3


def test_oversubscription_is_billed_by_the_rings_that_cross_it():
    tiers = (NetworkTier(name="rack", kind="rack", size_gpus=32, bandwidth_gbps=200.0,
                         latency_us=2.0),
             NetworkTier(name="spine", kind="pod", size_gpus=0, bandwidth_gbps=200.0,
                         latency_us=4.0, oversubscription=4.0))
    topo = net.Topology(_cluster(nodes=8, tiers=tiers))
    share = 200e9 / 8 * IB.efficiency
    # one GPU per rack: every ring member's traffic crosses the spine
    assert topo.shape([("g", 0), ("g", 32)]).outer.bandwidth == pytest.approx(share / 4)
    # four GPUs of each rack in one ring (one per node): 4 ring members share each crossing
    ring = [("g", 8 * i) for i in range(8)]
    assert topo.shape(ring).outer.bandwidth == pytest.approx(share)
    two = [("g", 0), ("g", 8), ("g", 32), ("g", 40)]
    assert topo.shape(two).outer.bandwidth == pytest.approx(share / 2)


def test_an_explicit_link_between_groups_is_used():
    groups = (
        NodeGroup(name="a", gpu="A100-SXM4-80GB", num_nodes=1, gpus_per_node=8, zone="x"),
        NodeGroup(name="b", gpu="A100-SXM4-80GB", num_nodes=1, gpus_per_node=8, zone="y"),
    )
    link = Link(a="a", b="b", bandwidth_gbps=10.0, latency_us=1000.0)
    topo = net.Topology(_cluster(groups=groups, links=(link,)))
    path = topo.shape([("a", 0), ("b", 0)]).outer
    assert path.scope == "link a-b"
    assert path.bandwidth == pytest.approx(10e9 / 8 * IB.efficiency)
    assert net.p2p(path, 1e6) == pytest.approx(1e-3 + 1e6 / (10e9 / 8 * IB.efficiency))


def test_a_link_between_two_nodes_of_one_group_slows_only_rings_over_that_pair():
    link = Link(a="g", b="g", a_nodes=(0,), b_nodes=(1,), bandwidth_gbps=25.0, latency_us=50.0)
    topo = net.Topology(_cluster(links=(link,)))
    slow = topo.shape([("g", 0), ("g", 8)]).outer
    fast = topo.shape([("g", 0), ("g", 16)]).outer
    assert slow.bandwidth == pytest.approx(25e9 / 8 * IB.efficiency)
    assert fast.bandwidth == pytest.approx(200e9 / 8 * IB.efficiency)


def test_a_link_inside_one_group_must_name_its_nodes():
    with pytest.raises(ConfigError, match="a_nodes and b_nodes"):
        _cluster(links=(Link(a="g", b="g", bandwidth_gbps=25.0, latency_us=50.0),))


def test_a_shared_nic_goes_to_the_gpus_the_plan_uses():
    g = NodeGroup(name="g", gpu="RTX-4090", num_nodes=2, gpus_per_node=8,
                  nic_bandwidth_gbps=3.125, nic_shared=True, gpudirect_rdma=False)
    topo = net.Topology(_cluster(groups=(g,)))
    tcp = load_link_kind("tcp")
    pair = [("g", 0), ("g", 8)]
    assert topo.shape(pair).outer.bandwidth == pytest.approx(3.125e9 / 8 * tcp.efficiency)
    two_per_node = topo.with_usage([("g", 0), ("g", 1), ("g", 8), ("g", 9)])
    # 25 Gb/s shared by the 2 GPUs in use on each node, not by all 8
    assert two_per_node.shape(pair).outer.bandwidth == pytest.approx(12.5e9 / 8 * tcp.efficiency)


def test_single_rank_and_empty_messages_cost_nothing():
    topo = net.Topology(_cluster())
    assert net.all_reduce(topo.shape([("g", 3)]), 1e9) == 0.0
    assert net.all_reduce(topo.shape([("g", 0), ("g", 1)]), 0.0) == 0.0


def test_p2p_on_the_local_path_is_free():
    assert net.p2p(net.LOCAL.inner, 1e9) == 0.0
    assert math.isinf(net.LOCAL.inner.bandwidth)


def test_pipeline_sends_share_a_shared_nic_only_with_the_sends_leaving_together():
    # 4-GPU boxes, one 10 GbE port each; a replica of 1-GPU stages over two boxes: only
    # the last stage of box 0 (forward) and the first of box 1 (backward) cross
    g = NodeGroup(name="g", gpu="RTX-4090", num_nodes=2, gpus_per_node=4, scaleup_size=1,
                  node_bandwidth_gbps=126.0, nic_bandwidth_gbps=2.5, nic_shared=True,
                  gpudirect_rdma=False, nic_latency_us=30.0)
    topo = net.Topology(_cluster(groups=(g,)))
    stages = [[[("g", i)] for i in range(8)]]
    devices = [d for chunk in stages[0] for d in chunk]
    tcp = load_link_kind("tcp")
    hop = topo.with_usage(devices, stages).p2p_path(("g", 3), ("g", 4))
    assert hop.bandwidth == pytest.approx(10e9 / 8 * tcp.efficiency)  # the whole port
    # two replicas side by side (devices 0-3 / 4-7 hold stage pairs): two senders per box
    two = [[[("g", 0)], [("g", 4)]], [[("g", 1)], [("g", 5)]]]
    hop2 = topo.with_usage([d for r in two for c in r for d in c], two).p2p_path(("g", 0),
                                                                               ("g", 4))
    assert hop2.bandwidth == pytest.approx(5e9 / 8 * tcp.efficiency)
    # without a shared NIC nothing changes: a fixed per-GPU share
    assert topo.p2p_path(("g", 3), ("g", 4)).bandwidth == pytest.approx(
        2.5e9 / 8 * tcp.efficiency)


def test_type_first_reduce_scatter_is_never_slower_than_nccl_across_gpu_types():
    import dataclasses

    # one node of each type joined by a slow link: a flat ring pushes ~2x the bytes over it,
    # type-first sends each rank's 1/8 shard across (Jia et al. 2018)
    groups = (
        NodeGroup(name="a", gpu="A100-SXM4-80GB", num_nodes=1, gpus_per_node=8, zone="x"),
        NodeGroup(name="b", gpu="V100-SXM2-32GB", num_nodes=1, gpus_per_node=8, zone="y"),
    )
    base = _cluster(groups=groups,
                    links=(Link(a="a", b="b", bandwidth_gbps=10.0, latency_us=100.0),))
    devs = [("a", i) for i in range(8)] + [("b", i) for i in range(8)]
    nccl = net.Topology(base).shape(devs)
    best = net.Topology(dataclasses.replace(base, collectives="best")).shape(devs)
    assert len(best.inners) == 2
    for s in (1e4, 1e6, 1e9):
        assert net.all_reduce(best, s) <= net.all_reduce(nccl, s)

    # across the slow link type-first moves 1 / (2 x 15/16) = 0.53 of the flat ring's bytes,
    # plus its in-type reduce-scatter and all-gather (the ring's 28 steps inside the groups no
    # longer pay the link's 100 us each, as NCCL's tuner prices them: 0.605 of it here)
    assert net.all_reduce(best, 1e9) < 0.65 * net.all_reduce(nccl, 1e9)


def test_todays_cluster_files_load_and_default_to_nccl_over_rdma():
    from hetpar.catalog import load_cluster, names

    for name in names("clusters"):
        c = load_cluster(name)
        topo = net.Topology(c)
        assert c.collectives in ("nccl", "best")
        for g in c.node_groups:
            kind = topo.view.nic_kind[g.name].name
            assert kind == ("ib" if g.rdma else "tcp")


def test_each_wider_collective_set_is_never_slower():
    import dataclasses

    from hetpar.catalog import load_cluster

    base = load_cluster("consumer-mix")
    topos = [net.Topology(dataclasses.replace(base, collectives=c))
             for c in ("nccl", "hierarchical", "best")]
    groups = [[("rtx3090", 0), ("rtx3090", 1)], [("rtx3090", i) for i in range(8)],
              [("rtx3090", i) for i in range(16)] + [("rtx4090", i) for i in range(16)]]
    for devs in groups:
        for s in (1e3, 1e6, 1e9):
            t = [net.all_reduce(topo.shape(devs), s) for topo in topos]
            assert t[0] >= t[1] >= t[2]
    # a bridge that declares ``split`` gains from adding its PCIe path in parallel ("best"
    # only); undeclared, the two paths exclude each other (tests/test_net_links_seed.py)
    g = base.node_groups[0]
    links = tuple(dataclasses.replace(lk, split=True) for lk in g.local_links)
    split = dataclasses.replace(base, node_groups=(dataclasses.replace(g, local_links=links),
                                                   *base.node_groups[1:]))
    pair = groups[0]
    best, hier = (net.Topology(dataclasses.replace(split, collectives=c)).shape(pair)
                  for c in ("best", "hierarchical"))
    assert net.all_reduce(best, 1e9) < 0.95 * net.all_reduce(hier, 1e9)
