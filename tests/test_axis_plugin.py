"""A parallel axis registered in this test only: plan, simulate, run and export read its row."""

import json
from dataclasses import replace

import pytest
from search_helpers import CLUSTER, JOB, MODEL

from hetpar import feasibility, formulas
from hetpar.catalog import load_cluster, load_model, parse_inline_plan
from hetpar.errors import ConfigError, Infeasible
from hetpar.export.nearest import common
from hetpar.io import from_dict, to_dict
from hetpar.placement import LAYOUTS, place
from hetpar.runtime.layout import _check_supported, build_layout
from hetpar.search import SearchSpace, search
from hetpar.search.candidates import knob_sets
from hetpar.search.costmodel import StageKey
from hetpar.search.simcost import SimCostModel
from hetpar.search.structures import ReplicaClass, Slot, layout_offsets
from hetpar.search.synthetic import SyntheticCostModel
from hetpar.sim import axis_costs, simulate
from hetpar.sim import network as net
from hetpar.sim.profile import DEFAULT
from hetpar.specs import axes
from hetpar.specs.expand import expand
from hetpar.specs.job import Job
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import Plan

SPACE = SearchSpace(tp=(1, 2, 4, 8), pp=(1, 2, 4), micro_batch=(1, 2), recompute=("none",),
                    zero=(1,))


class Toy:
    """The predicate of the toy axis ``xp``: records what it is asked, says ``ok`` up to
    degree ``most`` (1 unless a test raises it) and no above it."""

    def __init__(self) -> None:
        self.ok = True
        self.most = 1
        self.asked: list[tuple[int, dict[str, int]]] = []

    def __call__(self, model: ModelSpec, degree: int, degrees: dict[str, int]
                 ) -> feasibility.Verdict:
        self.asked.append((degree, dict(degrees)))
        ok = self.ok and degree <= self.most
        return feasibility.Verdict(name="toy_fit", ok=ok, reason=f"toy refuses xp={degree}")


def _xp_bytes(layer: axis_costs.AxisLayer) -> float:
    """The toy's collective: its TP shard of the layer's activations, in even layers only."""
    if layer.layer % 2:
        return 0.0
    return layer.tokens * layer.model.hidden * layer.element_bytes / layer.tp


def _xp_shard(model: ModelSpec, i: int) -> float:
    """The toy shards half of every layer's weights over its group."""
    return formulas.layer_params(model, i) / 2


XP_COMM = axis_costs.AxisCost(key="xp_comm", word="xp-link", op="all_to_all", nbytes=_xp_bytes,
                        calls=(2, 3))
XP_SHARD = replace(XP_COMM, sharded_params=_xp_shard)


def _register(cost: axis_costs.AxisCost | None = None, runtime: bool = False) -> None:
    """The toy's row (data) and, given one, its cost registered by its name in the sim."""
    axes.register(axes.AxisDef(name="xp", scope="plan", predicate="toy_fit",
                               collective="none (a toy)", runtime=runtime, exported=runtime))
    if cost is None:
        axis_costs.unregister("xp")
    else:
        axis_costs.register("xp", cost)


@pytest.fixture
def toy():
    pred = Toy()
    _register()
    feasibility.PREDICATES["toy_fit"] = pred
    yield pred
    axes.unregister("xp")
    axis_costs.unregister("xp")
    del feasibility.PREDICATES["toy_fit"]


def _search(space=SPACE):
    cost = SyntheticCostModel(MODEL, CLUSTER, JOB, seed=5)
    return search(MODEL, CLUSTER, JOB, space, cost=cost, workers=1, top=5)


def test_the_planner_asks_a_registered_axis_and_counts_its_removals(toy):
    # the baseline without the axis, then the same search with it registered
    axes.unregister("xp")
    plain = _search()
    _register()
    same = _search()
    assert [r.key for r in same.ranked] == [r.key for r in plain.ranked]
    assert [to_dict(r.plan) for r in same.ranked] == [to_dict(r.plan) for r in plain.ranked]
    assert toy.asked and {d for d, _ in toy.asked} == {1}
    assert set(toy.asked[0][1]) == {"tp", "cp", "dp", "pp", "ep", "etp", "xp"}
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
    with pytest.raises(ConfigError, match="unknown parallel axis 'zz'"):
        SearchSpace(axes={"zz": (1, 2)})
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
    plan = Plan(tp=2, pp=2, dp=2, global_batch=16, axes=(("xp", 2),))
    with pytest.raises(ConfigError, match="plan: xp=2 is not supported by the runtime"):
        _check_supported(plan, model)
    with pytest.raises(ConfigError, match="export: xp=2 is not exported by any target"):
        common(plan, model, label="a target")
    # declared executed: the runtime's refusal is gone; its predicate still decides
    axes.unregister("xp")
    _register(runtime=True)
    with pytest.raises(Infeasible, match="toy refuses xp=2"):
        _check_supported(plan, model)
    common(plan, model, label="a target")


