"""The placement memo of explicit plans (sim/placed.py) gives the reports of a fresh placement."""

import pytest
from hypothesis import given, seed, settings
from hypothesis import strategies as st

from hetpar.catalog import load_cluster, load_model
from hetpar.errors import ConfigError, Infeasible
from hetpar.sim import core, layout
from hetpar.sim import network as net
from hetpar.specs.job import Job
from hetpar.specs.plan import Plan
from hetpar.specs.stage import Replica, Stage

MODEL = load_model("llama3.1-8b")
CLUSTERS = [load_cluster("mixed-a100-h100"), load_cluster("v100-a100")]


@st.composite
def _layers(draw: st.DrawFn, chunks: int) -> tuple[tuple[int, int], ...]:
    """A random split of the model's layers into ``chunks`` non-empty ranges."""
    cuts = sorted(draw(st.sets(st.integers(1, MODEL.n_layers - 1), min_size=chunks - 1,
                               max_size=chunks - 1)))
    ends = [0, *cuts, MODEL.n_layers]
    return tuple(zip(ends, ends[1:], strict=False))


@st.composite
def _plans(draw: st.DrawFn) -> tuple[int, Plan, Plan]:
    """Two heterogeneous plans of one stage structure, differing in layers and batch."""
    ci = draw(st.integers(0, len(CLUSTERS) - 1))
    groups = [g.name for g in CLUSTERS[ci].node_groups]
    pp, vpp = draw(st.integers(1, 3)), draw(st.sampled_from([1, 2]))
    kinds = draw(st.lists(st.lists(st.tuples(st.sampled_from(groups), st.sampled_from([1, 2, 4])),
                                   min_size=pp, max_size=pp), min_size=1, max_size=2))
    pattern = draw(st.lists(st.integers(0, len(kinds) - 1), min_size=1, max_size=5))
    zero = draw(st.sampled_from([0, 1, 3]))
    scope = draw(st.sampled_from(["all", "group"])) if zero else "all"
    mb = draw(st.sampled_from([1, 2]))

    def plan() -> Plan:
        reps = []
        for k in pattern:
            rng = draw(_layers(pp * vpp))
            stages = tuple(Stage(layers=r, group=kinds[k][j % pp][0], tp=kinds[k][j % pp][1])
                           for j, r in enumerate(rng))
            reps.append(Replica(stages=stages, batch=mb * draw(st.integers(1, 4)),
                                micro_batch=mb))
        return Plan(name="p", replicas=tuple(reps), vpp=vpp, zero=zero, zero_scope=scope,
                    precision="bf16")

    return ci, plan(), plan()


def _report(ci: int, plan: Plan, memo: bool) -> dict[str, object] | str:
    """The plan's report as a dict (or its error), placed afresh or from the memo."""
    job = Job(name="j", global_batch=plan.batch, seq_len=2048, precision="bf16")
    saved = core.layouts
    if not memo:
        core.layouts = lambda m, c, p, n=None: layout.layouts(m, c, p, n, memo=False)
    try:
        return core.simulate(MODEL, CLUSTERS[ci], plan, job).to_dict()
    except (ConfigError, Infeasible) as e:
        return f"{type(e).__name__}: {e}"
    finally:
        core.layouts = saved


@seed(36)
@settings(max_examples=40, deadline=None)
@given(_plans())
def test_memoized_placement_reports_equal_fresh_ones(case: tuple[int, Plan, Plan]) -> None:
    ci, a, b = case
    net.topology(CLUSTERS[ci]).placed.clear()
    first = _report(ci, a, memo=True)  # places a's structure; b reuses it
    second = _report(ci, b, memo=True)
    assert first == _report(ci, a, memo=False)
    assert second == _report(ci, b, memo=False)


