"""The fast approximations (replay's AnalyticThroughput, the failure studies' AnalyticCost)
stay near the simulator on every node group of every bundled cluster.

Both are explicitly fast approximations of ``hetpar.sim`` that price collectives and bytes
with its public terms (``hetpar.sim.terms``). Measured on 2026-12-04 (llama3-8b, TP within
a node, PP 2, up to 4 nodes of each group): AnalyticThroughput gives 1.46-2.17x the
simulator's tokens/s (it has no kernel overheads or exposed optimizer step), AnalyticCost
0.62-0.77x its replica time. The bounds below are a factor of 3 either way, so a physics
change in the simulator moves them only when the approximations stop being one; what the
replay and failure decisions rely on is checked exactly: the same feasibility (dynamic) and
the same order of GPU types where the simulator separates them by more than 10%.
"""

from __future__ import annotations

import dataclasses

import pytest

from hetpar.catalog import gpu_spec, load_cluster, load_model, names
from hetpar.dynamic.adapters import SimThroughput
from hetpar.dynamic.cost import AnalyticThroughput
from hetpar.dynamic.state import timeline
from hetpar.dynamic.trace import parse_csv
from hetpar.failures.cost import AnalyticCost
from hetpar.failures.layout import layout
from hetpar.failures.simcost import SimCost
from hetpar.specs.cluster import ClusterSpec, NodeGroup
from hetpar.specs.job import Job
from hetpar.specs.plan import Plan

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


@pytest.mark.parametrize(("case", "sub", "g"), CASES, ids=[c for c, _, _ in CASES])
def test_failure_approximation_is_near_the_simulator(case: str, sub: ClusterSpec,
                                                     g: NodeGroup) -> None:
    plan, _ = _plan(g)
    lay = layout(MODEL, sub, plan)
    batch = plan.global_batch // plan.dp
    sim = SimCost(MODEL, sub, plan, lay).replica_time(plan.tp, batch)
    if sim == float("inf"):  # out of memory in the simulator; the closed form has no memory
        return
    approx = AnalyticCost(MODEL, sub, plan, lay).replica_time(plan.tp, batch)
    assert 1 / FACTOR < approx / sim < FACTOR, f"{case}: {approx:.3f} vs {sim:.3f} s"


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
