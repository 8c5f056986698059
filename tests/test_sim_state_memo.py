"""Memos shared across cluster states (placements, line tables, lock-step makespans, equal
clusters' topologies) give the reports a simulation with every memo empty gives."""

import dataclasses

from hypothesis import given, seed, settings
from hypothesis import strategies as st

from hetpar.catalog import load_cluster, load_model
from hetpar.errors import ConfigError, Infeasible
from hetpar.sim import core, layout, lockstep, netmodel, placed
from hetpar.sim import network as net
from hetpar.specs.cluster import ClusterSpec
from hetpar.specs.job import Job
from hetpar.specs.plan import Plan
from hetpar.specs.stage import Replica, Stage

MODEL = load_model("llama3.1-8b")
CLUSTERS = [load_cluster("mixed-a100-h100"), load_cluster("v100-a100")]


def _state(cluster: ClusterSpec, tier: float, nic: float) -> ClusterSpec:
    """A new cluster state: tiers' bandwidth times ``tier``, the first group's NICs ``nic``
    (a new object each time, as replay derives them)."""
    g0 = cluster.node_groups[0]
    return dataclasses.replace(
        cluster,
        tiers=tuple(dataclasses.replace(t, bandwidth_gbps=t.bandwidth_gbps * tier)
                    for t in cluster.tiers),
        node_groups=(dataclasses.replace(g0, nic_bandwidth_gbps=g0.nic_bandwidth_gbps * nic),
                     *cluster.node_groups[1:]))


@st.composite
def _plans(draw: st.DrawFn) -> tuple[int, Plan]:
    """A heterogeneous explicit plan, lock-step (DeepSpeed) or event-driven."""
    ci = draw(st.integers(0, len(CLUSTERS) - 1))
    groups = [g.name for g in CLUSTERS[ci].node_groups]
    pp = draw(st.integers(1, 4))
    reps = []
    for _ in range(draw(st.integers(1, 4))):
        cuts = sorted(draw(st.sets(st.integers(1, MODEL.n_layers - 1), min_size=pp - 1,
                                   max_size=pp - 1)))
        ends = [0, *cuts, MODEL.n_layers]
        stages = tuple(Stage(layers=(a, b), group=draw(st.sampled_from(groups)),
                             tp=draw(st.sampled_from([1, 2, 4])))
                       for a, b in zip(ends, ends[1:], strict=False))
        reps.append(Replica(stages=stages, batch=draw(st.integers(1, 12)), micro_batch=1))
    return ci, Plan(name="p", replicas=tuple(reps), zero=draw(st.sampled_from([0, 1])),
                    precision="bf16", p2p_blocking=draw(st.booleans()))


def _report(cluster: ClusterSpec, plan: Plan) -> dict[str, object] | str:
    job = Job(name="j", global_batch=plan.batch, seq_len=2048, precision="bf16")
    try:
        return core.simulate(MODEL, cluster, plan, job).to_dict()
    except (ConfigError, Infeasible) as e:
        return f"{type(e).__name__}: {e}"


def _fresh(cluster: ClusterSpec, plan: Plan) -> dict[str, object] | str:
    """The report with every memo empty and the plan placed afresh."""
    for memo in (placed._PLACED, netmodel._LINES, lockstep._SPANS, net._BY_VALUE,
                 net._TOPOLOGIES):
        memo.clear()
    lockstep._compiled.cache_clear()
    saved = core.layouts
    core.layouts = lambda m, c, p, n=None: layout.layouts(m, c, p, n, memo=False)
    try:
        return _report(cluster, plan)
    finally:
        core.layouts = saved


@seed(36)
@settings(max_examples=30, deadline=None)
@given(_plans(), st.lists(st.tuples(st.sampled_from([0.25, 0.5, 1.0, 2.0]),
                                    st.sampled_from([0.5, 1.0])), min_size=2, max_size=3))
def test_reports_across_states_equal_fresh_ones(case: tuple[int, Plan],
                                                states: list[tuple[float, float]]) -> None:
    ci, plan = case
    seen = [(c, _report(c, plan)) for c in (_state(CLUSTERS[ci], *f) for f in states)]
    for cluster, report in seen:  # each after the states before it filled the memos
        assert report == _fresh(cluster, plan)


def test_equal_clusters_share_one_topology() -> None:
    a, b = _state(CLUSTERS[0], 0.5, 1.0), _state(CLUSTERS[0], 0.5, 1.0)
    assert a is not b
    assert net.topology(a) is net.topology(b)
    assert net.topology(_state(CLUSTERS[0], 0.25, 1.0)) is not net.topology(a)


def test_placements_kept_across_states_drop_the_least_recent(monkeypatch) -> None:
    def plan(tp: int) -> Plan:
        st = (Stage(layers=(0, 16), group="h100", tp=tp), Stage(layers=(16, 32), group="a100",
                                                                 tp=tp))
        return Plan(name="p", replicas=(Replica(stages=st, batch=4, micro_batch=1),) * 2)

    monkeypatch.setattr(placed, "MAX_PLACED", 2)
    placed._PLACED.clear()
    a, b, c = plan(1), plan(2), plan(4)
    for i, p in enumerate((a, b, a, c)):  # each on a new state: only the cross-state memo
        layout.layouts(MODEL, _state(CLUSTERS[0], 1.0 + i, 1.0), p)
    assert [k[0] for k in placed._PLACED] == [placed.structure(a, ()), placed.structure(c, ())]


def test_a_uniform_ep_plans_expert_groups_follow_the_network_variant() -> None:
    """The uniform fast path's expert groups (ep_groups.uniform_experts) are memoized per
    network variant (the mesh they are read from per placement): after the nominal network
    filled the memo, a slower network model or forced collectives price the EP all-to-all as
    with the memos empty (before: the nominal groups were reused, ep_comm 0.035 s where fresh
    is 0.116 s under the slow model)."""
    from hetpar.catalog import parse_inline_plan
    from hetpar.sim import ep_groups
    from hetpar.specs.collectives import Collectives, NetworkModel

    moe = dataclasses.replace(load_model("qwen3-30b-a3b"), n_layers=4)
    pod = load_cluster("h100-pod-400g")
    plan = parse_inline_plan("tp=1,pp=2,dp=16,ep=16,gbs=64,micro_batch=1")
    job = Job(name="j", global_batch=64, seq_len=2048, precision="bf16")
    forced = dataclasses.replace(plan, collectives=Collectives(algorithm="ring",
                                                               dp_sync="flat"))
    slow = NetworkModel(name="slow", scale_out_efficiency=0.3)
    for p, model in ((plan, slow), (forced, None)):
        ep_groups._UNIFORM.clear()
        ep_groups._MESHES.clear()
        core.simulate(moe, pod, plan, job)  # the nominal network fills the memo
        memo = core.simulate(moe, pod, p, job, network=model).to_dict()
        ep_groups._UNIFORM.clear()
        ep_groups._MESHES.clear()
        assert memo == core.simulate(moe, pod, p, job, network=model).to_dict()
    slow_ep = core.simulate(moe, pod, plan, job, network=slow).breakdown["ep_comm"]
    assert slow_ep > core.simulate(moe, pod, plan, job).breakdown["ep_comm"]