def test_a_second_plan_of_one_structure_reuses_the_placement() -> None:
    stages = (Stage(layers=(0, 20), group="h100", tp=2), Stage(layers=(20, 32), group="a100", tp=2))
    a = Plan(name="p", replicas=(Replica(stages=stages, batch=4, micro_batch=1),) * 3)
    moved = (Stage(layers=(0, 18), group="h100", tp=2), Stage(layers=(18, 32), group="a100", tp=2))
    b = Plan(name="p", replicas=(Replica(stages=moved, batch=4, micro_batch=1),) * 3)
    topo = net.topology(CLUSTERS[0])
    topo.placed.clear()
    lays_a, _ = layout.layouts(MODEL, CLUSTERS[0], a)
    lays_b, _ = layout.layouts(MODEL, CLUSTERS[0], b)
    assert len(topo.placed) == 1
    assert [c.layers for c in lays_b[0].chunks] == [(0, 18), (18, 32)]
    assert lays_a[0].chunks[0].devices == lays_b[0].chunks[0].devices
    assert lays_b[0].replicas == (0, 1, 2)


def test_an_ep_plan_from_the_memo_keeps_each_layouts_expert_groups() -> None:
    # Qwen3-30B-A3B's router on a 4-layer trunk; the second plan moves a layer: same placement
    import dataclasses

    from hetpar.catalog import parse_inline_plan
    from hetpar.specs.expand import expand

    moe = dataclasses.replace(load_model("qwen3-30b-a3b"), n_layers=4)
    pod = load_cluster("h100-pod-400g")
    a = expand(parse_inline_plan("tp=2,pp=2,dp=4,ep=8,gbs=16,micro_batch=1"), moe, pod)
    moved = tuple(Replica(stages=(dataclasses.replace(r.stages[0], layers=(0, 1)),
                                  dataclasses.replace(r.stages[1], layers=(1, 4))),
                          batch=r.batch, micro_batch=r.micro_batch) for r in a.replicas)
    b = dataclasses.replace(a, replicas=moved)
    net.topology(pod).placed.clear()
    for plan in (a, b):
        job = Job(name="j", global_batch=plan.batch, seq_len=2048, precision="bf16")
        memo, _ = layout.layouts(moe, pod, plan)
        fresh, _ = layout.layouts(moe, pod, plan, memo=False)
        # keys differ by construction (placed.layouts: class, batch, layers); all else equal
        assert [dataclasses.replace(lay, key=()) for lay in memo] == [
            dataclasses.replace(lay, key=()) for lay in fresh]
        assert {"ep", "edp"} <= set(memo[0].axis_shapes)
        assert core.simulate(moe, pod, plan, job).experts is not None
    assert len(net.topology(pod).placed) == 1


def test_the_memo_drops_the_least_recently_used_placement(monkeypatch) -> None:
    from hetpar.sim import placed

    def plan(tp: int) -> Plan:
        st = (Stage(layers=(0, 16), group="h100", tp=tp), Stage(layers=(16, 32), group="a100",
                                                                 tp=tp))
        return Plan(name="p", replicas=(Replica(stages=st, batch=4, micro_batch=1),) * 2)

    monkeypatch.setattr(placed, "MAX_SKELETONS", 2)
    topo = net.topology(CLUSTERS[0])
    topo.placed.clear()
    a, b, c = plan(1), plan(2), plan(4)
    for p in (a, b, a, c):  # a used again after b: b is the least recent when c comes
        layout.layouts(MODEL, CLUSTERS[0], p)
    costed = ()
    assert list(topo.placed) == [placed.structure(a, costed), placed.structure(c, costed)]


