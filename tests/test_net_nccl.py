"""NCCL's tuner model (hetpar.net.nccl) against hand derivations from its tuning.cc."""

import json

import pytest

from hetpar.cli.main import main
from hetpar.net import collectives as algo
from hetpar.net import tuner
from hetpar.net.collectives import Level, Path
from hetpar.net.links import kind_of_link, load_link_kind
from hetpar.sim import network as net
from hetpar.specs.cluster import ClusterSpec, NodeGroup

NVL, IB = load_link_kind("nvlink"), load_link_kind("ib")


def _levels(nodes: int, per_node: int, nic: float = 25e9, kind: str = "ib") -> list[Level]:
    k = load_link_kind(kind)
    return [Level(per_node, Path("nvl", 250e9, 3.4e-6, NVL)),
            Level(nodes, Path("net", nic, 14e-6, k))]


def _line(levels, op, algorithm, protocol):
    return next(ln for ln in algo.nccl_lines(levels, op)
                if (ln.algorithm, ln.protocol) == (algorithm, protocol))


def test_ring_ll_latency_by_hand():
    # 4 nodes x 8 GPUs, LL: base 6.6 + (62 - 6) intra steps x max(NVLink LL hop, 1 us net
    # overhead) + 6 inter-node steps x NET ring LL 2.7 us (the path's 14 us Simple hop
    # x 2.7 / 14). The measured NVLink LL hop is 2.0 us (nvlink.toml, nccl-tests#123).
    ll = next(p for p in NVL.protocols if p.name == "LL")
    intra = max(3.4e-6 * ll.hop_latency_us / NVL.simple.hop_latency_us, tuner.NET_OVERHEAD_S)
    expect = 6.6e-6 + 56 * intra + 6 * 2.7e-6
    assert _line(_levels(4, 8), "all_reduce", "ring", "LL").a == pytest.approx(expect, rel=1e-12)


def test_two_node_nvls_tree_sends_s_per_node_and_the_classic_tree_2s():
    # NIC-bound (1 GB/s per GPU). NCCL's NVLS_TREE prices two nodes at twice the network
    # bandwidth (tuning.cc "Handle 2 node case of NVLSTree"): a node sends S, on more nodes
    # 2 S; the classic double binary tree is priced at 2 S per node on two nodes too
    # (training runs measured on two nodes move 2 S; hetpar.net.nccl.tree_lines)
    one_nic = 1e9
    nvl4 = load_link_kind("nvlink4")

    def levels(nodes):
        return [Level(8, Path("nvl", 369e9, 3.4e-6, nvl4)),
                Level(nodes, Path("net", one_nic, 14e-6, IB))]

    two = _line(levels(2), "all_reduce", "nvls_tree", "Simple").b
    four = _line(levels(4), "all_reduce", "nvls_tree", "Simple").b
    assert two == pytest.approx(1 / (8 * one_nic), rel=1e-12)
    assert four == pytest.approx(2 * two, rel=1e-12)
    assert algo.nccl_choice(levels(2), "all_reduce", 2**30) == ("nvls_tree", "Simple")
    classic = _line(_levels(2, 8, one_nic), "all_reduce", "tree", "Simple").b
    assert classic == pytest.approx(2 / (8 * one_nic) / IB.tree_bandwidth, rel=1e-12)
    # a ring sends 2(n-1)/n S per node whatever the node count
    ring2 = _line(_levels(2, 8, one_nic), "all_reduce", "ring", "Simple").b
    assert ring2 == pytest.approx(2 * 15 / 16 / (8 * one_nic), rel=1e-12)
    # NVLS_TREE needs NVLink SHARP (Hopper and later, behind an NVSwitch) and NCCL 2.18
    assert all(ln.algorithm != "nvls_tree" for ln in algo.nccl_lines(_levels(2, 8), "all_reduce"))
    assert all(ln.algorithm != "nvls_tree"
               for ln in algo.nccl_lines(levels(2), "all_reduce", (2, 17)))


