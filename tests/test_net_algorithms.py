"""Collective algorithms against a brute-force event simulation; fair sharing; split."""

import math

import pytest

from hetpar.net import collectives as algo
from hetpar.net import eventsim, links
from hetpar.net.collectives import Level, Path
from hetpar.net.contention import fair_rates
from hetpar.net.links import load_link_kind

BW, LAT = 10e9, 2e-6


def _star(n: int) -> tuple[dict, eventsim.Route]:
    """n ranks on a non-blocking switch: each has its own up and down link (full duplex)."""
    cap = {(r, d): BW for r in range(n) for d in ("up", "down")}
    return cap, lambda a, b: ((a, "up"), (b, "down"))


@pytest.mark.parametrize("n", [2, 3, 5, 8])
@pytest.mark.parametrize("op,phases", [("all_reduce", 2), ("reduce_scatter", 1)])
def test_ring_matches_the_event_simulation(n, op, phases):
    cap, route = _star(n)
    nbytes = 64e6
    sim = eventsim.run(eventsim.ring_transfers(list(range(n)), nbytes, phases, route,
                                               lambda a, b: LAT), cap)
    assert algo.ring([Level(n, Path("x", BW, LAT))], op, nbytes) == pytest.approx(sim, rel=1e-9)


@pytest.mark.parametrize("n", [7])
def test_double_binary_tree_matches_the_event_simulation(n):
    # n = 2^h - 1: every rank is an inner node of exactly one of the two trees (Sanders et al.)
    cap, route = _star(n)
    nbytes = 64e6
    sim = eventsim.run(eventsim.double_tree_transfers(n, nbytes, 64, route, LAT), cap)
    model = algo.tree([Level(n, Path("x", BW, LAT))], "all_reduce", nbytes)
    # the event run also pays the pipeline fill (depth x one chunk), a few percent here
    assert model == pytest.approx(sim, rel=0.05)
    assert model <= sim


def test_hierarchical_matches_the_event_simulation_on_two_nodes():
    # 2 nodes x 2 GPUs: fast links inside a node, a slow NIC per GPU between nodes
    fast, slow = 100e9, 5e9
    cap = {}
    for r in range(4):
        cap[(r, "nvl-up")] = cap[(r, "nvl-down")] = fast
        cap[(r, "nic-up")] = cap[(r, "nic-down")] = slow

    def route(a, b):
        kind = "nvl" if a // 2 == b // 2 else "nic"
        return ((a, f"{kind}-up"), (b, f"{kind}-down"))

    s = 32e6
    ts = []
    ts += eventsim.ring_transfers([0, 1], s, 1, route, lambda a, b: LAT)
    ts_inner = eventsim.run(ts, cap)  # reduce-scatter inside both nodes (concurrently)
    ts2 = eventsim.ring_transfers([0, 2], s / 2, 2, route, lambda a, b: LAT)
    ts2 += eventsim.ring_transfers([1, 3], s / 2, 2, route, lambda a, b: LAT)
    outer = eventsim.run(ts2, cap)  # all-reduce of the shards across, both rails at once
    sim = 2 * ts_inner + outer  # reduce-scatter, across, all-gather (same as reduce-scatter)
    levels = [Level(2, Path("nvl", fast, LAT)), Level(2, Path("nic", slow, LAT))]
    assert algo.hierarchical(levels, "all_reduce", s) == pytest.approx(sim, rel=1e-9)


def test_two_flows_sharing_a_link_each_get_half():
    rates = fair_rates([("l",), ("l",)], {"l": 10.0})
    assert rates == [5.0, 5.0]
    # and in the event simulation: two equal transfers on one link take twice as long
    one = eventsim.run([eventsim.Transfer(("l",), 1e9, 0.0)], {"l": 1e9})
    two = eventsim.run([eventsim.Transfer(("l",), 1e9, 0.0),
                        eventsim.Transfer(("l",), 1e9, 0.0)], {"l": 1e9})
    assert (one, two) == (pytest.approx(1.0), pytest.approx(2.0))


def test_fair_rates_give_a_flow_what_the_bottleneck_leaves():
    # flow 0 crosses a (cap 10) and b (cap 4); flow 1 only a: 0 is held to 2 by b? no: b has
    # one flow, so flow 0 gets 4 and flow 1 the 6 that a has left
    assert fair_rates([("a", "b"), ("a",)], {"a": 10.0, "b": 4.0}) == [4.0, 6.0]


@pytest.mark.parametrize("nbytes", [1e3, 1e5, 1e7, 1e9])
def test_a_split_collective_is_never_slower_than_its_best_single_path(nbytes):
    nvl = [Level(2, Path("nvl", 45e9, 3e-6))]
    pcie = [Level(2, Path("pcie", 12e9, 6e-6))]
    nic = [Level(2, Path("nic", 1e9, 30e-6))]
    costs = [lambda x, lv=lv: algo.ring(lv, "all_reduce", x) for lv in (nvl, pcie, nic)]
    best_single = min(c(nbytes) for c in costs)
    t = algo.split(costs, nbytes)
    assert t <= best_single
    if nbytes >= 1e7:  # big messages gain from the second path: ~ 45 + 12 GB/s
        assert t < 0.85 * best_single


def test_split_shares_finish_together():
    a = lambda x: 1.0 + x / 2.0  # noqa: E731
    b = lambda x: 2.0 + x / 1.0  # noqa: E731
    # equal finish: 1 + x/2 = 2 + (10 - x)  ->  x = 22/3, t = 1 + 11/3
    assert algo.split([a, b], 10.0) == pytest.approx(1 + 11 / 3)