def test_the_memo_keeps_each_network_variant_apart() -> None:
    """A stage structure placed on the nominal network is not reused under forced collectives
    or an alternative network model (their topology variants keep their own memo): each
    report equals the fresh placement's."""
    import dataclasses

    from hetpar.specs.collectives import Collectives, NetworkModel

    cluster = CLUSTERS[0]
    groups = [g.name for g in cluster.node_groups]
    half = MODEL.n_layers // 2
    rep = Replica(stages=(Stage(layers=(0, half), group=groups[0], tp=2),
                          Stage(layers=(half, MODEL.n_layers), group=groups[1], tp=2)),
                  batch=8, micro_batch=1)
    plan = Plan(name="p", replicas=(rep, rep), zero=1, precision="bf16")
    job = Job(name="j", global_batch=plan.batch, seq_len=2048, precision="bf16")
    net.topology(cluster).placed.clear()
    nominal = core.simulate(MODEL, cluster, plan, job).to_dict()  # fills the nominal memo
    forced = dataclasses.replace(plan, collectives=Collectives(algorithm="ring", dp_sync="flat"))
    slow = NetworkModel(name="slow", scale_out_efficiency=0.3)
    for p, model in ((forced, None), (plan, slow)):
        memo = core.simulate(MODEL, cluster, p, job, network=model).to_dict()
        saved = core.layouts
        core.layouts = lambda m, c, q, n=None: layout.layouts(m, c, q, n, memo=False)
        try:
            fresh = core.simulate(MODEL, cluster, p, job, network=model).to_dict()
        finally:
            core.layouts = saved
        assert memo == fresh
    assert nominal != core.simulate(MODEL, cluster, plan, job, network=slow).to_dict()


def _ep_pair(ep: int, splits: tuple[int, ...], tp: int = 2,
             etp: int = 1) -> tuple[object, object, Plan, Plan]:
    """Qwen3-30B-A3B on a 4-layer trunk, tp,pp=2,dp=4 at ``ep``, ``etp``: plan a with one layer
    split, plan b of a's stage structure whose replica i cuts its trunk at ``splits[i]``
    (replicas hold the same shard, and so form dp's and the expert view's groups, only where
    their cuts agree)."""
    import dataclasses

    from hetpar.catalog import parse_inline_plan
    from hetpar.specs.expand import expand

    moe = dataclasses.replace(load_model("qwen3-30b-a3b"), n_layers=4)
    pod = load_cluster("h100-pod-400g")
    inline = f"tp={tp},pp=2,dp=4,ep={ep},etp={etp},gbs=16,micro_batch=1"
    a = expand(parse_inline_plan(inline), moe, pod)
    moved = tuple(Replica(stages=(dataclasses.replace(r.stages[0], layers=(0, cut)),
                                  dataclasses.replace(r.stages[1], layers=(cut, 4))),
                          batch=r.batch, micro_batch=r.micro_batch)
                  for r, cut in zip(a.replicas, splits, strict=True))
    return moe, pod, a, dataclasses.replace(a, replicas=moved)


def _verdict(moe, pod, plan: Plan, memo: bool) -> object:
    """The plan's report (or its error) and its layouts, from the memo or placed afresh."""
    import dataclasses

    job = Job(name="j", global_batch=plan.batch, seq_len=2048, precision="bf16")
    saved = core.layouts
    if not memo:
        core.layouts = lambda m, c, p, n=None: layout.layouts(m, c, p, n, memo=False)
    try:
        lays, _ = core.layouts(moe, pod, plan)
        # keys differ by construction (placed.layouts: class, batch, layers); all else equal
        return (core.simulate(moe, pod, plan, job).to_dict(),
                [dataclasses.replace(lay, key=()) for lay in lays])
    except (ConfigError, Infeasible) as e:
        return f"{type(e).__name__}: {e}"
    finally:
        core.layouts = saved


def test_replicas_split_apart_are_not_priced_from_an_ep_placement_of_one_split() -> None:
    # ep=8 over dp x tp = 8 ranks per pipeline rank: with two cuts each shard group holds 4
    moe, pod, a, b = _ep_pair(8, (2, 2, 1, 1))
    net.topology(pod).placed.clear()
    assert isinstance(_verdict(moe, pod, a, memo=True), tuple)  # places a's structure
    fresh = _verdict(moe, pod, b, memo=False)
    assert fresh == ("Infeasible: divisibility: mesh: ep=8 does not divide "
                     "dp(2) x cp(1) x tp(2) = 4")
    assert _verdict(moe, pod, b, memo=True) == fresh


@pytest.mark.parametrize("splits", [(1, 2, 1, 2), (2, 1, 1, 2), (1, 1, 2, 2)])
def test_an_ep_plan_from_the_memo_groups_its_experts_by_its_own_splits(splits) -> None:
    # ep=4 fits either way, but the expert groups join the replicas that cut alike
    moe, pod, a, b = _ep_pair(4, splits)
    net.topology(pod).placed.clear()
    _verdict(moe, pod, a, memo=True)
    memo, fresh = _verdict(moe, pod, b, memo=True), _verdict(moe, pod, b, memo=False)
    assert isinstance(fresh, tuple)
    assert memo == fresh


