"""A parallel axis registered in this test only: plan, simulate, run and export read its row."""

from dataclasses import replace

import pytest
from search_helpers import CLUSTER, JOB, MODEL

from hetpar import feasibility
from hetpar.catalog import load_cluster, load_model
from hetpar.errors import ConfigError, Infeasible
from hetpar.export.nearest import common
from hetpar.io import to_dict
from hetpar.placement import LAYOUTS, place
from hetpar.runtime.layout import _check_supported, build_layout
from hetpar.search import SearchSpace, search
from hetpar.search.candidates import knob_sets
from hetpar.search.structures import ReplicaClass, Slot, layout_offsets
from hetpar.search.synthetic import SyntheticCostModel
from hetpar.sim import simulate
from hetpar.specs import axes
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import Plan, expand

SPACE = SearchSpace(tp=(1, 2, 4, 8), pp=(1, 2, 4), micro_batch=(1, 2), recompute=("none",),
                    zero=(1,))


class Toy:
    """The predicate of the toy axis ``xp``: records what it is asked, says ``ok`` at degree
    1 and no above it (this test adds no ``Plan`` field for the toy, so it cannot run)."""

    def __init__(self) -> None:
        self.ok = True
        self.asked: list[tuple[int, dict[str, int]]] = []

    def __call__(self, model: ModelSpec, degree: int, degrees: dict[str, int]
                 ) -> feasibility.Verdict:
        self.asked.append((degree, dict(degrees)))
        ok = self.ok and degree == 1
        return feasibility.Verdict(name="toy_fit", ok=ok, reason=f"toy refuses xp={degree}")


@pytest.fixture
def toy():
    pred = Toy()
    axes.register(axes.AxisDef(name="xp", scope="plan", predicate="toy_fit",
                               collective="none (a toy)", runtime=False, exported=False))
    feasibility.PREDICATES["toy_fit"] = pred
    yield pred
    axes.unregister("xp")
    del feasibility.PREDICATES["toy_fit"]


def _search(space=SPACE):
    cost = SyntheticCostModel(MODEL, CLUSTER, JOB, seed=5)
    return search(MODEL, CLUSTER, JOB, space, cost=cost, workers=1, top=5)


def test_the_planner_asks_a_registered_axis_and_counts_its_removals(toy):
    # the baseline without the axis, then the same search with it registered
    axes.unregister("xp")
    plain = _search()
    axes.register(axes.AxisDef(name="xp", scope="plan", predicate="toy_fit",
                               collective="none (a toy)", runtime=False, exported=False))
    same = _search()
    assert [r.key for r in same.ranked] == [r.key for r in plain.ranked]
    assert [to_dict(r.plan) for r in same.ranked] == [to_dict(r.plan) for r in plain.ranked]
    assert toy.asked and {d for d, _ in toy.asked} == {1}
    assert set(toy.asked[0][1]) == {"tp", "cp", "dp", "pp", "xp"}
    toy.ok = False
    with pytest.raises(Infeasible, match=r"feasibility predicates: toy_fit \d+"):
        _search()


def test_a_space_names_the_degrees_of_a_registered_axis(toy):
    wide = replace(SPACE, axes={"xp": (1, 2)})
    ks = list(knob_sets(wide, 1, True))
    assert {dict(k.axes)["xp"] for k in ks} == {1, 2}
    assert all(k.key().endswith(",xp2") == (dict(k.axes)["xp"] == 2) for k in ks)
    plain = _search()
    res = _search(wide)  # xp=2 is refused by its predicate: the same plans, counted removals
    assert [r.key for r in res.ranked] == [r.key for r in plain.ranked]
    assert res.stats.predicates["toy_fit"] > 0 and 2 in {d for d, _ in toy.asked}
    with pytest.raises(ConfigError, match="unknown parallel axis 'ep'"):
        SearchSpace(axes={"ep": (1, 2)})
    with pytest.raises(ConfigError, match="only plan-scope"):
        SearchSpace(axes={"cp": (1, 2)})


def test_simulate_and_run_ask_the_same_predicate(toy):
    model, cluster = load_model("tiny-llama"), load_cluster("selene-a100")
    plan = Plan(tp=2, pp=2, dp=2, global_batch=16)
    simulate(model, cluster, plan)
    build_layout(plan, model, cluster)
    assert place(model, cluster, plan).axis("xp").degree == 1
    toy.ok = False
    for ask in (lambda: simulate(model, cluster, plan), lambda: build_layout(plan, model)):
        with pytest.raises(Infeasible, match="toy refuses xp=1"):
            ask()


def test_run_and_export_refuse_what_the_row_says_they_lack(toy):
    model = load_model("tiny-llama")
    plan = Plan(tp=2, pp=2, dp=2, global_batch=16)
    object.__setattr__(plan, "xp", 2)  # stands in for the Plan field specs/plan.py would add
    with pytest.raises(ConfigError, match="plan: xp=2 is not supported by the runtime"):
        _check_supported(plan, model)
    with pytest.raises(ConfigError, match="export: xp=2 is not exported by any target"):
        common(plan, model)
    # declared executed: the runtime's refusal is gone; its predicate still decides
    axes.unregister("xp")
    axes.register(axes.AxisDef(name="xp", scope="plan", predicate="toy_fit",
                               collective="none (a toy)", runtime=True, exported=True))
    with pytest.raises(Infeasible, match="toy refuses xp=2"):
        _check_supported(plan, model)
    common(plan, model)


def test_only_plan_scope_axes_register():
    with pytest.raises(ConfigError, match="only plan-scope"):
        axes.register(axes.AxisDef(name="ep", scope="stage", predicate="p", collective="a2a"))
    with pytest.raises(ConfigError, match="built in"):
        axes.unregister("tp")


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize(("tp", "cp", "pp", "dp"), [(2, 1, 2, 4), (1, 2, 4, 2), (4, 1, 4, 1),
                                                     (2, 2, 2, 2), (1, 1, 8, 2)])
def test_the_planners_layout_is_the_placements(layout, tp, cp, pp, dp):
    """``layout_offsets`` of one class on one group = ``expand`` of the uniform plan in the
    order ``LAYOUTS`` names: the planner's device layout is the placement's formula."""
    cluster = load_cluster("selene-a100")
    g = cluster.node_groups[0].name
    cls = ReplicaClass(count=dp, ranks=(Slot(group=g, tp=tp),) * pp, layout=layout)
    off = layout_offsets([cls], cp)
    plan = Plan(tp=tp, cp=cp, pp=pp, dp=dp, global_batch=dp * 8, order=LAYOUTS[layout])
    full = expand(plan, MODEL, cluster)
    for i, rep in enumerate(full.replicas):
        for r in range(pp):
            devs = rep.stages[r].devices
            assert devs is not None
            assert off[(0, i, r)] == devs[0]
            assert list(devs) == list(range(devs[0], devs[0] + tp * cp))
