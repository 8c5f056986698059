"""The fast approximations (replay's AnalyticThroughput, the failure studies' AnalyticCost)
stay near the simulator on every node group of every bundled cluster.

Both are explicitly fast approximations of ``hetpar.sim`` that price collectives and bytes
with its public terms (``hetpar.sim.terms``). Measured on 2026-12-04 (llama3-8b, TP within
a node, PP 2, up to 4 nodes of each group): AnalyticThroughput gives 1.46-2.17x the
simulator's tokens/s (it has no kernel overheads or exposed optimizer step), AnalyticCost
0.62-0.77x its replica time. The replay bounds are a factor of 3 either way; what replay
relies on is checked exactly: the same feasibility and the same order of GPU types where the
simulator separates them by more than 10%. The failure study's AnalyticCost is held closer
(issue 34: removing its pipeline bubble passed every test): a band on cases that fit in
memory, and one test per term (bubble, recompute, data-parallel sync, TP communication)
that its removal fails. AnalyticCost has no optimizer-step term to hold.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from hetpar.catalog import gpu_spec, load_cluster, load_model, names
from hetpar.dynamic.adapters import SimThroughput
from hetpar.dynamic.cost import AnalyticThroughput
from hetpar.dynamic.state import timeline
from hetpar.dynamic.trace import parse_csv
from hetpar.errors import Infeasible
from hetpar.failures.cost import AnalyticCost
from hetpar.failures.layout import layout
from hetpar.failures.simcost import SimCost
from hetpar.specs.cluster import ClusterSpec, NodeGroup
from hetpar.specs.job import Job
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import Plan, Recompute

FACTOR = 3.0
MODEL = load_model("llama3-8b")


def _cases() -> list[tuple[str, ClusterSpec, NodeGroup]]:
    out = []
    for name in names("clusters"):
        c = load_cluster(name)
        for g in c.node_groups:
            nodes = min(g.num_nodes, max(4, g.domain_size // g.gpus_per_node))
            g2 = dataclasses.replace(g, num_nodes=nodes)
            sub = dataclasses.replace(c, name=f"{name}-{g.name}", node_groups=(g2,), links=(),
                                      tiers=())
            out.append((f"{name}/{g.name}", sub, g2))
    return out


CASES = _cases()


def _plan(g: NodeGroup) -> tuple[Plan, Job]:
    tp = min(8, g.domain_size, g.gpus_per_node)
    dp = g.num_gpus // (tp * 2)
    prec = "bf16" if "bf16" in gpu_spec(g.gpu).peak_tflops else "fp16"
    gbs = 16 * dp
    return (Plan(tp=tp, pp=2, dp=dp, micro_batch=1, global_batch=gbs, precision=prec),
            Job(global_batch=gbs, seq_len=4096, precision=prec))


def _throughputs(sub: ClusterSpec, g: NodeGroup) -> tuple[float, float]:
    plan, job = _plan(g)
    state = timeline(sub, parse_csv("# horizon_s: 1000\nt_s,kind,target,value,node,nodes\n",
                                    "t.csv"))[0].state
    return (AnalyticThroughput(MODEL, job).tokens_per_s(plan, state),
            SimThroughput(MODEL, job).tokens_per_s(plan, state))


def test_every_bundled_cluster_is_covered() -> None:
    assert {c.split("/")[0] for c, _, _ in CASES} == set(names("clusters"))


@pytest.mark.parametrize(("case", "sub", "g"), CASES, ids=[c for c, _, _ in CASES])
def test_replay_approximation_is_near_the_simulator(case: str, sub: ClusterSpec,
                                                    g: NodeGroup) -> None:
    approx, sim = _throughputs(sub, g)
    assert (approx > 0) == (sim > 0), f"{case}: feasibility differs ({approx}, {sim})"
    if sim > 0:
        assert 1 / FACTOR < approx / sim < FACTOR, f"{case}: {approx:.0f} vs {sim:.0f} tokens/s"


def _failure_costs(sub: ClusterSpec, g: NodeGroup, *, tp: int, pp: int, m: int,
                   recompute: Recompute = "none",
                   model: ModelSpec = MODEL) -> tuple[AnalyticCost, SimCost, float, float]:
    """The failure study's two costs of one replica of ``m`` micro-batches, and their times."""
    prec = "bf16" if "bf16" in gpu_spec(g.gpu).peak_tflops else "fp16"
    plan = Plan(tp=tp, pp=pp, dp=1, micro_batch=1, global_batch=m, precision=prec,
                recompute=recompute)
    lay = layout(model, sub, plan)
    a, s = AnalyticCost(model, sub, plan, lay), SimCost(model, sub, plan, lay)
    return a, s, a.replica_time(tp, m), s.replica_time(tp, m)


