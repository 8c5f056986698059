"""Each cost term of the simulator, of the failure study's SimCost, of replay's
AnalyticThroughput and of the search's bounds is held to a hand-derived figure or to the
simulator tightly enough that removing it fails (issue 34).

``bench/mutation.py`` zeroes one term at a time; these are the tests that kill the mutations
the older, looser tests let through (tests/test_analytic_vs_sim.py's factor of 3). Measured
on 2026-12-07 (each assertion prints its figure when it fails): AnalyticThroughput gives
0.45-0.51x the simulator's iteration time less its optimizer step and overhead (terms the
closed form leaves out) on 16 L40S over PCIe with gpt-neo-2.7b; each test compares two plans
that differ in one term, so the common factor cancels.
"""

from __future__ import annotations

import pytest

from hetpar import formulas
from hetpar.catalog import gpu_spec, load_model
from hetpar.dynamic.cost import AnalyticThroughput
from hetpar.dynamic.state import timeline
from hetpar.dynamic.trace import parse_csv
from hetpar.search.bounds import ClassLines
from hetpar.search.candidates import Knobs
from hetpar.search.costmodel import StageCost, StateBytes
from hetpar.search.simtail import SimTail
from hetpar.search.structures import ReplicaClass, Slot, Structure
from hetpar.sim import simulate
from hetpar.sim.profile import resolve
from hetpar.specs.cluster import ClusterSpec, NodeGroup
from hetpar.specs.job import Job
from hetpar.specs.plan import Plan

MODEL = load_model("gpt-neo-2.7b")
# PCIe L40S: TP collectives are a large share of a step (the simulator's tp_comm ~52% at TP=4)
GROUP = NodeGroup(name="g", gpu="L40S", num_nodes=2, gpus_per_node=8)
CLUSTER = ClusterSpec(name="l40s", node_groups=(GROUP,))
SEQ = 2048


def _times(**plan: object) -> tuple[float, float, dict[str, float]]:
    """AnalyticThroughput's iteration seconds, the simulator's, and the simulator's breakdown."""
    p = Plan(**plan, precision="bf16")  # type: ignore[arg-type]
    job = Job(global_batch=p.global_batch, seq_len=SEQ, precision="bf16")
    state = timeline(CLUSTER, parse_csv("# horizon_s: 1000\nt_s,kind,target,value,node,nodes\n",
                                        "t.csv"))[0].state
    rep = simulate(MODEL, CLUSTER, p, job)
    assert not rep.oom, "choose a case that fits in memory"
    return AnalyticThroughput(MODEL, job).iteration_s(p, state), rep.iteration_time_s, \
        dict(rep.breakdown)


def _ratio(**plan: object) -> float:
    """AnalyticThroughput's iteration over the simulator's, less the simulator's optimizer
    step and fixed overhead (the closed form has neither)."""
    approx, sim, b = _times(**plan)
    return approx / (sim - b["optimizer"] - b["overhead"])


def _sim_one_node(recompute: str) -> dict[str, float]:
    """The simulator's breakdown of gpt-neo-2.7b on one node (TP=4, no pipeline, no DP)."""
    one = ClusterSpec(name="l40s1", node_groups=(
        NodeGroup(name="g", gpu="L40S", num_nodes=1, gpus_per_node=8),))
    plan = Plan(tp=4, pp=1, dp=1, micro_batch=1, global_batch=8, precision="bf16",
                recompute=recompute)  # type: ignore[arg-type]
    rep = simulate(MODEL, one, plan, Job(global_batch=8, seq_len=SEQ, precision="bf16"))
    assert not rep.oom
    return dict(rep.breakdown)


def test_simulator_full_recompute_repeats_the_forward() -> None:
    # the forward is a third of forward + backward by FLOPs (backward = 2x forward, Narayanan
    # et al. SC'21 Sec. 5.1), and recomputing it also repeats its kernel launches' idle time:
    # the recompute term is a third of the compute term and more (measured 0.457 here, 0.352
    # at TP=1, where launches weigh less); 0.6 leaves room for the idle; 0 without recompute
    plain, full = _sim_one_node("none"), _sim_one_node("full")
    assert plain["recompute"] == 0.0
    q = full["recompute"] / full["compute"]
    assert 1 / 3 * 0.9 < q < 0.6, f"recompute / compute = {q:.3f}"


def test_simulator_optimizer_step_moves_adams_bytes() -> None:
    # mixed-precision Adam per parameter reads the bf16 gradient (2 B) and the fp32 master,
    # momentum and variance (12 B), writes the three back (12 B) and the bf16 weight (2 B):
    # 28 B (ZeRO paper Sec. 3.1's 2 + 2 + 12 bytes of state). A memory-bound step on a TP=4
    # shard takes at least 28 B x params / 4 / the HBM bandwidth (L40S: 864 GB/s), and at
    # most twice that at any memory efficiency above 50% (measured 0.0253 s vs 0.0216 s)
    params = formulas.layers_params(MODEL, 0, MODEL.n_layers) + formulas.embedding_params(MODEL)
    if not MODEL.tied_embeddings:
        params += formulas.output_params(MODEL)
    least = 28 * params / 4 / gpu_spec("L40S").memory_bandwidth
    opt = _sim_one_node("none")["optimizer"]
    assert least * (1 - 1e-9) <= opt < 2 * least, f"optimizer {opt:.4f} s, least {least:.4f} s"


def test_replay_approximation_has_the_pipeline_bubble() -> None:
    # 2 micro-batches over 2 stages idle a third of the time, 32 a thirty-third: the ratio
    # stays put (measured 0.454 vs 0.484) only with the bubble (p-1)/m in the closed form
    q = _ratio(tp=1, pp=2, dp=1, micro_batch=1, global_batch=2) / _ratio(
        tp=1, pp=2, dp=1, micro_batch=1, global_batch=32)
    assert abs(q - 1) < 0.1, f"ratio at m=2 / ratio at m=32 = {q:.3f}"


