"""Pipeline-engine physics: fp32 gradient reduce, tied-embedding reduce, p2p split and mask."""

import dataclasses

import pytest

from hetpar.catalog import load_job, load_model, load_plan
from hetpar.errors import ConfigError
from hetpar.sim import network as net
from hetpar.sim import simulate
from hetpar.sim.lockstep import makespan as lockstep_makespan
from hetpar.sim.lockstep import train_schedule
from hetpar.sim.network import topology
from hetpar.sim.profile import resolve
from hetpar.validation_hetero import BUNDLED, load_run_cluster

BASE = BUNDLED.parent
MODEL = load_model(str(BASE / "models" / "amp-gpt2-medium.toml"))


def _run(run_id):
    run = BASE / run_id
    return load_run_cluster(run / "cluster.toml"), load_plan(str(run / "plan.toml"))


def test_fp32_gradient_reduce_doubles_the_data_parallel_bytes():
    cluster, plan = _run("amp-hc-21")  # dp16 over 4 nodes: the reduce is the tail
    fp32 = simulate(MODEL, cluster, plan).breakdown["dp_comm"]
    own = simulate(MODEL, cluster, dataclasses.replace(plan, grad_reduce_dtype=None))
    ratio = fp32 / own.breakdown["dp_comm"]
    assert 1.9 < ratio <= 2.0, ratio


def test_tied_embedding_reduce_joins_first_and_last_stage():
    cluster, plan = _run("amp-hc-02")  # dp1 pp16: no data-parallel reduce at all
    tied = simulate(MODEL, cluster, plan)
    untied = simulate(dataclasses.replace(MODEL, tied_embeddings=False), cluster, plan)
    assert untied.breakdown["dp_comm"] == 0.0
    # V x h fp16 gradient, all-reduced between a V100 of node 0 and a T4 of node 3
    topo = topology(cluster)
    first, last = plan.replicas[0].stages[0], plan.replicas[0].stages[-1]
    shape = topo.shape([(first.group, first.devices[0]), (last.group, last.devices[0])])
    expect = net.all_reduce(shape, MODEL.vocab * MODEL.hidden * 2.0)
    assert tied.breakdown["dp_comm"] == pytest.approx(expect, rel=1e-6)
    assert tied.iteration_time_s - untied.iteration_time_s == pytest.approx(expect, rel=0.05)


def test_deepspeed_p2p_sends_whole_gradients_and_the_mask():
    cluster, plan = _run("amp-hc-36")  # tp4 pp4
    base = dataclasses.replace(plan, p2p_split="scatter-gather", p2p_attention_mask=False)
    reps = {k: simulate(MODEL, cluster, dataclasses.replace(base, **kw))
            for k, kw in {"sg": {}, "fwd": {"p2p_split": "forward"}, "none": {"p2p_split": "none"},
                          "mask": {"p2p_attention_mask": True}}.items()}
    t = {k: r.breakdown["pp_comm"] for k, r in reps.items()}
    # whole gradients (forward) or whole tensors (none) cost more than 1/tp of each
    assert t["sg"] < t["fwd"] and t["sg"] < t["none"]
    # the mask rides on forward sends, which the last (critical) stage never makes
    assert reps["mask"].iteration_time_s > reps["sg"].iteration_time_s


def test_p2p_split_does_not_matter_without_tensor_parallelism():
    cluster, plan = _run("amp-hc-02")  # tp1
    a = simulate(MODEL, cluster, dataclasses.replace(plan, p2p_split="scatter-gather"))
    b = simulate(MODEL, cluster, dataclasses.replace(plan, p2p_split="none"))
    assert a.iteration_time_s == b.iteration_time_s


def test_blocking_p2p_puts_each_transfer_on_both_ends():
    cluster, plan = _run("amp-hc-02")  # pp16 over four nodes
    free = simulate(MODEL, cluster, dataclasses.replace(plan, p2p_blocking=False))
    held = simulate(MODEL, cluster, dataclasses.replace(plan, p2p_blocking=True))
    assert held.iteration_time_s > free.iteration_time_s
    assert held.breakdown["pp_comm"] > free.breakdown["pp_comm"]
    cluster, plan = _run("amp-hc-21")  # no pipeline: nothing to block on
    a = simulate(MODEL, cluster, dataclasses.replace(plan, p2p_blocking=False))
    b = simulate(MODEL, cluster, dataclasses.replace(plan, p2p_blocking=True))
    assert a.iteration_time_s == b.iteration_time_s