def test_ll_wins_small_messages_and_simple_large_ones():
    levels = _levels(4, 8)
    assert algo.nccl_choice(levels, "all_reduce", 64)[1] == "LL"
    assert algo.nccl_choice(levels, "all_reduce", 2**31)[1] == "Simple"
    assert algo.nccl_choice(levels, "all_gather", 64)[1] == "LL"
    assert algo.nccl_choice(levels, "all_gather", 2**31)[1] == "Simple"


def test_the_fabrics_own_latency_reaches_the_price():
    # same rates, InfiniBand vs GPUDirect-TCPXO: a 2-node LL128 tree crosses the network once
    # up and once down, so it costs 2 x net_latency_us more (once per crossing off Simple)
    tcpxo = load_link_kind("tcpxo")
    assert tcpxo.net_latency_us > 0 == IB.net_latency_us
    ib_t = _line(_levels(2, 8), "all_reduce", "tree", "LL128").a
    tcp_t = _line(_levels(2, 8, kind="tcpxo"), "all_reduce", "tree", "LL128").a
    # Google's TCPXO profile runs Simple and LL128 only (NCCL_PROTO=Simple,LL128): no LL
    assert algo.nccl_choice(_levels(2, 8, kind="tcpxo"), "all_reduce", 8) == ("tree", "LL128")
    assert tcp_t - ib_t == pytest.approx(2 * tcpxo.net_latency_us * 1e-6, rel=1e-9)


def test_tree_correction_slows_medium_messages():
    ln = _line(_levels(4, 8), "all_reduce", "tree", "Simple")
    mib = 2**20  # log2(2^20 / 64) = 14: Simple's factor is 0.5
    assert tuner.correction(ln.corr, mib) == 0.5
    assert ln.time(mib) == pytest.approx(ln.a + ln.b * mib / 0.5, rel=1e-12)
    assert tuner.correction(ln.corr, 2**30) == 1.0


def _node(gpu: str, nodes: int = 1) -> ClusterSpec:
    return ClusterSpec(name="t", node_groups=(NodeGroup(
        name="g", gpu=gpu, num_nodes=nodes, gpus_per_node=8, scaleup_latency_us=3.4,
        nic_latency_us=14.0),))


def test_nvls_runs_large_all_reduces_on_hopper_nvswitch_only():
    for gpu, nvls in (("H100-SXM5-80GB", True), ("A100-SXM4-80GB", False)):
        shape = net.Topology(_node(gpu)).shape([("g", i) for i in range(8)])
        assert (algo.nccl_choice(shape.levels, "all_reduce", 2**30)[0] == "nvls") is nvls
    # NVLS x 2 x 0.85 bus bandwidth at n / 2(n-1): faster than the ring's 2(n-1)/n
    h100 = net.Topology(_node("H100-SXM5-80GB")).shape([("g", i) for i in range(8)])
    ring = algo.ring(h100.levels, "all_reduce", 2**30)
    assert algo.ALGORITHMS["nvls"](h100.levels, "all_reduce", 2**30) < ring


def test_pat_only_with_one_gpu_per_node():
    one = [Level(16, Path("net", 12.5e9, 14e-6, IB))]
    assert algo.nccl_choice(one, "all_gather", 2**16) == ("pat", "Simple")
    assert all(ln.algorithm != "pat" for ln in algo.nccl_lines(_levels(2, 8), "all_gather"))
    assert all(ln.algorithm != "pat" for ln in algo.nccl_lines(one, "all_reduce"))


def test_fabric_kinds_follow_the_gpu_link_with_the_longest_prefix():
    assert kind_of_link("NVLink4").name == "nvlink4"
    assert kind_of_link("NVLink3").name == "nvlink"
    assert kind_of_link("Infinity Fabric (xGMI)").name == "infinity-fabric"
    assert load_link_kind("infinity-fabric").protocols[0].base_latency_us == 20.5  # RCCL


