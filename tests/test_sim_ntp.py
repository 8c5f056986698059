"""Nonuniform TP in the simulator: replicas whose TP degree does not divide the heads."""

from __future__ import annotations

import pytest

from hetpar.errors import Infeasible
from hetpar.sim import simulate
from hetpar.specs.cluster import ClusterSpec, NodeGroup
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import Plan
from hetpar.specs.stage import Replica, Stage

MODEL = ModelSpec(name="m", n_layers=8, hidden=8192, n_heads=64, n_kv_heads=64,
                  ffn_hidden=32768, vocab=32000, seq_len=4096)
CLUSTER = ClusterSpec(name="c", node_groups=(
    NodeGroup(name="g", gpu="H100-SXM5-80GB", num_nodes=4, gpus_per_node=8),))


def _replica(tp: int, first: int, batch: int) -> Replica:
    return Replica(batch=batch, micro_batch=1, stages=(
        Stage(layers=(0, 8), group="g", tp=tp, devices=tuple(range(first, first + tp))),))


def _time(*replicas: Replica) -> float:
    plan = Plan(replicas=replicas, precision="bf16", sequence_parallel=True, uneven_tp=True)
    return simulate(MODEL, CLUSTER, plan).iteration_time_s


def test_uniform_plan_with_indivisible_heads_is_infeasible() -> None:
    with pytest.raises(Infeasible, match="n_heads"):
        simulate(MODEL, CLUSTER, Plan(tp=6, dp=1, global_batch=8, micro_batch=1))


def test_degraded_replica_at_tp6_is_paced_by_its_largest_shard() -> None:
    healthy = _time(_replica(8, 0, 8), _replica(8, 8, 8))
    degraded = _time(_replica(8, 0, 8), _replica(6, 8, 8))
    # 64 heads over 6 ranks: the largest shard holds 11 heads, 11/8 = 1.375x a TP8 shard
    # (and so do the MLP columns); compute dominates this shape, so the step slows ~1.3x.
    assert 1.2 * healthy < degraded < 1.45 * healthy
    # NTP's answer: a smaller batch share lets the degraded replica keep pace.
    rebalanced = _time(_replica(8, 0, 8), _replica(6, 8, 6))
    assert rebalanced < degraded
    assert rebalanced == pytest.approx(healthy, rel=0.1)