def test_plans_carry_a_registered_axis_by_its_own_key(toy):
    plan = parse_inline_plan("tp=2,dp=4,gbs=16,xp=2")
    assert plan.axes == (("xp", 2),) and plan.degree("xp") == 2
    data = to_dict(plan)
    assert data["xp"] == 2 and "axes" not in data
    assert from_dict(Plan, json.loads(json.dumps(data)), "plan") == plan
    assert to_dict(Plan(tp=2, global_batch=8)) == to_dict(Plan(tp=2, global_batch=8, axes=(
        ("xp", 1),)))  # degree 1 is left out: the plan without the axis
    with pytest.raises(ConfigError, match="xp must be an integer >= 1, got 0"):
        parse_inline_plan("tp=2,gbs=16,xp=0")
    with pytest.raises(ConfigError, match="only plan-scope"):
        Plan(tp=2, global_batch=8, axes=(("cp", 2),))
    axes.unregister("xp")
    with pytest.raises(ConfigError, match="unknown key 'xp'"):
        parse_inline_plan("tp=2,dp=4,gbs=16,xp=2")


SIM_JOB = Job(name="toy", global_batch=16, seq_len=4096)


def _sim_plans(toy: Toy, cost: axis_costs.AxisCost) -> tuple[Plan, Plan]:
    """Register the toy with ``cost``; the plan without it and with xp = 2 (tp 2, dp 4)."""
    toy.most = 2
    axes.unregister("xp")
    _register(cost)
    base = Plan(tp=2, dp=4, global_batch=16)
    return base, replace(base, axes=(("xp", 2),))


def _xp_seconds(model: ModelSpec, cluster, plan: Plan, calls: int) -> float:
    """What the toy's hooks imply per micro-batch: ``calls`` all-to-alls of ``_xp_bytes`` per
    layer on the slowest of the xp groups ``place`` forms (the sim's own group)."""
    topo = net.topology(cluster)
    pl = place(model, cluster, plan)
    tokens = SIM_JOB.seq_len  # micro_batch 1, cp 1
    per_group = []
    for g in pl.groups("xp"):
        assert len(g) == 2
        shape = topo.shape([(pl.ranks[r].group, pl.ranks[r].device) for r in g])
        per_group.append(sum(net.all_to_all(shape, _xp_bytes(axis_costs.AxisLayer(
            model=model, layer=i, tokens=tokens, tp=2, degree=2, element_bytes=2)))
            for i in range(model.n_layers)))
    return calls * max(per_group)


@pytest.mark.parametrize("explicit", [False, True])
def test_the_simulator_charges_a_registered_axis_by_its_row(toy, explicit):
    """The toy's collective adds calls x all-to-all seconds per layer per micro-batch to the
    only pipeline rank, in its own breakdown term; uniform and explicit plans alike."""
    model, cluster = load_model("llama3.1-8b"), load_cluster("selene-a100")
    base, plan = _sim_plans(toy, XP_COMM)
    if explicit:
        base, plan = expand(base, model, cluster), expand(plan, model, cluster)
        assert plan.axes == (("xp", 2),)
    a, b = simulate(model, cluster, base, SIM_JOB), simulate(model, cluster, plan, SIM_JOB)
    m = 16 // 4
    want = m * _xp_seconds(model, cluster, plan, sum(XP_COMM.calls))
    assert want > 0
    assert b.breakdown["xp_comm"] == pytest.approx(want, rel=1e-12)
    # the report lists the term only where the plan charges it (Report.shown_keys)
    assert "xp_comm" not in a.to_dict()["breakdown"] and "xp_comm" in b.to_dict()["breakdown"]
    assert b.iteration_time_s - a.iteration_time_s == pytest.approx(want, rel=1e-9)
    assert b.to_dict()["breakdown"]["xp_comm"] == b.breakdown["xp_comm"]
    assert sum(b.to_dict()["breakdown"].values()) == pytest.approx(b.iteration_time_s, rel=1e-12)
    assert [r.to_dict() for r in a.memory] == [r.to_dict() for r in b.memory]
    # full recompute repeats the forward's collectives in the backward
    full = simulate(model, cluster, replace(plan, recompute="full"), SIM_JOB)
    calls = XP_COMM.calls[0] * 2 + XP_COMM.calls[1]
    assert full.breakdown["xp_comm"] == pytest.approx(
        m * _xp_seconds(model, cluster, plan, calls), rel=1e-12)