def _fitting(sub: ClusterSpec, g: NodeGroup) -> tuple[int, Recompute] | None:
    """The shallowest pipeline (then full recompute) whose replica fits in memory."""
    tp = min(8, g.domain_size, g.gpus_per_node)
    for pp in (2, 4, 8):
        for rc in ("none", "full"):
            if tp * pp <= g.num_gpus and math.isfinite(
                    _failure_costs(sub, g, tp=tp, pp=pp, m=4 * pp, recompute=rc)[3]):
                return pp, rc
    return None


# Measured on 2026-12-07 (issue 34; python /tmp commands in the branch's report): AnalyticCost
# gives 0.59-0.78x the simulator's replica time on the cases that fit. The band is that
# range with a margin; the term tests below each hold one term to a 10-25% tolerance.
LOW, HIGH = 0.5, 0.9
TOO_SMALL = {"consumer-mix/rtx4090"}  # one 24 GB GPU per TP group: 8B does not fit


@pytest.mark.parametrize(("case", "sub", "g"), CASES, ids=[c for c, _, _ in CASES])
def test_failure_approximation_is_near_the_simulator(case: str, sub: ClusterSpec,
                                                     g: NodeGroup) -> None:
    fit = _fitting(sub, g)
    if case in TOO_SMALL:  # named, not skipped silently: no pipeline of llama3-8b fits
        assert fit is None, f"{case} fits now ({fit}): take it off TOO_SMALL"
        return
    assert fit is not None, f"{case}: no plan fits in memory; choose one that does"
    pp, rc = fit
    _, _, approx, sim = _failure_costs(sub, g, tp=min(8, g.domain_size, g.gpus_per_node),
                                       pp=pp, m=8 * pp, recompute=rc)
    assert LOW < approx / sim < HIGH, f"{case} pp={pp} {rc}: {approx:.3f} vs {sim:.3f} s"


TERM_CASES = [c for c in CASES if c[0] in ("h100-pod-400g/h100", "selene-a100/a100",
                                           "b200-nvl32-32k/b200", "v100-a100/v100")]


@pytest.mark.parametrize(("case", "sub", "g"), TERM_CASES, ids=[c for c, _, _ in TERM_CASES])
def test_failure_approximation_has_the_pipeline_bubble(case: str, sub: ClusterSpec,
                                                       g: NodeGroup) -> None:
    # 2 micro-batches over 2 stages idle a third of the time, 32 a thirty-third: the ratio to
    # the simulator stays the same only if the closed form has the bubble (p-1)/(v m)
    # (the simulator's fixed per-iteration overhead, a fitted number the closed form leaves
    # out, is taken off its times: it weighs 16x more at m=2 and is no bubble)
    from hetpar.sim.profile import resolve

    fixed = resolve().iteration_overhead_s
    tp = min(8, g.domain_size, g.gpus_per_node)
    few = _failure_costs(sub, g, tp=tp, pp=2, m=2)
    many = _failure_costs(sub, g, tp=tp, pp=2, m=32)
    q = (few[2] / (few[3] - fixed)) / (many[2] / (many[3] - fixed))
    assert abs(q - 1) < 0.1, f"{case}: ratio at m=2 / ratio at m=32 = {q:.3f}"


