"""The planner's expert split option: the top EP plans tried with more experts on faster GPUs
where their EP groups span GPU types, counted; nothing on a cluster of one GPU type."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from hetpar import catalog
from hetpar.search import SearchSpace, search
from hetpar.search.evaluate import evaluate_one
from hetpar.search.expert_speed import RULE, speed_counts, try_expert_splits
from hetpar.search.generate import Ranked, SearchState
from hetpar.search.objectives import Objective
from hetpar.search.rules import SearchStats
from hetpar.search.simcost import SimCostModel
from hetpar.sim import simulate
from hetpar.specs.job import Job
from hetpar.specs.plan import Plan
from hetpar.specs.stage import Replica, Stage

GPT_OSS = catalog.load_model("gpt-oss-20b")  # 32 experts of width 2880, top-4
MIXTRAL = catalog.load_model("mixtral-8x7b")  # 8 experts of width 14336, top-2
MIXED = catalog.load_cluster("mixed-a100-h100")
JOB = Job(global_batch=64, seq_len=4096)
CLUSTER = """
name = "mix8"
description = "2 nodes of 2 A100 and 2 nodes of 2 H100"
[[node_groups]]
name = "a100"
gpu = "A100-SXM4-80GB"
num_nodes = 2
gpus_per_node = 2
nic_bandwidth_gbps = 200.0
[[node_groups]]
name = "h100"
gpu = "H100-SXM5-80GB"
num_nodes = 2
gpus_per_node = 2
nic_bandwidth_gbps = 400.0
"""


def _plan(groups: tuple[str, str]) -> Plan:
    """One replica of 4 tp-1 stages per group: each pipeline rank's EP group (ep = 2) joins
    the two replicas' ranks, so it spans GPU types where the groups differ."""
    def rep(group: str) -> Replica:
        return Replica(stages=tuple(Stage(layers=(6 * i, 6 * i + 6), group=group, tp=1)
                                    for i in range(4)), batch=32, micro_batch=1)

    return Plan(name="p", replicas=tuple(rep(g) for g in groups), axes=(("ep", 2),), zero=1,
                recompute="full")


def _state(plan: Plan, cluster=MIXED) -> tuple[SearchState, Objective, SimCostModel]:
    cost, objective = SimCostModel(GPT_OSS, cluster, JOB), Objective()
    ev = evaluate_one(cost, plan)
    ranked = Ranked(plan=plan, evaluation=ev, score=objective.score(ev.tokens_per_s, 8, 0.0),
                    gpus=8, price_per_hour=0.0, key="k", bound=1e12)
    return SearchState(SearchStats(), results=[ranked]), objective, cost


def _try(state: SearchState, objective: Objective, cost: SimCostModel, cluster=MIXED) -> None:
    try_expert_splits(state, GPT_OSS, cluster, JOB, objective, 5,
                      lambda plans: [evaluate_one(cost, p) for p in plans])


def test_a_mixed_ep_group_is_tried_by_speed_and_kept_when_faster() -> None:
    plan = _plan(("a100", "h100"))
    # one expert's GEMMs take 2.53x as long on the A100 as on the H100 (efficiency tables at
    # this size, not the 3.17x of the peaks), and the rest of its layer is slower too
    assert speed_counts(GPT_OSS, MIXED, plan, "bf16", 4096) == (6, 26)
    state, objective, cost = _state(plan)
    _try(state, objective, cost)
    st = state.stats
    assert (st.candidates, st.expert_split_evaluations, st.simulated, st.removed[RULE]) == (
        1, 1, 1, 0)
    even, fast = state.results
    assert fast.plan == replace(plan, experts_per_rank="by_speed", name="p by_speed")
    assert fast.key == "k,by_speed"
    assert fast.evaluation.tokens_per_s > even.evaluation.tokens_per_s
    assert "experts by speed: 1 of the top EP plans evaluated" in st.summary()


def test_ep_groups_on_one_gpu_type_are_removed_unevaluated() -> None:
    state, objective, cost = _state(_plan(("h100", "h100")))
    _try(state, objective, cost)
    st = state.stats
    assert (st.candidates, st.expert_split_evaluations, st.removed[RULE]) == (1, 0, 1)
    assert len(state.results) == 1
    assert st.to_dict()["expert_split_even"] == 1


def test_one_gpu_type_adds_nothing(tmp_path: Path) -> None:
    pod = catalog.load_cluster("h100-pod-400g")
    state, objective, cost = _state(_plan(("h100", "h100")), pod)
    before = state.stats.to_dict()
    _try(state, objective, cost, pod)
    assert state.stats.to_dict() == before and len(state.results) == 1
    assert "expert_split_evaluations" not in before and "experts by speed" not in (
        state.stats.summary())


def test_the_search_finds_a_by_speed_plan_on_a_mixed_cluster(tmp_path: Path) -> None:
    """Mixtral over one A100 and one H100 replica of 16 stages (the split family, ep = 2):
    the replicas share the batch equally (an EP group runs one micro-batch count), so only
    the expert split balances them, and the by_speed plan ranks first."""
    path = tmp_path / "mix32.toml"
    path.write_text(CLUSTER.replace("num_nodes = 2", "num_nodes = 4").replace(
        "gpus_per_node = 2", "gpus_per_node = 4"), encoding="utf-8")
    space = SearchSpace(tp=(1,), pp=(16,), micro_batch=(1,), recompute=("full",), zero=(1,),
                        schedule=("1f1b",), vpp=(1,), widen_vpp=False, families=("split",),
                        axes={"ep": (2,)}, zero_scope=("all",))
    cluster = catalog.load_cluster(str(path))
    res = search(MIXTRAL, cluster, JOB, space, workers=1)
    st = res.stats
    assert st.expert_split_evaluations >= 1 and "experts by speed: " in st.summary()
    best, even = res.ranked[0], next(r for r in res.ranked if r.plan.experts_per_rank == "even")
    assert best.plan.experts_per_rank == "by_speed" and best.plan.name.endswith(" by_speed")
    assert best.evaluation.tokens_per_s > 1.2 * even.evaluation.tokens_per_s
    assert [r.batch for r in best.plan.replicas] == [32, 32]
    again = simulate(MIXTRAL, cluster, best.plan, JOB)  # the written plan prices the same
    assert again.tokens_per_s == pytest.approx(best.evaluation.tokens_per_s, rel=1e-9)