@pytest.mark.parametrize(("pp", "m"), [(4, 8), (3, 5), (2, 1), (16, 32), (5, 2)])
def test_deepspeed_train_schedule_runs_every_pass_once_in_order(pp, m):
    steps = train_schedule(pp, m)
    assert len(steps) == 2 * (m + pp - 1)
    when = {(s, a): t for t, row in enumerate(steps) for s, a in enumerate(row) if a}
    for s in range(pp):
        for mb in range(m):
            assert when[(s, (True, mb))] < when[(s, (False, mb))]
            if s:  # forward flows down, the gradient flows back up
                assert when[(s - 1, (True, mb))] < when[(s, (True, mb))]
                assert when[(s, (False, mb))] < when[(s - 1, (False, mb))]
    assert len(when) == 2 * pp * m


def test_lockstep_uniform_pipeline_is_the_1f1b_closed_form():
    # (m + p - 1)(F + B) for equal stages without transfers (Narayanan et al. 2021 Sec. 2.2)
    assert lockstep_makespan([1.0] * 4, [2.0] * 4, [0.0] * 3, [0.0] * 3, 8) == 33.0
    # a transfer is waited for by both ends but only once on the critical path
    with_xfer = lockstep_makespan([1.0] * 2, [2.0] * 2, [0.5], [0.5], 4)
    assert (4 + 1) * 3.0 < with_xfer < (4 + 1) * 3.0 + 2 * 4 * 1.0


def test_blocking_p2p_is_only_defined_for_deepspeeds_schedule():
    cluster, plan = _run("amp-hc-02")
    with pytest.raises(ConfigError, match="p2p_blocking"):
        simulate(MODEL, cluster, dataclasses.replace(plan, schedule="gpipe", p2p_blocking=True))


JOB = "gbs=32,seq_len=1024,precision=fp16"


def test_the_framework_decides_blocking_unless_the_plan_says_otherwise():
    cluster, plan = _run("amp-hc-02")  # pp16, p2p_blocking not stated in the plan
    assert plan.p2p_blocking is None
    for fw in ("megatron-deepspeed", "deepspeed"):
        assert resolve(fw).p2p_blocking and resolve(fw).p2p_split == "scatter-gather"
    # no framework named: 1F1B exchanges block both ends (Megatron-LM and DeepSpeed both wait)
    assert resolve().p2p_blocking and not resolve("megatron-lm").p2p_blocking
    ds_job = load_job(JOB + ",framework=megatron-deepspeed")
    ds = simulate(MODEL, cluster, plan, ds_job)
    held = simulate(MODEL, cluster, dataclasses.replace(plan, p2p_blocking=True), ds_job)
    off = simulate(MODEL, cluster, dataclasses.replace(plan, p2p_blocking=False), ds_job)
    assert ds.iteration_time_s == held.iteration_time_s
    assert off.iteration_time_s < ds.iteration_time_s  # an explicit plan value wins
    lm_job = load_job(JOB + ",framework=megatron-lm")
    lm = simulate(MODEL, cluster, plan, lm_job)
    lm_off = simulate(MODEL, cluster, dataclasses.replace(plan, p2p_blocking=False), lm_job)
    assert lm.iteration_time_s == lm_off.iteration_time_s


def test_a_framework_lockstep_engine_leaves_other_schedules_to_the_executor():
    cluster, plan = _run("amp-hc-02")
    ds_job = load_job(JOB + ",framework=megatron-deepspeed")
    gpipe = dataclasses.replace(plan, schedule="gpipe")
    assert simulate(MODEL, cluster, gpipe, ds_job).iteration_time_s == simulate(
        MODEL, cluster, dataclasses.replace(gpipe, p2p_blocking=False), ds_job).iteration_time_s


def test_a_plan_p2p_split_overrides_the_framework():
    cluster, plan = _run("amp-hc-36")  # tp4 pp4, the plan states AMP's DeepSpeed "forward"
    job = load_job(JOB + ",framework=megatron-deepspeed")
    stated = simulate(MODEL, cluster, plan, job)
    framework = simulate(MODEL, cluster, dataclasses.replace(plan, p2p_split=None), job)
    # whole gradients (forward) cost more than the framework's 1/tp each way
    assert framework.breakdown["pp_comm"] < stated.breakdown["pp_comm"]
