"""NCCL's per-channel speed and caps (hetpar.net.channels) against hand derivations from its
search.cc and tuning.cc (NVIDIA/nccl @ 5067397c)."""

import dataclasses

import pytest

from hetpar.catalog import load_gpu
from hetpar.errors import ConfigError
from hetpar.net import channels
from hetpar.net import collectives as algo
from hetpar.net.collectives import Level, Path
from hetpar.net.links import load_link_kind
from hetpar.sim import network as net
from hetpar.specs.cluster import ClusterSpec, NodeGroup

NVL, IB = load_link_kind("nvlink"), load_link_kind("ib")


def _levels(nodes: int, per_node: int, nic_gbps: float, arch: int) -> list[Level]:
    """``nodes`` x ``per_node`` GPUs, one NIC of ``nic_gbps`` per GPU at the IB efficiency."""
    nic = nic_gbps / 8 * 1e9 * IB.efficiency
    return [Level(per_node, Path("nvl", 246e9, 3.4e-6, NVL, arch)),
            Level(nodes, Path("net", nic, 14e-6, IB, arch))]


def _line(levels, algorithm, protocol):
    return next(ln for ln in algo.nccl_lines(levels, "all_reduce")
                if (ln.algorithm, ln.protocol) == (algorithm, protocol))


def test_channel_speed_is_the_search_array_entry_the_nic_carries():
    # HDR 200 Gb/s = 25 GB/s: 24 (speedArrayInter), below 25 so not duplicated
    assert channels.net_speed(25.0, 80, 8) == 24.0
    # HDR100 on one GPU per node: 12 (Leonardo's "2 coll channels" are Postset's doubling)
    assert channels.net_speed(12.5, 80, 1) == 12.0
    # NDR on Hopper rails: 48, kept (cc > 80, < 50 GB/s, more than 4 channels) ...
    assert channels.net_speed(50.0, 90, 8) == 48.0
    # ... but one NIC per node is duplicated into two channels of 24
    assert channels.net_speed(50.0, 90, 1) == 24.0
    # Ampere at >= 25 GB/s per channel is duplicated whatever the count
    assert channels.net_speed(50.0, 80, 8) == 24.0


def test_caps_by_architecture_and_node_count():
    assert channels.caps(80, 4) == channels.Caps(17.8, 20.0, 20.0, 17.8)
    assert channels.caps(90, 2).nvls_tree == 57.7
    assert channels.caps(70, 8).tree == 10.0 and channels.caps(100, 1).tree == 70.0
    assert channels.caps(0, 4) is None and channels.caps(60, 4) is None  # unknown / pre-Volta
    assert channels.arch_of("8.9") == 89 and channels.arch_of("10.0") == 100
    assert channels.arch_of("") == 0


def test_tree_and_ll128_capped_per_channel_across_nodes():
    # 4 x 8 A100 on HDR rails: a channel runs at 24 GB/s; tuning.cc caps the tree's
    # bus bandwidth at 17.8 per channel (x .92 otherwise), ring LL128 at 20 (x .92 otherwise)
    capped, free = _levels(4, 8, 200, 80), _levels(4, 8, 200, 0)
    tree = _line(capped, "tree", "Simple").b / _line(free, "tree", "Simple").b
    assert tree == pytest.approx(IB.tree_bandwidth / (17.8 / 24.0), rel=1e-9)
    ll128 = _line(capped, "ring", "LL128").b / _line(free, "ring", "LL128").b
    assert ll128 == pytest.approx(0.92 * 24.0 / 20.0, rel=1e-9)
    # Simple rings have no per-channel cap; latencies never change
    assert _line(capped, "ring", "Simple") == _line(free, "ring", "Simple")
    assert _line(capped, "tree", "LL").a == _line(free, "tree", "LL").a


def test_one_node_is_never_capped():
    one = [Level(8, Path("nvl", 246e9, 3.4e-6, NVL, 80))]
    free = [Level(8, Path("nvl", 246e9, 3.4e-6, NVL))]
    assert algo.nccl_lines(one, "all_reduce") == [
        ln for ln in algo.nccl_lines(free, "all_reduce")]


def test_simulated_communicators_carry_the_gpus_compute_capability():
    a100 = ClusterSpec(name="t", node_groups=(NodeGroup(
        name="g", gpu="A100-SXM4-80GB", num_nodes=4, gpus_per_node=8, nic_bandwidth_gbps=200.0),))
    devs = [("g", i) for i in range(32)]
    shape = net.Topology(a100).shape(devs)
    assert {lv.path.arch for lv in shape.levels} == {80}
    # an AMD GPU states none: RCCL's tuner is not NCCL's, nothing is capped
    mi = dataclasses.replace(a100, node_groups=(dataclasses.replace(
        a100.node_groups[0], gpu="MI300X"),))
    assert {lv.path.arch for lv in net.Topology(mi).shape(devs).levels} == {0}


def test_a_malformed_compute_capability_names_the_field():
    gpu = load_gpu("A100-SXM4-80GB")
    with pytest.raises(ConfigError, match="compute_capability='eight'"):
        dataclasses.replace(gpu, compute_capability="eight")


