"""Batch shares of the replay planner: balanced by the throughput model, not by peak FLOP/s."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hetpar.catalog import load_cluster, load_model
from hetpar.dynamic.adapters import make_models
from hetpar.dynamic.balance import line_from_probes, shares
from hetpar.dynamic.planner import Shape, ShapePlanner
from hetpar.dynamic.state import Conditions
from hetpar.specs.job import Job


def test_line_through_two_probes() -> None:
    assert line_from_probes(4, 3.0, 8, 5.0) == pytest.approx((1.0, 0.5))
    assert line_from_probes(4, 0.0, 8, 5.0) is None  # a probe that could not run
    assert line_from_probes(8, 3.0, 4, 5.0) is None


@given(st.lists(st.tuples(st.floats(0, 5), st.floats(0.01, 2)), min_size=1, max_size=6),
       st.integers(6, 200))
def test_shares_are_optimal_for_the_slowest_replica(lines, units) -> None:
    got = shares(lines, units)
    assert got is not None and sum(got) == units and min(got) >= 1
    worst = max(c + m * t for (c, t), m in zip(lines, got, strict=True))
    # Moving one micro-batch from any replica to any other cannot lower the slowest time.
    for i in range(len(got)):
        for j in range(len(got)):
            if i == j or got[i] == 1:
                continue
            moved = list(got)
            moved[i] -= 1
            moved[j] += 1
            other = max(c + m * t for (c, t), m in zip(lines, moved, strict=True))
            assert other >= worst - 1e-9


def test_fewer_units_than_replicas_has_no_shares() -> None:
    assert shares([(0.0, 1.0)] * 3, 2) is None


@pytest.mark.parametrize("cost_kind", ["analytic", "sim"])
def test_faster_gpus_get_more_micro_batches(cost_kind: str) -> None:
    model, job = load_model("llama3.1-8b"), Job(global_batch=256)
    state = Conditions(load_cluster("mixed-a100-h100")).state(0.0)
    cost, _ = make_models(cost_kind, model, job)
    planner = ShapePlanner(model, job, cost)
    layout = tuple(Shape(2, 1) for _ in state.parts)
    plan = planner.plan(state, layout)
    assert plan is not None and plan.batch == 256
    per_group: dict[str, set[int]] = {}
    for r in plan.replicas:
        per_group.setdefault(r.stages[0].group, set()).add(r.batch)
    assert set(per_group) == {"a100", "h100"}
    assert min(per_group["h100"]) >= max(per_group["a100"])
    assert max(per_group["h100"]) > max(per_group["a100"])
