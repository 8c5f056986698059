"""Expert parallelism in the simulator: the all-to-all, the experts' load, memory and refusals."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetpar import formulas
from hetpar.catalog import load_cluster, load_model, parse_inline_plan
from hetpar.errors import ConfigError, Infeasible
from hetpar.export.nearest import common
from hetpar.runtime.layout import _check_supported
from hetpar.sim import moe, simulate

# Qwen3-30B-A3B's router shape (128 experts, top-8) on a small trunk: fast to simulate.
MOE = dataclasses.replace(load_model("qwen3-30b-a3b"), n_layers=4)
POD = load_cluster("h100-pod-400g")


def _sim(plan: str, model=MOE):
    return simulate(model, POD, parse_inline_plan(plan))


def test_ep_1_means_no_all_to_all() -> None:
    r = _sim("dp=16,gbs=32,micro_batch=1")
    assert "ep_comm" not in r.breakdown and "ep_comm" not in r.to_dict()["breakdown"]
    assert r.experts is None and "experts" not in r.to_dict()
    e = _sim("dp=16,ep=8,gbs=32,micro_batch=1")
    assert e.breakdown["ep_comm"] > 0 and e.to_dict()["experts"]["ep"] == 8


def test_an_ep_group_across_nodes_pays_the_nic() -> None:
    # 8 GPUs per node: ep = 8 stays on NVLink, ep = 16 crosses the 400 Gb/s NICs with the
    # same bytes per GPU (x 15/16 instead of 7/8 leaving it)
    inside, across = (_sim(f"dp=16,ep={ep},gbs=32,micro_batch=1") for ep in (8, 16))
    assert inside.experts is not None and across.experts is not None
    assert inside.experts["ep_group"] == "8 x nvlink4"  # H100: NVLink 4 behind NVSwitch
    assert across.experts["ep_group"].startswith("8 x nvlink4, 2 x ")
    assert across.breakdown["ep_comm"] > 3 * inside.breakdown["ep_comm"]


def test_the_all_to_all_bytes_are_tokens_top_k_hidden() -> None:
    layer = moe.AxisLayer(model=MOE, layer=0, tokens=4096, tp=2, degree=8, element_bytes=2)
    balanced = dataclasses.replace(MOE, expert_load_imbalance=1.0)
    want = 4096 / 2 * 8 * MOE.hidden * 2
    assert moe.dispatch_bytes(dataclasses.replace(layer, model=balanced)) == want
    assert moe.dispatch_bytes(layer) == pytest.approx(want * moe.AUX_LOSS_IMBALANCE)


def test_the_load_default_comes_from_the_router_and_a_capacity_factor_caps_it() -> None:
    assert moe.rank_load(MOE, 1) == 1.0  # every rank holds every expert
    assert moe.rank_load(MOE, 8) == moe.AUX_LOSS_IMBALANCE
    v3 = load_model("deepseek-v3")
    assert v3.router_expert_bias and moe.rank_load(v3, 8) == moe.LOSS_FREE_IMBALANCE
    capped = dataclasses.replace(MOE, expert_load_imbalance=2.0, expert_capacity_factor=1.25)
    assert moe.rank_load(capped, 8) == 1.25
    same = dataclasses.replace(capped, expert_load_imbalance=1.25)
    plan = "dp=16,ep=8,gbs=32,micro_batch=1"
    assert _sim(plan, capped).iteration_time_s == _sim(plan, same).iteration_time_s
    # dropless at the same load: also the dispatcher's host sync (sim/moe_sync.py)
    dropless = dataclasses.replace(same, expert_capacity_factor=None)
    assert _sim(plan, dropless).iteration_time_s > _sim(plan, same).iteration_time_s
    with pytest.raises(ConfigError, match="expert_load_imbalance must be >= 1, got 0.5"):
        dataclasses.replace(MOE, expert_load_imbalance=0.5)


@settings(max_examples=12, deadline=None)
@given(load=st.floats(1.0, 4.0), ep=st.sampled_from([2, 4, 8, 16]),
       tp=st.sampled_from([1, 2]))
def test_a_balanced_router_is_never_slower(load: float, ep: int, tp: int) -> None:
    plan = f"tp={tp},dp={16 // tp},ep={ep},gbs=32,micro_batch=2,sequence_parallel=true"
    fair = _sim(plan, dataclasses.replace(MOE, expert_load_imbalance=1.0))
    skew = _sim(plan, dataclasses.replace(MOE, expert_load_imbalance=load))
    assert fair.iteration_time_s <= skew.iteration_time_s
    assert fair.breakdown["ep_comm"] <= skew.breakdown["ep_comm"]


def test_more_tokens_per_expert_run_faster_grouped_gemms() -> None:
    # ep = 8: each GPU holds 16 of 128 experts, each with 8x the rows of ep = 1's 128
    few = formulas.layer_gemms(MOE, 4096, 1, True, experts=(1, 0, 1.0))
    many = formulas.layer_gemms(MOE, 4096, 1, True, experts=(8, 1, 1.0))
    up = {g.name: g for g in few}["expert_up"], {g.name: g for g in many}["expert_up"]
    assert (up[0].repeat, up[1].repeat) == (128, 16) and up[1].m == 8 * up[0].m
    assert sum(g.flops for g in few) == pytest.approx(sum(g.flops for g in many))
    fair = dataclasses.replace(MOE, expert_load_imbalance=1.0)
    one = _sim("dp=16,gbs=32,micro_batch=1", fair).breakdown["compute"]
    eight = _sim("dp=16,ep=8,gbs=32,micro_batch=1", fair).breakdown["compute"]
    assert eight < one


def test_ep_divides_the_expert_weights_in_memory() -> None:
    plain, split = _sim("dp=16,gbs=32,micro_batch=1"), _sim("dp=16,ep=8,gbs=32,micro_batch=1")
    routed = sum(moe.routed_params(MOE, i) for i in range(MOE.n_layers))
    wb = 2  # bf16 weights
    cut = (plain.memory[0].params - split.memory[0].params)
    assert cut == pytest.approx(routed * (1 - 1 / 8) * wb, rel=1e-9)
    assert split.experts is not None
    assert split.experts["expert_weights_gib"] == pytest.approx(routed / 8 * wb / 2**30)


@pytest.mark.parametrize(("plan", "model", "reason"), [
    ("dp=16,ep=3,gbs=48,micro_batch=1", MOE, "ep=3 does not divide n_experts=128"),
    ("dp=4,pp=4,ep=8,gbs=32,micro_batch=1", MOE, r"ep=8 does not divide dp\(4\) x cp\(1\)"),
    ("dp=16,ep=2,gbs=32,micro_batch=1", load_model("llama3.1-8b"), "is dense"),
    ("tp=2,dp=8,ep=2,etp=4,gbs=32,micro_batch=1", MOE, "etp=4 must be 1 or the tp degree"),
])
def test_impossible_expert_plans_are_infeasible_naming_the_factors(plan, model, reason) -> None:
    with pytest.raises(Infeasible, match=reason):
        _sim(plan, model)


def test_ep_over_tp_when_etp_is_1() -> None:
    # ep = 16 > dp = 8: carved from dp x tp (torchtitan's rule), the group spans 2 nodes
    r = _sim("tp=2,dp=8,ep=16,gbs=32,micro_batch=1,sequence_parallel=true")
    assert r.experts is not None and r.experts["ep_group"].startswith("8 x nvlink4, 2 x ")


def test_run_refuses_ep_with_tp_and_torchtitans_toml_form_does_not_export_it() -> None:
    from hetpar.export import deepspeed, megatron, torchtitan_toml

    plan = parse_inline_plan("tp=2,dp=8,ep=8,gbs=32,micro_batch=1,sequence_parallel=true")
    # the runtime executes EP at tp = 1 only (tests/test_runtime_ep.py)
    with pytest.raises(ConfigError, match="plan: tp=2 with a mixture-of-experts model is not "
                                          "supported by the runtime"):
        _check_supported(plan, MOE)
    with pytest.raises(ConfigError, match="export: ep=8 is not carried by torchtitan's TOML"):
        torchtitan_toml.nearest(plan, MOE)
    assert deepspeed.nearest(plan, MOE)[0].axes == plan.axes  # --ep-size (test_export_moe)
    near, _ = megatron.nearest(plan, MOE)
    args = megatron.arguments(near, MOE)
    at = args.index("--expert-model-parallel-size")
    assert args[at:at + 4] == ["--expert-model-parallel-size", "8",
                               "--expert-tensor-parallel-size", "1"]
    assert "--expert-model-parallel-size" not in megatron.arguments(
        parse_inline_plan("tp=2,dp=8,gbs=32,micro_batch=1"), MOE)
    common(plan, MOE, label="a target")  # exported=True: a target that carries every exported axis


def test_etp_1_keeps_the_experts_whole_on_each_tp_rank() -> None:
    base = "tp=2,dp=8,ep=8,gbs=32,micro_batch=1,sequence_parallel=true"
    whole, split = _sim(base), _sim(base + ",etp=2")
    routed = sum(moe.routed_params(MOE, i) for i in range(MOE.n_layers))
    extra = routed / 8 * (1 - 1 / 2) * 2  # bf16 bytes
    assert whole.memory[0].params - split.memory[0].params == pytest.approx(extra, rel=1e-9)
    assert whole.experts is not None and split.experts is not None
    assert whole.experts["expert_weights_gib"] == pytest.approx(
        2 * split.experts["expert_weights_gib"])


def test_deepep_sends_a_token_once_per_remote_node() -> None:
    from math import comb

    from hetpar.sim.profile import DEFAULT
    deepep = dataclasses.replace(DEFAULT, moe_dispatcher="deepep")
    fair = dataclasses.replace(MOE, expert_load_imbalance=1.0)
    layer = moe.AxisLayer(model=fair, layer=0, tokens=4096, tp=1, degree=16, element_bytes=2)
    from hetpar.placement import place
    from hetpar.sim import network as net
    topo = net.topology(POD)
    mesh = place(MOE, POD, parse_inline_plan("dp=16,ep=16,gbs=32,micro_batch=1"))
    group = mesh.with_experts(16, 1).groups("ep")[0]
    shape = topo.shape([(mesh.ranks[r].group, mesh.ranks[r].device) for r in group])
    nic = [lv for lv in shape.levels if lv.size > 1][-1].path
    # 2 nodes of 64 experts each: a token's top-8 miss the other node with C(64, 8) / C(128, 8)
    touched = 2 * (1 - comb(64, 8) / comb(128, 8))
    token = 4096 * fair.hidden * 2
    want = token * touched * (16 - 8) / 16 / nic.bandwidth
    got = moe.dispatch_time(shape, layer, deepep)
    assert got == pytest.approx(max(want, token * 8 * 7 / 8 / [
        lv for lv in shape.levels if lv.size > 1][0].path.bandwidth) + nic.latency, rel=1e-9)
    assert got < moe.dispatch_time(shape, layer, DEFAULT)  # NCCL sends all 8 copies
    with pytest.raises(ConfigError, match="moe_dispatcher='nccl' unknown"):
        moe.dispatch_time(shape, layer, dataclasses.replace(DEFAULT, moe_dispatcher="nccl"))


def test_a_plan_file_names_ep_by_its_own_key(tmp_path) -> None:
    from hetpar.catalog import load_plan
    from hetpar.io import to_dict

    path = tmp_path / "ep.toml"
    path.write_text("dp = 16\nep = 8\nglobal_batch = 32\nmicro_batch = 1\n")
    plan = load_plan(str(path))
    assert plan.axes == (("ep", 8),) == parse_inline_plan("dp=16,ep=8,gbs=32,mbs=1").axes
    assert _sim("dp=16,ep=8,gbs=32,micro_batch=1").breakdown == simulate(
        MOE, POD, plan).breakdown
    assert to_dict(plan)["ep"] == 8 and "axes" not in to_dict(plan)  # written back as ep = 8


def test_framework_profiles_state_their_moe_behaviour() -> None:
    from hetpar.sim.profile import MOE_DISPATCHERS, resolve

    assert set(MOE_DISPATCHERS) == set(moe.DISPATCHERS)
    mcore = resolve("megatron-core")
    assert (mcore.moe_dispatcher, mcore.ep_overlap) == ("alltoall", 0.0)  # not overlapped
    plan = parse_inline_plan("dp=16,ep=16,gbs=32,micro_batch=1")
    base = simulate(MOE, POD, plan, profile=mcore).breakdown["ep_comm"]
    half = dataclasses.replace(mcore, ep_overlap=0.5)
    # half of each direction hidden, the backward's at most under the forward's compute
    # (axis_terms.comm: exact in test_the_ep_overlap_hides_at_most_the_compute_beside_it)
    assert base / 2 <= simulate(MOE, POD, plan, profile=half).breakdown["ep_comm"] < base


@pytest.mark.parametrize("plan", ["dp=16,ep=16,gbs=32,micro_batch=1",
                                  "tp=2,dp=8,ep=16,gbs=32,micro_batch=1,sequence_parallel=true",
                                  "tp=2,dp=8,ep=8,etp=2,gbs=32,micro_batch=1,sequence_parallel=true"])
def test_uniform_and_explicit_forms_of_an_ep_plan_agree(plan: str) -> None:
    from hetpar.specs.expand import expand

    uniform = parse_inline_plan(plan)
    a, b = _sim(plan), simulate(MOE, POD, expand(uniform, MOE, POD))
    assert b.iteration_time_s == pytest.approx(a.iteration_time_s, rel=1e-9)
    assert b.breakdown["ep_comm"] == pytest.approx(a.breakdown["ep_comm"], rel=1e-9)
    assert a.experts == b.experts


def test_zero_shards_the_experts_over_the_expert_data_parallel_group() -> None:
    # dp 16, ep 8: 2 ranks hold the same experts (edp), all 16 the same dense weights
    plain = _sim("dp=16,gbs=32,micro_batch=1,zero=1").memory[0]
    split = _sim("dp=16,ep=8,gbs=32,micro_batch=1,zero=1").memory[0]
    routed = sum(moe.routed_params(MOE, i) for i in range(MOE.n_layers))
    ob = 12  # fp32 master weights and two Adam moments
    dense_opt = plain.optimizer - routed * ob / 16
    assert split.optimizer == pytest.approx(dense_opt + routed / 8 * ob / 2, rel=1e-9)
    # ep x edp = dp: each expert's states still split 16 ways, as without EP (not 128 ways)
    assert split.optimizer == pytest.approx(plain.optimizer, rel=1e-9)


def test_per_expert_gemm_launches_follow_the_local_experts() -> None:
    """Megatron-Core's TE GroupedLinear issues one GEMM per local expert and matrix; a
    grouped kernel issues one per matrix whatever the expert count; a dense layer, none."""
    from hetpar.sim.profile import resolve

    mcore, grouped = resolve("megatron-core"), resolve("fsdp")
    assert (mcore.expert_gemm, grouped.expert_gemm) == ("per_expert", "grouped")
    routing = moe.ROUTER_KERNELS + moe.EP_EXCHANGE_KERNELS
    # Qwen3-30B-A3B: 128 experts, 16 per rank at ep = 8, 2 at ep = 64
    assert moe.moe_kernels(MOE, 8, mcore) == routing + 2 * (16 - 1)
    assert moe.moe_kernels(MOE, 64, mcore) == routing + 2 * (2 - 1)
    assert moe.moe_kernels(MOE, 8, grouped) == moe.moe_kernels(MOE, 64, grouped) == routing
    assert moe.moe_kernels(MOE, 1, grouped) == moe.ROUTER_KERNELS  # no all-to-all
    assert moe.moe_kernels(load_model("llama3-8b"), 1, mcore) == 0.0


def test_launching_a_gemm_per_expert_is_never_faster() -> None:
    """At 16 experts per rank the launches show in the overhead term, never in compute."""
    from hetpar.sim.profile import resolve

    mcore = resolve("megatron-core")
    plan = parse_inline_plan("dp=8,ep=8,gbs=16,micro_batch=1")
    per = simulate(MOE, POD, plan, profile=mcore)
    one = simulate(MOE, POD, plan, profile=dataclasses.replace(mcore, expert_gemm="grouped"))
    assert per.breakdown["compute"] == one.breakdown["compute"]
    assert per.breakdown["overhead"] > one.breakdown["overhead"]
    assert per.iteration_time_s > one.iteration_time_s


def test_zero3_gathers_only_the_experts_a_gpu_holds() -> None:
    """ZeRO-3's gathered unit: the dense part of the largest layer over dp, plus the GPU's
    routed experts (/ ep) only where an expert-data-parallel group shards them."""
    from hetpar.sim.structure import _max_layer_params

    dense = formulas.layer_params(MOE, 0) - moe.routed_params(MOE, 0)
    routed = moe.routed_params(MOE, 0)
    assert _max_layer_params(MOE) == formulas.layer_params(MOE, 0)
    assert _max_layer_params(MOE, 8, 2) == pytest.approx(dense + routed / 8)
    assert _max_layer_params(MOE, 16, 1) == pytest.approx(dense)  # nothing to gather
    # memory: ep = dp leaves the experts whole, so the working set is the dense part only
    whole = _sim("dp=16,gbs=32,micro_batch=1,zero=3").memory[0]
    ep16 = _sim("dp=16,ep=16,gbs=32,micro_batch=1,zero=3").memory[0]
    assert ep16.other < whole.other


def test_the_ep_overlap_hides_at_most_the_compute_beside_it() -> None:
    """``ep_overlap`` hides that share of the all-to-alls, each beside the compute phase of
    the other micro-batch Megatron-Core pairs it with (combine_bwd | attn_fwd, dispatch_fwd +
    dispatch_bwd | mlp_bwd + mlp_dw + mlp_fwd, combine_fwd | attn_bwd), never more; DeepEP's
    20 SMs make each hidden second cost 20 / sm_count."""
    from hetpar.placement import place
    from hetpar.sim import axis_costs, axis_terms
    from hetpar.sim import network as net
    from hetpar.sim.profile import resolve

    plan = parse_inline_plan("dp=16,ep=16,gbs=32,micro_batch=1")
    mesh = place(MOE, POD, plan)
    group = mesh.with_experts(16, 1).groups("ep")[0]
    shape = net.topology(POD).shape([(mesh.ranks[r].group, mesh.ranks[r].device)
                                     for r in group])
    axes, shapes = axis_costs.costed(plan), {"ep": {0: shape}}
    mcore = resolve("megatron-core")

    def ep(overlap: float, attn: float, mlp: float, dispatcher: str = "alltoall",
           sms: int | None = 132) -> float:
        prof = dataclasses.replace(mcore, ep_overlap=overlap, moe_dispatcher=dispatcher)
        f, b = axis_terms.comm(axes, shapes, 0, MOE, (0, 4), 4096, 1, 2, "none", prof,
                               beside=(attn, mlp), sm_count=sms)["ep_comm"]
        return f + b

    big = 1e3
    full = ep(0.0, big, big)
    assert full > 0 and ep(0.5, big, big) == pytest.approx(full / 2)  # compute >> all-to-all
    assert ep(1.0, big, big) == 0.0 and ep(1.0, 0.0, 0.0) == full
    # no attention to hide the two combines behind; the two dispatches hide behind the MLPs
    assert ep(1.0, 0.0, big) == pytest.approx(full / 2)
    assert ep(1.0, big, 0.0) == pytest.approx(full / 2)  # and the other way round
    one = full / 4 / 4  # one all-to-all of one of the 4 layers
    # attention of half an all-to-all: the backward's combine hides half, the forward's whole
    assert ep(1.0, one / 2, big) == pytest.approx(full / 8)
    deep = ep(0.0, big, big, "deepep")  # DeepEP's own time; hidden whole, 20 of 132 SMs due
    assert ep(1.0, big, big, "deepep") == pytest.approx(deep * 20 / 132)
    assert ep(1.0, big, big, "deepep", sms=None) == 0.0  # SMs not stated: nothing charged
    # an axis cost without a stated pairing hides up to its layer's whole compute, 3 x (a + m)
    (charged, degree), = axes
    plain = ((dataclasses.replace(charged, cost=dataclasses.replace(charged.cost, hidden=None)),
              degree),)
    f, b = axis_terms.comm(plain, shapes, 0, MOE, (0, 4), 4096, 1, 2, "none",
                           dataclasses.replace(mcore, ep_overlap=1.0),
                           beside=(one / 2, one / 2))["ep_comm"]
    assert f + b == pytest.approx(full / 4)  # 4 all-to-alls a layer, 3 of them hidden