def test_channel_count_is_what_search_and_connect_give():
    # 8 GPUs per node on 8 HDR NICs: one search channel per NIC at 24 GB/s, not duplicated
    # (< 25), doubled by connect.cc: 16; their search bandwidth 8 x 24 GB/s
    assert channels.count(25.0, 80, 8, inter=True) == (16, 192.0)
    # one GPU per node on HDR100: 1 x 12 -> 2 (Leonardo's log: "2 coll channels")
    assert channels.count(12.5, 80, 1, inter=True) == (2, 12.0)
    # inside a node, 300 GB/s of NVLink3 at 40 GB/s: 7, duplicated to 14, doubled to 28
    assert channels.count(300.0, 80, 8, inter=False) == (28, 280.0)
    # NCCL's own NVLink bandwidth (topo.h, the kinds' search_fraction): 12 x 20 GB/s on A100
    # and 18 x 20.6 on H100 give 6 at 40 / 60, duplicated to 12, doubled to 24, what
    # NCCL_DEBUG=INFO logs of 8 x A100 SXM4 and of one p5.48xlarge (8 x H100) print ("24 coll
    # channels"); two p5.48xlarge (4 x 100 Gb/s EFA per GPU: 48 GB/s, kept on Hopper with 8
    # channels) print "16 coll channels"
    assert channels.count(12 * 20.0, 80, 8, inter=False) == (24, 240.0)
    assert channels.count(18 * 20.6, 90, 8, inter=False) == (24, 360.0)
    assert channels.count(50.0, 90, 8, inter=True) == (16, 384.0)
    assert load_link_kind("nvlink").search_fraction == pytest.approx(20.0 / 25.0)
    # a PCIe Gen3 path (12 GB/s) at 12: 1, not duplicated, doubled to 2
    assert channels.count(12.0, 70, 2, inter=False) == (2, 12.0)


@pytest.mark.parametrize(("nbytes", "run"), [(8 * 2**20, 16), (2 * 2**20, 16),
                                             (2 * 2**20 - 1, 15), (512 * 2**10, 4),
                                             (160 * 2**10, 1), (8, 1)])
def test_channels_run_drop_one_by_one_below_their_threshold(nbytes, run):
    # enqueue.cc: while (nBytes < nc x nt x threadThreshold && nc >= 2) nc--; the ring's LL
    # on 32 ranks: 512 threads x 8 B x 32 (tuning.cc: x nRanks) = 128 KiB a channel, so 16
    # channels from 2 MiB
    ll = algo.tuner.channel_bytes("ring", "LL", 32, slow=False)
    assert ll == 128 * 2**10
    assert algo.tuner.channels_run(nbytes, 16, ll) == run
    # the ring's Simple: 512 threads x 64 B (256 threads on a search of <= PCI_BW 12 GB/s),
    # the tree's LL128 640 x 8 B; NVLS and PAT keep their channels
    assert algo.tuner.channel_bytes("ring", "Simple", 32, slow=False) == 32 * 2**10
    assert algo.tuner.channel_bytes("ring", "Simple", 32, slow=True) == 16 * 2**10
    assert algo.tuner.channel_bytes("tree", "LL128", 32, slow=True) == 5 * 2**10
    assert algo.tuner.channel_bytes("pat", "Simple", 32, slow=False) == 0


def test_a_medium_message_runs_on_fewer_channels_at_the_tuners_choice():
    # 4 x 8 A100 over HDR: 16 channels; the ring's LL needs 128 KiB a channel (32 ranks)
    levels = _levels(4, 8, 200.0, 80)
    ring_ll = _line(levels, "ring", "LL")
    assert (ring_ll.channels, ring_ll.unit) == (16, 512 * 8 * 32)
    size = 512 * 2**10  # 4 of 16 channels: the bandwidth term x 4, the latency as priced
    assert ring_ll.run(size) == pytest.approx(ring_ll.a + 4 * (ring_ll.time(size) - ring_ll.a))
    assert ring_ll.run(2 * 2**20) == ring_ll.time(2 * 2**20)
    # NCCL's choice is the tuner's (all channels), then run as it runs
    for size in (2**10, 2**14, 2**18, 2**22):
        best = min(algo.nccl_lines(levels, "all_reduce"), key=lambda ln: ln.time(size))
        assert algo.nccl(levels, "all_reduce", size) == pytest.approx(best.run(size))
    # NCCL 2.4 had another rule (not modelled): every channel
    old = algo.nccl_lines(levels, "all_reduce", (2, 4))
    assert all(ln.unit == 0 for ln in old)


def test_rccl_drops_channels_at_its_own_256_threads():
    # RCCL (ROCm/rccl device.h NCCL_MAX_NTHREADS 256 on every protocol, enqueue.cc the same
    # thresholds): the ring's LL on 8 MI300X needs 256 x 8 B x 8 ranks = 16 KiB a channel
    xgmi = load_link_kind("infinity-fabric")
    assert xgmi.channel_threads == 256
    levels = [Level(8, Path("xgmi", 64e9, 2.7e-6, xgmi))]
    ring_ll = _line(levels, "ring", "LL")
    assert ring_ll.unit == 256 * 8 * 8
    assert algo.tuner.channel_bytes("ring", "LL", 8, slow=False) == 512 * 8 * 8  # NCCL's
