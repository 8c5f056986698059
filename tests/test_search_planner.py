"""Planner behaviour on the synthetic cost model: determinism, pruning, objectives, no-plan."""

import pytest
from search_helpers import CLUSTER, JOB, MODEL

from hetpar.errors import ConfigError, Infeasible
from hetpar.io import to_dict
from hetpar.search import Objective, SearchSpace, load_space, search
from hetpar.search.objectives import parse_prices
from hetpar.search.synthetic import SyntheticCostModel
from hetpar.specs.job import Job
from hetpar.specs.model import ModelSpec

SPACE = SearchSpace(tp=(1, 2, 4, 8, 16), pp=(1, 2, 4), micro_batch=(1, 2),
                    recompute=("none", "full"), zero=(1,))


def run(**kw):
    cost = SyntheticCostModel(MODEL, CLUSTER, JOB, seed=kw.pop("seed", 5))
    return search(MODEL, CLUSTER, kw.pop("job", JOB), kw.pop("space", SPACE), cost=cost, **kw)


def test_results_identical_whatever_the_workers():
    one = run(workers=1, top=4)
    two = run(workers=2, top=4)
    assert [r.key for r in one.ranked] == [r.key for r in two.ranked]
    assert [r.score for r in one.ranked] == [r.score for r in two.ranked]
    assert [to_dict(r.plan) for r in one.ranked] == [to_dict(r.plan) for r in two.ranked]
    assert one.stats.simulated == two.stats.simulated


def test_ranked_best_first_and_rules_counted():
    res = run(workers=1, top=5)
    tps = [r.evaluation.tokens_per_s for r in res.ranked]
    assert tps == sorted(tps, reverse=True) and len(tps) == 5
    st = res.stats
    # tp=16 exceeds the 8-GPU scale-up domain; SP without TP and indivisible batches exist.
    assert st.removed["tier_capacity"] > 0
    assert st.removed["divisibility"] > 0
    assert st.removed["throughput_bound"] > 0
    assert st.simulated < st.candidates / 5  # the bound pruned most of the space
    assert st.bound_violations == 0  # the synthetic model's bound is a true bound
    assert st.to_dict()["plans_per_s"] > 0


def test_heterogeneous_plan_beats_best_single_type():
    best = run(workers=1, top=1).ranked[0]
    alone = max(
        run(workers=1, top=1, space=SearchSpace(**{**_fields(SPACE), "families": ("split",)}))
        .ranked[0].evaluation.tokens_per_s, 0)
    assert best.evaluation.tokens_per_s >= alone
    assert best.gpus == CLUSTER.num_gpus


def _fields(space):
    return {k: getattr(space, k) for k in space.__dataclass_fields__}


def test_cost_budget_and_min_gpus_objectives():
    prices = parse_prices("type-A=1.0,type-B=9.0")
    fast = run(workers=1, top=1).ranked[0]
    cheap = run(workers=1, top=3, objective=Objective(name="cost", prices=prices)).ranked[0]
    per_dollar = lambda r: r.evaluation.tokens_per_s / r.price_per_hour  # noqa: E731
    fast_price = 16 * 1.0 + 32 * 9.0
    assert per_dollar(cheap) >= fast.evaluation.tokens_per_s / fast_price
    budget = run(workers=1, top=3, objective=Objective(name="budget", prices=prices,
                                                        budget_per_hour=100.0))
    assert all(r.price_per_hour <= 100.0 for r in budget.ranked)
    assert budget.stats.removed["budget"] > 0
    target = fast.evaluation.tokens_per_s * 0.3
    few = run(workers=1, top=1, objective=Objective(name="min_gpus", target_tokens_per_s=target))
    r = few.ranked[0]
    assert r.evaluation.tokens_per_s >= target and r.gpus < fast.gpus


def test_no_plan_names_the_closest_candidate():
    huge = ModelSpec(name="huge", n_layers=16, hidden=32768, n_heads=256, n_kv_heads=8,
                     ffn_hidden=131072, vocab=128256, seq_len=4096, mlp="swiglu")
    cost = SyntheticCostModel(huge, CLUSTER, JOB, seed=5)
    with pytest.raises(Infeasible) as e:
        search(huge, CLUSTER, JOB, SPACE, cost=cost, workers=1)
    assert e.value.kind == "no plan"
    assert "memory" in e.value.reason and "closest:" in e.value.reason


def test_indivisible_batch_is_no_plan():
    job = Job(global_batch=3)
    space = SearchSpace(tp=(8,), pp=(1,), micro_batch=(2,), families=("uniform",))
    with pytest.raises(Infeasible, match="divisib"):
        run(workers=1, job=job, space=space)


def test_spaces_load_and_reject_bad_input(tmp_path):
    assert load_space("default") == SearchSpace()
    assert 2 in load_space("wide").cp
    bad = tmp_path / "s.toml"
    bad.write_text("tp = [1, 2]\nbogus = 1\n")
    with pytest.raises(ConfigError, match="bogus"):
        load_space(str(bad))
    bad.write_text('recompute = ["sometimes"]\n')
    with pytest.raises(ConfigError, match="recompute"):
        load_space(str(bad))
    with pytest.raises(ConfigError, match="known: .*default"):
        load_space("nope")
    with pytest.raises(ConfigError, match="--price"):
        parse_prices("H100=free")
    with pytest.raises(ConfigError, match="no price"):
        Objective(name="cost", prices=(("H100", 2.0),)).price_of("V100-SXM2-32GB")


def test_layouts_place_devices_as_declared():
    from hetpar.search.structures import ReplicaClass, Slot, layout_offsets

    ranks = (Slot(group="a", tp=4), Slot(group="a", tp=4))
    dp_in = layout_offsets([ReplicaClass(count=2, ranks=ranks)], cp=1)
    pp_in = layout_offsets([ReplicaClass(count=2, ranks=ranks, layout="pp-inner")], cp=1)
    # (class, replica, rank) -> first device: data-parallel peers vs pipeline neighbours adjacent
    assert [dp_in[(0, i, r)] for i in (0, 1) for r in (0, 1)] == [0, 8, 4, 12]
    assert [pp_in[(0, i, r)] for i in (0, 1) for r in (0, 1)] == [0, 4, 8, 12]


def test_pp_inner_plans_are_valid_and_searched():
    from hetpar.specs.expand import expand

    space = SearchSpace(tp=(8,), pp=(2,), micro_batch=(1,), vpp=(1,), schedule=("1f1b",),
                        recompute=("none",), layouts=("dp-inner", "pp-inner"))
    res = run(workers=1, top=50, space=space)
    keys = [r.key for r in res.evaluated]
    assert any("pp-in" in k for k in keys) and any("pp-in" not in k for k in keys)
    for r in res.evaluated:
        ex = expand(r.plan, MODEL, CLUSTER)
        used = [(st.group, d) for rep in ex.replicas for st in rep.stages for d in st.devices]
        assert len(used) == len(set(used))  # no device used twice
