"""Physical invariants of the simulator (issue "Core": the invariants it must keep)."""

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hetpar.catalog import load_cluster, load_model, parse_inline_plan
from hetpar.errors import ConfigError, Infeasible
from hetpar.sim import simulate
from hetpar.specs.cluster import ClusterSpec, NodeGroup
from hetpar.specs.expand import expand
from hetpar.specs.plan import Plan

MODEL = load_model("llama3.1-8b")
SELENE = load_cluster("selene-a100")


def _cluster(gpu: str, nodes: int = 16) -> ClusterSpec:
    return ClusterSpec(name=gpu, node_groups=(NodeGroup(name="g", gpu=gpu, num_nodes=nodes,
                                                        gpus_per_node=8),))


plans = st.builds(
    lambda tp, pp, dp, mbs, m, rec, zero, sp, sched: Plan(
        tp=tp, pp=pp, dp=dp, micro_batch=mbs, global_batch=dp * mbs * m, recompute=rec,
        zero=zero, sequence_parallel=sp and tp > 1, schedule=sched),
    st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2, 4]), st.sampled_from([1, 2, 3]),
    st.sampled_from([1, 2]), st.integers(1, 8), st.sampled_from(["none", "selective", "full"]),
    st.sampled_from([0, 1, 3]), st.booleans(), st.sampled_from(["1f1b", "gpipe", "zb-h1"]),
)
FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def test_breakdown_adds_up_when_a_later_rank_finishes_last():
    # the LM head makes the last rank's gradient sync and optimizer the latest
    cluster = load_cluster("selene-a100")
    plan = parse_inline_plan("tp=1,pp=4,dp=8,mbs=1,gbs=32,zero=0")
    big_vocab = dataclasses.replace(MODEL, vocab=512000)
    rep = simulate(big_vocab, cluster, plan)
    assert sum(rep.breakdown.values()) == pytest.approx(rep.iteration_time_s, rel=1e-9)


@FAST
@given(plans)
def test_tp1_means_no_tp_traffic_and_pp1_no_bubble(plan):
    rep = simulate(MODEL, SELENE, plan)
    b = rep.breakdown
    assert (b["tp_comm"] == 0) == (plan.tp == 1)
    if plan.pp == 1:
        assert b["bubble"] == 0 and b["pp_comm"] == 0
    else:
        assert b["bubble"] > 0
    if plan.dp == 1:
        assert b["dp_comm"] == 0
    assert sum(b.values()) == pytest.approx(rep.iteration_time_s, rel=1e-9)


@FAST
@given(plans)
def test_doubling_the_batch_never_lowers_throughput_per_gpu(plan):
    bigger = dataclasses.replace(plan, global_batch=2 * plan.batch)
    a, b = simulate(MODEL, SELENE, plan), simulate(MODEL, SELENE, bigger)
    assert b.tokens_per_s_per_gpu >= a.tokens_per_s_per_gpu * (1 - 1e-12)


@FAST
@given(plans)
def test_the_same_plan_on_a_faster_gpu_is_never_slower(plan):
    slow = simulate(MODEL, _cluster("A100-SXM4-80GB"), plan)
    fast = simulate(MODEL, _cluster("H100-SXM5-80GB"), plan)
    assert fast.iteration_time_s <= slow.iteration_time_s


@pytest.mark.parametrize("text", [
    "tp=8,pp=4,dp=4,mbs=1,gbs=64,sp=true,schedule=interleaved,vpp=2",
    "tp=2,pp=2,dp=8,mbs=2,gbs=64,zero=3",
    "tp=4,pp=4,dp=3,mbs=1,gbs=48,schedule=zb-h1",
    "tp=2,pp=3,dp=3,mbs=1,gbs=24",  # pipeline hops not aligned with nodes
    "tp=8,pp=2,dp=2,mbs=1,gbs=16,schedule=gpipe,recompute=full",
])
def test_explicit_form_of_a_uniform_plan_simulates_the_same(text):
    plan = parse_inline_plan(text)
    a = simulate(MODEL, SELENE, plan)
    b = simulate(MODEL, SELENE, expand(plan, MODEL, SELENE))
    assert b.iteration_time_s == pytest.approx(a.iteration_time_s, rel=1e-9)
    assert b.breakdown == pytest.approx(a.breakdown, rel=1e-9)
    assert b.num_gpus == a.num_gpus and b.mfu == pytest.approx(a.mfu, rel=1e-9)
    assert [m.total for m in b.memory[: plan.pp]] == pytest.approx(
        [m.total for m in a.memory[: plan.pp]])