@pytest.mark.parametrize(("case", "sub", "g"), TERM_CASES, ids=[c for c, _, _ in TERM_CASES])
def test_failure_approximation_has_recompute(case: str, sub: ClusterSpec,
                                             g: NodeGroup) -> None:
    # full recompute adds a forward (a third more compute) in both, or in neither
    tp = min(8, g.domain_size, g.gpus_per_node)
    plain = _failure_costs(sub, g, tp=tp, pp=4, m=32)
    full = _failure_costs(sub, g, tp=tp, pp=4, m=32, recompute="full")
    q = (full[2] / full[3]) / (plain[2] / plain[3])
    assert abs(q - 1) < 0.12, f"{case}: ratio with / without recompute = {q:.3f}"


@pytest.mark.parametrize(("case", "sub", "g"), TERM_CASES, ids=[c for c, _, _ in TERM_CASES])
def test_failure_approximation_has_the_data_parallel_sync(case: str, sub: ClusterSpec,
                                                          g: NodeGroup) -> None:
    # the closed form's all-reduce is all exposed (no overlap): at least the simulator's
    # exposed share, within the overlap it ignores (measured 1.2-6.4x)
    tp = min(8, g.domain_size, g.gpus_per_node)
    a, s, _, _ = _failure_costs(sub, g, tp=tp, pp=2, m=32)
    approx, sim = a.sync_time(frozenset({tp}), 2), s.sync_time(frozenset({tp}), 2)
    assert sim > 0 and 0.8 < approx / sim < 10, f"{case}: {approx:.4f} vs {sim:.4f} s"


def test_failure_approximation_has_tensor_parallel_communication() -> None:
    # 8 L40S over PCIe: TP=4's collectives are ~45% of the simulator's step, so the ratio to
    # the simulator stays within 25% from TP=1 to TP=4 only if the closed form charges them
    model = load_model("gpt-neo-2.7b")
    g = NodeGroup(name="g", gpu="L40S", num_nodes=1, gpus_per_node=8)
    sub = ClusterSpec(name="l40s", node_groups=(g,))
    one = _failure_costs(sub, g, tp=1, pp=2, m=32, model=model)
    four = _failure_costs(sub, g, tp=4, pp=2, m=32, model=model)
    q = (four[2] / four[3]) / (one[2] / one[3])
    assert 0.8 < q < 1.25, f"ratio at TP=4 / ratio at TP=1 = {q:.3f}"


def test_the_approximation_orders_gpu_types_as_the_simulator_does() -> None:
    seen: dict[str, tuple[float, float]] = {}
    for _, sub, g in CASES:
        approx, sim = _throughputs(sub, g)
        if sim > 0:
            seen[g.gpu_name] = (approx, sim)
    assert len(seen) >= 4
    for a, (xa, sa) in seen.items():
        for b, (xb, sb) in seen.items():
            if sa > 1.1 * sb:
                assert xa > xb, f"simulator: {a} {sa:.0f} > {b} {sb:.0f}; approx {xa:.0f}, {xb:.0f}"


def test_replay_memory_check_reads_the_framework_data() -> None:
    """AnalyticThroughput's memory check counts the framework's reserved memory and
    allocator fragmentation (catalog/frameworks/*.toml, as sim/memory.py does), not a
    constant of its own: reserving the whole GPU fails a plan that fits, and fragmentation
    scales the live bytes the message reports."""
    case, sub, g = CASES[0]
    plan, job = _plan(g)
    state = timeline(sub, parse_csv("# horizon_s: 1000\nt_s,kind,target,value,node,nodes\n",
                                    "t.csv"))[0].state
    a = AnalyticThroughput(MODEL, job)
    assert a.profile.reserved_memory_bytes == 1.5 * 2**30  # every bundled framework's figure
    assert a.tokens_per_s(plan, state) > 0, f"{case}: choose a plan that fits"
    whole = gpu_spec(g.gpu).memory_bytes / 2**30
    need = []
    for frag in (0.0, 0.5):
        b = AnalyticThroughput(MODEL, job)
        b.profile = dataclasses.replace(b.profile, reserved_memory_bytes=whole * 2**30,
                                        allocator_fragmentation=frag)
        with pytest.raises(Infeasible, match="memory") as e:
            b.iteration_s(plan, state)
        need.append(float(str(e.value).split(" needs ")[1].split(" GiB")[0]) - whole)
    assert need[0] > 1.0
    assert need[1] == pytest.approx(1.5 * need[0], abs=0.2)  # the message rounds to 0.1 GiB