@seed(36)
@settings(max_examples=20, deadline=None)
@given(st.sampled_from([1, 2]), st.sampled_from([2, 4, 8]),
       st.lists(st.tuples(st.lists(st.integers(1, 3), min_size=4, max_size=4), st.booleans(),
                          st.booleans()), min_size=2, max_size=3))
def test_ep_plans_of_replicas_split_apart_from_the_memo_equal_fresh_ones(
        tp: int, ep: int, cuts: list[tuple[list[int], bool, bool]]) -> None:
    """Plans of one stage structure, each replica cutting its layers where drawn, expert
    tensor parallelism 1 or tp, experts split evenly or not (EP rank 0 holding ep - 1 more
    of the 128), one after another on one memo: each report (or refusal) is the fresh
    placement's."""
    import dataclasses

    pod, plans = None, []
    for c, etp, uneven in cuts:
        moe, pod, _, b = _ep_pair(ep, tuple(c), tp, tp if etp else 1)
        base = moe.n_experts // ep
        counts = (base + ep - 1, *(base - 1 for _ in range(ep - 1)))
        plans.append(dataclasses.replace(b, experts_per_rank=counts) if uneven else b)
    assert pod is not None
    net.topology(pod).placed.clear()
    for plan in plans:
        assert _verdict(moe, pod, plan, memo=True) == _verdict(moe, pod, plan, memo=False)


def test_the_planners_ranked_ep_plans_price_as_fresh_placements(tmp_path) -> None:
    """A search of Qwen3-30B-A3B over ep and etp on 2 x 2 A100 + 2 x 2 H100: each ranked plan,
    polished or not, simulates with a fresh placement to its ranked figure. Before the memo
    keyed the axis degrees, 'ep2 etp2 ... polished' was ranked second at 24,422 tokens/s from
    an etp = 1 plan's expert groups (14,959 placed fresh)."""
    from test_search_expert_speed import CLUSTER

    from hetpar.search import SearchSpace, search

    path = tmp_path / "mix8.toml"
    path.write_text(CLUSTER, encoding="utf-8")
    cluster, moe = load_cluster(str(path)), load_model("qwen3-30b-a3b")
    job = Job(global_batch=64, seq_len=4096)
    space = SearchSpace(tp=(1, 2), pp=(1, 2, 4), micro_batch=(1,), recompute=("full",),
                        zero=(1,), schedule=("1f1b",), vpp=(1,), widen_vpp=False,
                        axes={"ep": (2, 4, 8)}, zero_scope=("all",))
    ranked = search(moe, cluster, job, space, workers=1).ranked
    assert any(r.plan.degree("ep") > 1 for r in ranked)
    saved = core.layouts
    core.layouts = lambda m, c, p, n=None: layout.layouts(m, c, p, n, memo=False)
    try:
        fresh = [core.simulate(moe, cluster, r.plan, job).tokens_per_s for r in ranked]
    finally:
        core.layouts = saved
    assert fresh == pytest.approx([r.evaluation.tokens_per_s for r in ranked], rel=1e-9)


@pytest.mark.parametrize("ep", [2, 4])
def test_an_etp_plan_is_not_priced_from_the_expert_groups_of_etp_1(ep: int) -> None:
    # etp = tp carves ep from dp x cp only, etp = 1 from dp x cp x tp: other EP groups
    moe, pod, _, one = _ep_pair(ep, (2, 2, 2, 2), tp=2, etp=1)
    _, _, _, two = _ep_pair(ep, (2, 2, 2, 2), tp=2, etp=2)
    net.topology(pod).placed.clear()
    _verdict(moe, pod, one, memo=True)
    memo, fresh = _verdict(moe, pod, two, memo=True), _verdict(moe, pod, two, memo=False)
    assert isinstance(fresh, tuple)
    assert memo == fresh