def test_the_slowest_replica_paces_the_iteration():
    cluster = load_cluster("mixed-a100-h100")
    a100, h100 = (g.name for g in cluster.node_groups)
    model = MODEL
    plan = Plan(tp=2, pp=2, dp=2, micro_batch=1, global_batch=16)
    only_a = simulate(model, cluster, dataclasses.replace(plan, group=a100))
    only_h = simulate(model, cluster, dataclasses.replace(plan, group=h100))
    assert only_h.iteration_time_s < only_a.iteration_time_s
    mixed = expand(dataclasses.replace(plan, group=h100), model, cluster)
    slow = expand(dataclasses.replace(plan, group=a100), model, cluster)
    both = dataclasses.replace(mixed, replicas=(mixed.replicas[0], slow.replicas[1]))
    rep = simulate(model, cluster, both)
    assert rep.iteration_time_s >= only_a.iteration_time_s * 0.999


@pytest.mark.parametrize("text,kind", [
    ("tp=3,pp=1,dp=1,mbs=1,gbs=1", "divisibility"),  # 32 heads % 3
    ("tp=16,pp=1,dp=1,mbs=1,gbs=1", "divisibility"),  # 8 KV heads % 16: not replicated
    ("tp=1,pp=64,dp=1,mbs=1,gbs=64", "divisibility"),  # 32 layers < 64 stages
    ("tp=1,cp=3,pp=1,dp=1,mbs=1,gbs=1", "divisibility"),  # seq 8192 % 3
    ("tp=1,pp=4,dp=1,mbs=1,gbs=6,schedule=interleaved,vpp=2", "schedule"),  # 6 % 4
    ("tp=8,pp=8,dp=128,mbs=1,gbs=1024", "devices"),  # 8192 GPUs > 4480
])
def test_plans_that_cannot_run_are_infeasible(text, kind):
    plan = parse_inline_plan(text)
    with pytest.raises(Infeasible) as e:
        simulate(MODEL, SELENE, plan)
    assert e.value.kind == kind


def test_bad_schedule_name_is_a_config_error():
    with pytest.raises(ConfigError, match="schedule"):
        simulate(MODEL, SELENE, parse_inline_plan("tp=1,pp=2,dp=1,mbs=1,gbs=4,schedule=bogus"))


def test_a_replica_at_lower_tp_paces_and_reshards_before_the_sync():
    plan = expand(parse_inline_plan("tp=8,pp=2,dp=2,mbs=1,gbs=16"), MODEL, SELENE)
    r0, r1 = plan.replicas
    narrow = dataclasses.replace(r1, stages=tuple(
        dataclasses.replace(s, tp=4, devices=s.devices[:4]) for s in r1.stages))
    ntp = dataclasses.replace(plan, replicas=(r0, narrow))
    even, mixed = simulate(MODEL, SELENE, plan), simulate(MODEL, SELENE, ntp)
    assert mixed.num_gpus == 24 and len(mixed.memory) == 4  # two replica structures
    assert mixed.iteration_time_s > even.iteration_time_s
    assert mixed.breakdown["dp_comm"] > even.breakdown["dp_comm"]  # resharding first


def test_a_precision_the_gpu_lacks_is_infeasible():
    with pytest.raises(Infeasible) as e:
        simulate(MODEL, SELENE, parse_inline_plan("tp=1,pp=1,dp=1,mbs=1,gbs=1,precision=fp8"))
    assert e.value.kind == "precision" and "A100" in e.value.reason