def test_simulate_names_the_algorithm_and_protocol_of_each_communicator(capsys):
    assert main(["simulate", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    rows = data["collectives"]
    axes = {r["axis"] for r in rows}
    assert {"tp", "dp", "pp"} <= axes
    for r in rows:
        assert r["algorithm"] and r["protocol"] and r["ranks"] >= 2
    tp = next(r for r in rows if r["axis"] == "tp")
    assert (tp["algorithm"], tp["protocol"]) == ("nvls", "Simple")  # 8 H100 on NVSwitch
    assert main(["simulate"]) == 0
    text = capsys.readouterr().out
    assert "collectives                 ranks  largest bytes  algorithm/protocol" in text
    assert "nvls/Simple" in text


def test_a_tier_prices_with_its_own_fabric_kind():
    from hetpar.errors import ConfigError
    from hetpar.specs.cluster import NetworkTier

    def cluster(fabric):
        tier = NetworkTier(name="wan", kind="wan", size_gpus=0, bandwidth_gbps=100.0,
                           latency_us=10.0, fabric=fabric)
        return ClusterSpec(name="t", tiers=(tier,), node_groups=(NodeGroup(
            name="g", gpu="A100-SXM4-80GB", num_nodes=2, gpus_per_node=8,
            nic_latency_us=14.0),))

    devs = [("g", 0), ("g", 8)]
    ib = net.Topology(cluster(None)).shape(devs)
    tcpxo = net.Topology(cluster("tcpxo")).shape(devs)
    assert ib.levels[-1].path.kind.name == "ib"
    assert tcpxo.levels[-1].path.kind.name == "tcpxo"
    # the fabric's own latency: two network crossings of a 2-rank LL128 ring, twice the latency
    ring = [_line(s.levels, "all_reduce", "ring", "LL128") for s in (ib, tcpxo)]
    pick = min(algo.nccl_lines(tcpxo.levels, "all_reduce"), key=lambda ln: ln.time(8))
    assert net.all_reduce(tcpxo, 8) == pytest.approx(pick.run(8), rel=1e-12)
    extra = ring[1].a - ring[0].a
    assert extra == pytest.approx(2 * load_link_kind("tcpxo").net_latency_us * 1e-6, abs=1e-9)
    with pytest.raises(ConfigError, match="unknown link kind 'warp'"):
        net.Topology(cluster("warp")).shape(devs)


def test_an_older_nccl_lacks_what_it_had_not_yet():
    import dataclasses

    h100 = _node("H100-SXM5-80GB")
    devs = [("g", i) for i in range(8)]
    now = net.Topology(h100).shape(devs)
    old = net.Topology(dataclasses.replace(h100, nccl_version="2.16.5")).shape(devs)
    assert old.library == (2, 16)
    assert algo.nccl_choice(now.levels, "all_reduce", 2**30) == ("nvls", "Simple")
    assert algo.nccl_choice(old.levels, "all_reduce", 2**30, old.library)[0] != "nvls"
    assert net.all_reduce(old, 2**30) > net.all_reduce(now, 2**30)  # no NVLink SHARP
    v24 = [ln for ln in algo.nccl_lines(now.levels, "all_reduce", (2, 4))]
    assert {ln.protocol for ln in v24} == {"LL", "Simple"}  # LL128 arrived in 2.5
    one = [Level(16, Path("net", 12.5e9, 14e-6, IB))]
    assert all(ln.algorithm != "pat" for ln in algo.nccl_lines(one, "all_gather", (2, 22)))
    assert any(ln.algorithm == "pat" for ln in algo.nccl_lines(one, "all_gather", (2, 23)))


def test_nccl_2_4_runs_no_tree_inside_one_node():
    # NCCL 2.4 (v2.4.8-1 init.cc ncclTreeThreshold): trees off below 2 nodes; 2.5 prices them
    one_node = [Level(8, Path("nvl", 150e9, 3.4e-6, NVL))]
    two_nodes = _levels(2, 8)
    algos = {v: {ln.algorithm for ln in algo.nccl_lines(one_node, "all_reduce", v)}
             for v in ((2, 4), (2, 5), None)}
    assert algos[(2, 4)] == {"ring"} and "tree" in algos[(2, 5)] and "tree" in algos[None]
    assert "tree" in {ln.algorithm for ln in algo.nccl_lines(two_nodes, "all_reduce", (2, 4))}
    # an 8 B all-reduce then pays the ring's 14 LL steps, slower than the tree NCCL 2.5 has
    assert algo.nccl(one_node, "all_reduce", 8, (2, 4)) > algo.nccl(one_node, "all_reduce", 8)


def test_a_malformed_nccl_version_is_one_line_exit_2(tmp_path, capsys):
    bad = tmp_path / "c.toml"
    bad.write_text('name = "c"\nnccl_version = "two"\n[[node_groups]]\nname = "g"\n'
                   'gpu = "A100-SXM4-80GB"\nnum_nodes = 1\ngpus_per_node = 8\n')
    assert main(["simulate", "--cluster", str(bad), "--plan", "tp=8,gbs=8"]) == 2
    err = capsys.readouterr().err.strip()
    assert "nccl_version='two'" in err and "MAJOR.MINOR" in err and "\n" not in err


def test_nvls_needs_an_nvswitch_domain():
    # a GH200 quad node joins its 4 GPUs directly: no NVLink SHARP; an 8-GPU HGX has one
    quad = ClusterSpec(name="t", node_groups=(NodeGroup(
        name="g", gpu="GH200-96GB", num_nodes=1, gpus_per_node=4),))
    shape = net.Topology(quad).shape([("g", i) for i in range(4)])
    assert shape.levels[0].path.kind.name == "nvlink"
    assert all(ln.algorithm != "nvls" for ln in algo.nccl_lines(shape.levels, "all_reduce"))
    hgx = net.Topology(_node("H100-SXM5-80GB")).shape([("g", i) for i in range(4)])
    assert hgx.levels[0].path.kind.name == "nvlink4"  # a TP-4 group on an 8-GPU NVSwitch
    assert any(ln.algorithm == "nvls" for ln in algo.nccl_lines(hgx.levels, "all_reduce"))


def test_ll_across_nodes_is_capped_at_nccls_ll_max_bandwidth():
    """tuning.cc llMaxBws (Intel hosts): LL's bus bandwidth across nodes is at most 39 GB/s on
    two nodes and 20.4 on more, whatever the NICs; one node has no such cap here."""
    fat = 400e9  # per GPU: LL at 1/4 would be 8 x 100 GB/s of bus bandwidth without the cap
    for nodes, cap in ((2, 39e9), (4, 20.4e9)):
        lv = _levels(nodes, 8, fat)
        n = 8 * nodes
        ring = _line(lv, "all_reduce", "ring", "LL")
        assert 2 * (n - 1) / n / ring.b == pytest.approx(cap, rel=1e-12)  # b: s per byte
        tree = _line(lv, "all_reduce", "tree", "LL")
        assert 2 / tree.b == pytest.approx(cap, rel=1e-12)  # a tree's busBw is 2 x algBw
        simple = _line(lv, "all_reduce", "ring", "Simple")
        assert 2 * (n - 1) / n / simple.b > 5 * cap  # Simple is not capped
    one = _line([Level(8, Path("nvl", 250e9, 3.4e-6, NVL))], "all_reduce", "ring", "LL")
    assert 14 / 8 / one.b == pytest.approx(250e9 * _ll_fraction(), rel=1e-12)


def _ll_fraction() -> float:
    return next(p for p in NVL.protocols if p.name == "LL").bandwidth_fraction


def test_efa_pays_the_latency_its_plugin_reports_per_network_step():
    # aws-ofi-nccl reports 75 us on p4d / p5 (src/platform-aws.cpp); NCCL adds it to every
    # inter-node step, twice on Simple (the flush): 2 nodes, all-reduce ring, 2 such steps
    efa, ib = _levels(2, 8, kind="efa"), _levels(2, 8, kind="ib")
    assert load_link_kind("efa").net_latency_us == 75.0
    ll = _line(efa, "all_reduce", "ring", "LL").a - _line(ib, "all_reduce", "ring", "LL").a
    assert ll == pytest.approx(2 * 75e-6, rel=1e-9)
    simple = (_line(efa, "all_reduce", "ring", "Simple").a
              - _line(ib, "all_reduce", "ring", "Simple").a)
    assert simple == pytest.approx(2 * 2 * 75e-6 * tuner.RING_PLATEAU, rel=1e-9)