def test_the_simulator_shards_what_a_registered_axis_row_says(toy):
    """Half of every layer's weights over xp = 2: each GPU holds a quarter of them less
    (after tp = 2), in weights, gradients and optimizer state alike (bf16 + Adam: 2, 2, 12
    bytes per parameter; ZeRO 0), plus the allocator's fragmentation share of it."""
    model, cluster = load_model("llama3.1-8b"), load_cluster("selene-a100")
    base, plan = _sim_plans(toy, XP_SHARD)
    a, b = simulate(model, cluster, base, SIM_JOB), simulate(model, cluster, plan, SIM_JOB)
    held = sum(_xp_shard(model, i) for i in range(model.n_layers)) * (1 - 1 / 2) / 2
    (ra,), (rb,) = a.memory, b.memory
    assert ra.params - rb.params == pytest.approx(2 * held, rel=1e-12)
    assert ra.grads - rb.grads == pytest.approx(2 * held, rel=1e-12)
    assert ra.optimizer - rb.optimizer == pytest.approx(12 * held, rel=1e-12)
    assert ra.activations == rb.activations
    assert ra.total - rb.total == pytest.approx(
        16 * held * (1 + DEFAULT.allocator_fragmentation), rel=1e-12)
    # the shard does not change the collective the row names
    assert b.breakdown["xp_comm"] == pytest.approx(
        4 * _xp_seconds(model, cluster, plan, sum(XP_COMM.calls)), rel=1e-12)


def test_the_simulator_backed_planner_prices_a_costed_axis_per_layer(toy):
    """The planner's probes (``SimCostModel``) carry the toy's replicas: a stage's layer
    time grows by the toy's collectives of one layer (here in every layer)."""
    model, cluster = load_model("llama3.1-8b"), load_cluster("selene-a100")
    every = replace(XP_COMM, nbytes=lambda la: la.tokens * la.model.hidden * la.element_bytes
                    / la.tp)
    _sim_plans(toy, every)
    g = cluster.node_groups[0].name
    cost = SimCostModel(model, cluster, SIM_JOB)
    plain = cost.stage_cost(StageKey(group=g, tp=2))
    wide = cost.stage_cost(StageKey(group=g, tp=2, axes=(("xp", 2),)))
    shape = net.topology(cluster).shape([(g, 0), (g, 2)])  # replicas 0 and 1 at tp = 2
    one = net.all_to_all(shape, SIM_JOB.seq_len * model.hidden * 2 / 2)
    assert wide.layer_time_s - plain.layer_time_s == pytest.approx(5 * one, rel=1e-9)
    assert wide.layer_state == plain.layer_state


def test_a_costed_axis_must_divide_the_data_parallel_ranks(toy):
    model, cluster = load_model("llama3.1-8b"), load_cluster("selene-a100")
    _, plan = _sim_plans(toy, XP_COMM)
    toy.most = 4  # the predicate lets it through: the simulator's own check refuses it
    for p in (replace(plan, dp=2, global_batch=8, axes=(("xp", 4),)),
              expand(replace(plan, dp=2, global_batch=8, axes=(("xp", 4),)), model, cluster)):
        with pytest.raises(Infeasible, match="xp=4 does not divide dp=2"):
            simulate(model, cluster, p, replace(SIM_JOB, global_batch=8))


def test_only_plan_scope_axes_register():
    with pytest.raises(ConfigError, match="only plan-scope"):
        axes.register(axes.AxisDef(name="ep", scope="stage", predicate="p", collective="a2a"))
    with pytest.raises(ConfigError, match="built in"):
        axes.unregister("tp")
    with pytest.raises(ConfigError, match="'zero': the name is a plan field"):
        axes.register(axes.AxisDef(name="zero", scope="plan", predicate="p", collective="a2a"))
    assert "zero" not in {a.name for a in axes.axes()}
    with pytest.raises(ConfigError, match="axis tp: only plan-scope axes carry a cost"):
        axis_costs.register("tp", XP_COMM)
    with pytest.raises(ConfigError, match="unknown parallel axis 'yy'"):
        axis_costs.register("yy", XP_COMM)


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