def test_nccl_picks_the_cheaper_of_ring_and_tree():
    levels = [Level(8, Path("n", 10e9, 5e-6)), Level(64, Path("w", 1e9, 50e-6))]
    for s in (1e3, 1e9):
        r, t = algo.ring(levels, "all_reduce", s), algo.tree(levels, "all_reduce", s)
        assert algo.nccl(levels, "all_reduce", s) == min(r, t)
    assert algo.tree(levels, "all_gather", 1e6) == math.inf


def test_all_to_all_is_paced_by_the_busiest_level():
    one = [Level(8, Path("x", BW, LAT))]
    assert algo.all_to_all(one, 8e6) == pytest.approx(LAT + 7 / 8 * 8e6 / BW)
    # 2 nodes of 4: 4/8 of each rank's data leaves its node, over a 10x slower NIC
    two = [Level(4, Path("nvl", BW, LAT)), Level(2, Path("nic", BW / 10, 5 * LAT))]
    assert algo.all_to_all(two, 8e6) == pytest.approx(5 * LAT + 4 / 8 * 8e6 / (BW / 10))


def test_a_registered_policy_algorithm_is_tried_by_its_policies_only():
    """hetpar's own algorithms declare the cluster policies that try them (net/policies.py);
    the simulator's collectives read that registry, so a new one needs no other change."""
    import dataclasses

    from hetpar.catalog import load_cluster
    from hetpar.net import policies
    from hetpar.sim import network as net

    assert [a.name for a in policies.candidates("best")] == ["hierarchical", "type-first", "split"]
    assert [a.name for a in policies.candidates("hierarchical")] == ["hierarchical", "type-first"]
    assert policies.candidates("nccl") == ()
    base = load_cluster("selene-a100")
    devs = [(base.node_groups[0].name, i) for i in range(16)]  # two nodes

    def cost(policy: str) -> float:
        shape = net.Topology(dataclasses.replace(base, collectives=policy)).shape(devs)
        return net.all_reduce(shape, 1e9)

    before = {p: cost(p) for p in ("nccl", "hierarchical", "best")}
    # a toy algorithm at 1 PB/s, tried by the "best" policy only
    policies.register("toy-free", policies=("best",))(lambda comm, op, nbytes: nbytes / 1e15)
    try:
        assert cost("best") == 1e9 / 1e15
        assert cost("hierarchical") == before["hierarchical"]
        assert cost("nccl") == before["nccl"]
    finally:
        policies.unregister("toy-free")
    assert cost("best") == before["best"]


PCIE = load_link_kind("pcie")


def test_ll_gives_way_to_simple_where_the_hand_lines_cross():
    # 2 GPUs over PCIe (LL and Simple only), hop latency = Simple's: ring LL costs
    # base_LL + 2 hop_LL + S / (bw x 1/4), ring Simple base_S + 2 hop_S + S / bw (n = 2: (n-1)/n
    # of the bytes, twice); the tuner switches where the two lines cross
    ll, simple = (next(p for p in PCIE.protocols if p.name == n) for n in ("LL", "Simple"))
    bw, hop = 24e9, simple.hop_latency_us * 1e-6
    levels = [Level(2, Path("pcie", bw, hop, PCIE))]
    a_ll = (ll.base_latency_us + 2 * ll.hop_latency_us) * 1e-6
    a_simple = (simple.base_latency_us + 2 * simple.hop_latency_us) * 1e-6
    cross = (a_simple - a_ll) / (1 / (bw * ll.bandwidth_fraction) - 1 / bw)
    assert 50e3 < cross < 200e3  # about 90 kB with NCCL's 1/4
    assert algo.nccl_choice(levels, "all_reduce", 0.95 * cross) == ("ring", "LL")
    assert algo.nccl_choice(levels, "all_reduce", 1.05 * cross) == ("ring", "Simple")
    t = algo.nccl(levels, "all_reduce", 0.95 * cross)
    assert t == pytest.approx(a_ll + 0.95 * cross / (bw * ll.bandwidth_fraction), rel=1e-12)


@pytest.mark.parametrize("kind", links.names())
@pytest.mark.parametrize("n", [2, 4, 8, 16])
@pytest.mark.parametrize("op", ["all_reduce", "reduce_scatter", "all_gather"])
def test_ll_is_never_chosen_for_large_messages(kind, n, op):
    k = load_link_kind(kind)
    one = [Level(n, Path(kind, 25e9, k.simple.hop_latency_us * 1e-6, k))]
    two = [Level(4, Path("nvl", 250e9, 3.4e-6, load_link_kind("nvlink"))),
           Level(n, Path(kind, 25e9, k.simple.hop_latency_us * 1e-6, k))]
    for levels in (one, two):
        for size in (64 * 2**20, 2**30):
            assert algo.nccl_choice(levels, op, size)[1] != "LL"
        # and a tiny message takes a low-latency protocol (LL, or LL128 where its tree hop
        # latency is the smaller one, as on NVLink), or an algorithm that exists only on Simple
        # and is built for latency (NVLS in the switch, PAT with one GPU per node); a kind with
        # one protocol (`measured`, what hetpar probe fitted) has only the line it measured
        if len(k.protocols) > 1:
            assert algo.nccl_choice(levels, op, 64) not in (
                ("ring", "Simple"), ("tree", "Simple"))