def test_replay_approximation_has_tensor_parallel_communication() -> None:
    # TP=4 over PCIe: the simulator's TP collectives are about half the step (measured ratio
    # 0.512 at TP=4, 0.484 at TP=1)
    q = _ratio(tp=4, pp=2, dp=1, micro_batch=1, global_batch=32) / _ratio(
        tp=1, pp=2, dp=1, micro_batch=1, global_batch=32)
    assert abs(q - 1) < 0.1, f"ratio at TP=4 / ratio at TP=1 = {q:.3f}"


def test_replay_approximation_has_recompute() -> None:
    # full recompute adds a forward, a third more compute (measured 0.479 vs 0.484)
    q = _ratio(tp=1, pp=2, dp=1, micro_batch=1, global_batch=32, recompute="full") / _ratio(
        tp=1, pp=2, dp=1, micro_batch=1, global_batch=32)
    assert abs(q - 1) < 0.1, f"ratio with / without full recompute = {q:.3f}"


def test_replay_approximation_has_the_data_parallel_sync() -> None:
    # 4 replicas of the same replica add the gradient all-reduce over the 2 nodes: what it
    # adds in the closed form is near what it adds in the simulator (measured 0.084 s vs
    # 0.115 s: a ring at the slowest hop against the simulator's hierarchical collective)
    one = _times(tp=2, pp=2, dp=1, micro_batch=1, global_batch=32)
    four = _times(tp=2, pp=2, dp=4, micro_batch=1, global_batch=128)
    approx, sim = four[0] - one[0], four[2]["dp_comm"] - one[2]["dp_comm"]
    assert sim > 0 and 0.5 < approx / sim < 2, f"DP sync adds {approx:.4f} vs {sim:.4f} s"


@pytest.mark.parametrize("zero", [0, 1])
def test_search_tail_bound_is_the_simulators_tail_at_pp1(zero: int) -> None:
    # pp=1, uniform layers, no DP overlap in the default profile: rank 0 holds the whole
    # model, so the bound's sync + optimizer step is the simulator's (measured within 0.5%),
    # and never above it (a lower bound); the profile's overhead is added by both
    job = Job(global_batch=64, seq_len=SEQ, precision="bf16")
    plan = Plan(tp=2, pp=1, dp=8, micro_batch=1, global_batch=64, precision="bf16", zero=zero)
    s = Structure(family="uniform", classes=(ReplicaClass(count=8, ranks=(Slot("g", 2),)),),
                  uniform=(2, 1, 8))
    (bound,) = SimTail(MODEL, CLUSTER, job).per_class(s, 1, zero, [MODEL.n_layers])
    rep = simulate(MODEL, CLUSTER, plan, job)
    assert not rep.oom, "choose a case that fits in memory"
    b = rep.breakdown
    sim = b["dp_comm"] + b["optimizer"]
    mine = bound - resolve().iteration_overhead_s
    assert mine <= sim * (1 + 1e-9), f"bound {mine:.4f} s above the simulator's {sim:.4f} s"
    assert mine > 0.9 * sim, f"bound {mine:.4f} s vs the simulator's {sim:.4f} s"


def _unit_stage(group: str, tp: int, k: Knobs) -> StageCost:
    """One second per layer, nothing else (a hand-checkable pipeline)."""
    zero = StateBytes(params=0.0, grads=0.0, optimizer=0.0)
    return StageCost(layer_time_s=1.0, embed_time_s=0.0, head_time_s=0.0, layer_state=zero,
                     embed_state=zero, head_state=zero, layer_activation_bytes=0.0,
                     fixed_bytes=0.0, capacity_bytes=1e12)


def test_search_group_bound_keeps_the_pipeline_fill() -> None:
    # one replica, 4 ranks, 8 layers of 1 s, 2 micro-batches under 1F1B: the best split
    # (2 layers per rank) runs (m + p - 1) x 2 s = 10 s; without the fill the bound is
    # m x 2 s = 4 s. The bound must stay below 10 s and keep most of the fill.
    cls = ReplicaClass(count=1, ranks=(Slot("g", 1),) * 4)
    lines = ClassLines(_unit_stage, lambda c, k: [0.0] * 4, 8)
    k = Knobs(schedule="1f1b", vpp=1)
    assert lines.fill(cls, k) == 1.0
    bound = lines.group_makespan(Structure(family="t", classes=(cls,)), k, "1f1b", 2, 1, 2)
    assert 1.2 * 4.0 < bound <= 10.0 * (1 + 1e-9), f"bound {bound:.3f} s"


def test_failure_sim_cost_at_full_degree_is_the_simulators_replica() -> None:
    # SimCost rescales the simulator's breakdown term by term for t < n survivors; at t = n
    # every factor is 1, so the replica time is the simulator's iteration less its
    # data-parallel sync (priced apart by sync_time): each term must be in the sum
    from hetpar.failures.layout import layout
    from hetpar.failures.simcost import SimCost

    plan = Plan(tp=2, pp=2, dp=1, micro_batch=1, global_batch=8, precision="bf16")
    rep = simulate(MODEL, CLUSTER, plan)
    assert not rep.oom and rep.breakdown["optimizer"] > 0 and rep.breakdown["bubble"] > 0
    mine = SimCost(MODEL, CLUSTER, plan, layout(MODEL, CLUSTER, plan)).replica_time(2, 8)
    assert mine == pytest.approx(rep.iteration_time_s - rep.breakdown["dp_comm"], rel=1e-9)
