"""Cluster state over time: events become a ClusterSpec; paths reroute; devices keep identity."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetpar.catalog import load_cluster, load_gpu, load_model
from hetpar.dynamic.paths import Network
from hetpar.dynamic.state import relocate, timeline
from hetpar.dynamic.trace import parse_csv
from hetpar.errors import Infeasible
from hetpar.sim.network import Topology
from hetpar.specs.cluster import ClusterSpec, NetworkTier, NodeGroup
from hetpar.specs.expand import expand
from hetpar.specs.gpu import GPUSpec
from hetpar.specs.plan import Plan


def _steps(cluster: ClusterSpec, rows: str) -> list:
    text = f"# horizon_s: 1000\nt_s,kind,target,value,node,nodes\n{rows}"
    return timeline(cluster, parse_csv(text, "t.csv"))


def _pcie_cluster() -> ClusterSpec:
    return ClusterSpec(name="c", node_groups=(
        NodeGroup(name="g", gpu="A100-SXM4-80GB", num_nodes=4, gpus_per_node=8,
                  node_bandwidth_gbps=256.0, nic_bandwidth_gbps=200.0),),
        tiers=(NetworkTier(name="fabric", kind="pod", size_gpus=0, bandwidth_gbps=200.0,
                           latency_us=5.0),))


def test_link_factor_absolute_and_failure_reroutes_to_the_wan_tier() -> None:
    steps = _steps(load_cluster("two-zone-a100"),
                   "10,factor,link:zone-a/zone-b,0.5,,\n20,bandwidth,link:zone-b/zone-a,40,,\n"
                   "30,down,link:zone-a/zone-b,,,\n40,factor,tier:dci,0.2,,\n"
                   "50,up,link:zone-a/zone-b,,,\n")
    bw = []
    for step in steps:
        assert step.state.cluster is not None
        bw.append(Network(step.state.cluster).between("zone-a", "zone-b"))
    # nominal 12.5, half, 40 absolute, link down -> dci tier (12.5), dci at 20%, link back (40)
    assert bw == pytest.approx([12.5, 6.25, 40.0, 12.5, 2.5, 40.0])
    assert [len(step.state.cluster.links) for step in steps] == [1, 1, 1, 0, 0, 1]


def test_losing_nvlink_reroutes_to_pcie_then_to_the_nic() -> None:
    steps = _steps(_pcie_cluster(), "10,down,nvlink:g,,2,\n20,down,pcie:g,,2,\n"
                   "30,up,nvlink:g,,2,\n40,up,pcie:g,,2,\n")
    groups = [{g.name: g for g in s.state.cluster.node_groups} for s in steps]
    nv = load_gpu("A100-SXM4-80GB").scaleup_bandwidth_gbps
    # node 2 becomes its own derived group; inside it TP traffic takes the next path
    assert list(groups[0]) == ["g"]
    assert list(groups[1]) == ["g", "g@2", "g@3"]
    assert groups[1]["g@2"].scaleup_size == 1
    assert groups[1]["g@2"].node_bandwidth_gbps == 256.0  # PCIe
    assert groups[2]["g@2"].node_bandwidth_gbps == 200.0  # the NIC through the switch
    assert groups[1]["g"].num_nodes == 2 and groups[1]["g@3"].num_nodes == 1
    assert list(groups[4]) == ["g"] and groups[4]["g"].scaleup_bandwidth_gbps == nv
    net = Network(steps[1].state.cluster)
    assert net.within("g", 8) == nv and net.within("g@2", 8) == 256.0


def test_leave_join_and_stragglers_keep_device_identity() -> None:
    steps = _steps(_pcie_cluster(), "10,leave,group:g,,,1\n20,slowdown,group:g,2,1,\n"
                   "30,join,group:g,,,1\n")
    s_leave, s_slow, s_join = (s.state for s in steps[1:])
    assert s_leave.cluster.num_gpus == 24
    assert s_leave.locate("g", 31) is None and s_leave.locate("g", 23) == ("g", 23)
    # the slowed node is its own group whose GPU is a value with halved rates (no file)
    slow = s_slow.cluster.node_groups[1]
    assert slow.name == "g@1" and slow.num_nodes == 1
    base, derived = load_gpu("A100-SXM4-80GB"), slow.gpu
    assert isinstance(derived, GPUSpec) and slow.gpu_name == "A100-SXM4-80GB-slow2x"
    assert derived.peak_tflops["bf16"] == pytest.approx(base.peak_tflops["bf16"] / 2)
    assert Topology(s_slow.cluster).gpu("g@1") is derived  # the simulator reads the value
    assert s_slow.locate("g", 9) == ("g@1", 1) and s_slow.identity("g@2", 0) == ("g", 16)
    assert s_join.cluster.num_gpus == 32


def test_relocate_follows_devices_and_fails_when_they_leave() -> None:
    model = load_model("llama3.1-8b")
    steps = _steps(_pcie_cluster(), "10,slowdown,group:g,3,1,\n20,leave,group:g,,,1\n")
    s0, s1, s2 = (s.state for s in steps)
    plan = expand(Plan(tp=8, pp=1, dp=4, global_batch=64), model, s0.cluster)
    moved = relocate(plan, s0, s1)
    assert [r.stages[0].group for r in moved.replicas] == ["g", "g@1", "g@2", "g@2"]
    assert [r.stages[0].devices[0] for r in moved.replicas] == [0, 0, 0, 8]
    back = relocate(moved, s1, s0)
    assert back == plan
    with pytest.raises(Infeasible, match="has left"):
        relocate(plan, s0, s2)


def test_all_nodes_leaving_gives_an_empty_state() -> None:
    steps = _steps(_pcie_cluster(), "10,leave,group:g,,,\n20,join,group:g,,,2\n")
    assert steps[1].state.cluster is None
    assert steps[2].state.cluster.num_gpus == 16


def test_tiers_shrink_with_the_cluster() -> None:
    # a tier larger than what is left becomes the whole (smaller) cluster
    steps = _steps(load_cluster("two-zone-a100"), "10,leave,group:zone-b,,,32\n"
                   "20,leave,group:zone-a,,,30\n")
    last = steps[2].state.cluster
    assert last.num_gpus == 16
    assert [t.size_gpus for t in last.tiers] == [0, 0]


_EVENTS = [
    "factor,link:zone-a/zone-b,{f},,", "bandwidth,tier:dci,{b},,", "down,link:zone-a/zone-b,,,",
    "up,link:zone-a/zone-b,,,", "down,nvlink:zone-a,,{n},", "up,nvlink:zone-a,,{n},",
    "slowdown,group:zone-b,{s},{n},", "leave,group:zone-a,,,1", "join,group:zone-a,,,1",
    "factor,nic:zone-b,{f},{n},",
]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(_EVENTS) - 1), st.sampled_from([0.1, 0.5, 2.0]),
                          st.integers(0, 31), st.sampled_from([1.0, 1.5, 3.0])),
                min_size=1, max_size=25))
def test_random_traces_keep_devices_and_bandwidths_consistent(events: list) -> None:
    base = load_cluster("two-zone-a100")
    present = 32
    rows = []
    for k, (i, f, n, slow) in enumerate(events):
        if _EVENTS[i].startswith("leave") and present <= 1:
            continue
        if _EVENTS[i].startswith("join") and present >= 32:
            continue
        present += _EVENTS[i].startswith("join") - _EVENTS[i].startswith("leave")
        rows.append(f"{k + 1}," + _EVENTS[i].format(f=f, b=f * 10, n=n, s=slow))
    steps = _steps(base, "\n".join(rows) + "\n")
    for step in steps:
        state = step.state
        assert state.cluster is not None
        assert state.cluster.num_gpus == sum(p.num_nodes * p.gpus_per_node for p in state.parts)
        for part in state.parts:  # every present device maps back to itself
            for d in range(0, part.num_nodes * part.gpus_per_node, 7):
                assert state.locate(*state.identity(part.name, d)) == (part.name, d)
        net = Network(state.cluster)
        for g in state.cluster.node_groups:
            assert net.within(g.name, g.gpus_per_node) > 0
        assert (net.between(state.parts[0].name, state.parts[-1].name) or 12.5) > 0
    assert steps[-1].state.cluster.num_gpus == (present + 32) * 8


def test_a_link_between_two_nodes_follows_them_through_node_changes() -> None:
    from hetpar.sim import network as net
    from hetpar.specs.cluster import Link

    base = _pcie_cluster()
    cluster = ClusterSpec(name="c", node_groups=base.node_groups, tiers=base.tiers,
                          links=(Link(a="g", b="g", a_nodes=(0,), b_nodes=(3,),
                                      bandwidth_gbps=25.0, latency_us=50.0),))
    steps = _steps(cluster, "10,down,nvlink:g,,1,\n20,leave,group:g,,,1\n")
    # nvlink down on node 1 splits g into g, g@1, g@2: the link now joins g[0] and g@2[1]
    split = steps[1].state.cluster
    assert [(lk.a, lk.a_nodes, lk.b, lk.b_nodes) for lk in split.links] == [
        ("g", (0,), "g@2", (1,))]
    assert split.node_groups[1].scaleup_kind == "pcie"  # NVLink down: the PCIe path's kind
    slow = net.Topology(split).shape([("g", 0), ("g@2", 8)]).outer
    assert slow.scope == "link g-g@2"
    # node 3 leaves: the link has no end left and disappears
    assert steps[2].state.cluster.links == ()
