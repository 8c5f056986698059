"""``Mesh``: named groups, flatten / unflatten, the expert view, uniform = explicit."""

from dataclasses import replace
from math import prod

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetpar.catalog import load_model, parse_inline_plan
from hetpar.errors import ConfigError
from hetpar.placement import Mesh, place, symmetric
from hetpar.specs.cluster import ClusterSpec, NodeGroup
from hetpar.specs.expand import expand
from hetpar.specs.plan import Plan
from hetpar.specs.stage import Replica, Stage

MODEL = load_model("llama3.1-8b")
CLUSTER = ClusterSpec(name="big", node_groups=(
    NodeGroup(name="a", gpu="H100", num_nodes=64, gpus_per_node=8),))
ORDERS = ["tp-cp-dp-pp", "tp-cp-pp-dp", "tp-dp-cp-pp", "pp-dp-cp-tp", "dp-tp-pp-cp"]
NAMES = ("tp", "cp", "dp", "pp", "dp_cp", "cp_tp", "dp_cp_tp", "pp_dp")


def _plan(tp: int, cp: int, dp: int, pp: int, order: str) -> Plan:
    return parse_inline_plan(f"tp={tp},cp={cp},dp={dp},pp={pp},gbs={dp},order={order}")


def _partitions(mesh: Mesh, name: str) -> tuple[tuple[int, ...], ...]:
    groups = mesh.groups(name)
    members = sorted(r for g in groups for r in g)
    assert members == list(range(mesh.world_size)), f"{name}: not every rank exactly once"
    return groups


degrees = st.tuples(st.sampled_from([1, 2, 4]), st.sampled_from([1, 2]),
                    st.sampled_from([1, 2, 3, 4, 6]), st.sampled_from([1, 2, 4]),
                    st.sampled_from(ORDERS))


@settings(max_examples=40, deadline=None)
@given(degrees)
def test_every_named_group_partitions_the_ranks_with_the_product_size(d: tuple) -> None:
    tp, cp, dp, pp, order = d
    mesh = place(MODEL, CLUSTER, _plan(tp, cp, dp, pp, order))
    size = {"tp": tp, "cp": cp, "dp": dp, "pp": pp}
    assert mesh.world_size == prod(size.values())
    for name in NAMES:
        want = prod(size[n] for n in name.split("_"))
        groups = _partitions(mesh, name)
        assert {len(g) for g in groups} == {want}, name
        assert len(groups) == mesh.world_size // want, name
    # flattening dp and cp is the same partition as asking for "dp_cp"
    assert mesh.flatten(["dp", "cp"], "batch").groups("batch") == mesh.groups("dp_cp")


@settings(max_examples=30, deadline=None)
@given(degrees)
def test_the_uniform_grid_view_forms_the_meshs_groups(d: tuple) -> None:
    """``Symmetric.members`` (the simulator's fast path) reads the mesh's groups off the grid:
    on one node group from device 0, a rank is its device."""
    tp, cp, dp, pp, order = d
    plan = _plan(tp, cp, dp, pp, order)
    mesh, sym = place(MODEL, CLUSTER, plan), symmetric(plan, CLUSTER)
    assert sym is not None
    for name in NAMES:
        grid = set()
        for p in mesh.ranks:  # the group through each rank's coordinates
            at = {"tp": p.tp_rank, "cp": p.cp_rank, "dp": p.replica, "pp": p.pp_rank}
            grid.add(sym.members(name, **at))
        assert grid == set(mesh.groups(name)), name


@settings(max_examples=20, deadline=None)
@given(degrees)
def test_a_uniform_plan_and_its_explicit_form_place_alike(d: tuple) -> None:
    tp, cp, dp, pp, order = d
    plan = _plan(tp, cp, dp, pp, order)
    uniform = place(MODEL, CLUSTER, plan)
    explicit = place(MODEL, CLUSTER, replace(expand(plan, MODEL, CLUSTER), group=None))
    for name in NAMES:
        assert explicit.groups(name) == uniform.groups(name), name
    assert explicit.stage_ranks == uniform.stage_ranks


@settings(max_examples=20, deadline=None)
@given(degrees)
def test_plan_axes_at_degree_1_get_the_coordinates_their_dp_position_gives(d: tuple) -> None:
    """``place`` sets coordinate 0 at once where every plan-scope axis has degree 1; the
    position-in-dp rule (``_with_coords``) gives the same ranks."""
    from hetpar.placement.place import _with_coords
    from hetpar.specs import axes

    tp, cp, dp, pp, order = d
    plan = _plan(tp, cp, dp, pp, order)
    mesh = place(MODEL, CLUSTER, plan)
    named = axes.plan_degrees(plan)
    assert named and all(deg == 1 for _, deg in named)  # the bundled ep / etp
    assert all(p.coords == tuple((n, 0) for n, _ in named) for p in mesh.ranks)
    assert _with_coords(mesh, named) == mesh


def test_the_simulators_placed_plan_is_the_meshs_and_refuses_alike() -> None:
    from hetpar.placement import placed_plan

    st2 = (Stage(layers=(0, 16), group="a", tp=2, devices=(0, 1)),
           Stage(layers=(16, 32), group="a", tp=2, devices=(2, 3)))
    ok = Plan(name="p", replicas=(Replica(stages=st2, batch=2, micro_batch=1),) * 1)
    assert placed_plan(MODEL, CLUSTER, ok) == place(MODEL, CLUSTER, ok).plan
    clash = (Stage(layers=(0, 16), group="a", tp=2, devices=(4, 5)),
             Stage(layers=(16, 32), group="a", tp=2, devices=(5, 6)))
    bad = Plan(name="p", replicas=(Replica(stages=clash, batch=2, micro_batch=1),))
    with pytest.raises(ConfigError) as mesh_error:
        place(MODEL, CLUSTER, bad)
    with pytest.raises(ConfigError) as sim_error:
        placed_plan(MODEL, CLUSTER, bad)
    assert str(sim_error.value) == str(mesh_error.value)
    assert "device 5 of node group 'a'" in str(sim_error.value)  # expand's pinned-device check


@settings(max_examples=40, deadline=None)
@given(degrees, st.data())
def test_unflattened_dp_and_the_expert_view(d: tuple, data: st.DataObject) -> None:
    tp, cp, dp, pp, order = d
    mesh = place(MODEL, CLUSTER, _plan(tp, cp, dp, pp, order))
    shard = data.draw(st.sampled_from([s for s in range(1, dp + 1) if dp % s == 0]))
    split = mesh.unflatten("dp", [("dp_replicate", dp // shard), ("dp_shard", shard)])
    assert split.groups("dp") == mesh.groups("dp")  # dp stays a view of its parts
    assert {len(g) for g in _partitions(split, "dp_shard")} == {shard}
    assert {len(g) for g in _partitions(split, "dp_replicate")} == {dp // shard}
    assert {len(g) for g in _partitions(split, "dp_shard_cp")} == {shard * cp}
    etp = data.draw(st.sampled_from(sorted({1, tp})))
    carved = shard * cp * (tp if etp == 1 else 1)
    ep = data.draw(st.sampled_from([e for e in range(1, carved + 1) if carved % e == 0]))
    moe = split.with_experts(ep, etp)
    eps, edps = _partitions(moe, "ep"), _partitions(moe, "edp")
    assert {len(g) for g in eps} == {ep}
    assert {len(g) for g in edps} == {dp * cp * tp // etp // ep}
    assert ep * len(edps[0]) == dp * cp * (tp // etp)  # EP x EDP = DP x CP (x TP)
    # an edp group's ranks hold the same experts: one per ep group of its pipeline rank
    where = {r: (i, g.index(r)) for i, g in enumerate(eps) for r in g}
    for g in edps:
        assert len({where[r][0] for r in g}) == len(g)
        assert len({where[r][1] for r in g}) == 1
        assert len({moe.ranks[r].pp_rank for r in g}) == 1
    assert {len(g) for g in _partitions(moe, "etp")} == {etp}
    assert {len(g) for g in _partitions(moe, "efsdp")} == {carved // ep}


def test_torchtitan_style_errors_name_every_factor() -> None:
    mesh = place(MODEL, CLUSTER, _plan(2, 1, 6, 1, "tp-cp-dp-pp"))
    with pytest.raises(ConfigError, match=r"dp_replicate\(4\) x dp_shard\(2\) = 8 != dp 6"):
        mesh.unflatten("dp", [("dp_replicate", 4), ("dp_shard", 2)])
    with pytest.raises(ConfigError, match=r"ep=4 does not divide dp\(6\) x cp\(1\) = 6"):
        mesh.with_experts(4, etp=2)
    with pytest.raises(ConfigError, match="etp=4 must be 1 or the tp degree; tp is 2"):
        mesh.with_experts(2, etp=4)
    with pytest.raises(ConfigError, match="unknown dimension 'xx'"):
        mesh.groups("xx")
    with pytest.raises(ConfigError, match="needs the expert view"):
        mesh.groups("edp")  # ep is a bundled plan-scope axis: its groups exist without it


def test_a_heterogeneous_plan_is_a_mesh_per_replica_and_stage() -> None:
    g = "a"
    two = (Stage(layers=(0, 16), group=g, tp=2), Stage(layers=(16, 32), group=g, tp=2))
    a = Replica(stages=two, batch=4, micro_batch=1)
    c = Replica(stages=(Stage(layers=(0, 32), group=g, tp=4),), batch=4, micro_batch=1)
    mesh = place(MODEL, CLUSTER, Plan(replicas=(a, a, c)))
    # tp: each stage's own ranks; pp: inside one replica; dp: the same shard across replicas
    assert set(_partitions(mesh, "tp")) == {s for r in mesh.stage_ranks for s in r}
    for grp in _partitions(mesh, "pp"):
        assert len({mesh.ranks[r].replica for r in grp}) == 1
    for grp in _partitions(mesh, "dp"):
        shard = {(mesh.plan.replicas[mesh.ranks[r].replica].stages[mesh.ranks[r].pp_rank].layers,
                  mesh.ranks[r].tp, mesh.ranks[r].tp_rank) for r in grp}
        assert len(shard) == 1
    assert sorted(len(x) for x in mesh.groups("dp")) == [1, 1, 1, 1, 2, 2, 2, 2]
    with pytest.raises(ConfigError, match="tp is 2/4"):
        mesh.with_experts(2, etp=2)
    assert mesh.with_experts(1).groups("edp") == mesh.groups("dp_cp_tp")
    moe = mesh.with_experts(2)  # each shard's dp x tp ranks: 4 for the first two, 4 for c
    assert {len(x) for x in _partitions(moe, "ep")} == {2}
    assert {len(x) for x in _partitions(moe, "edp")} == {2}


def test_a_plan_scope_axis_groups_are_the_expert_view_without_cp():
    """A registered plan-scope axis of degree d groups runs of d data-parallel peers: the
    expert view's ep groups when cp = 1 and etp = tp (torchtitan's ep inside dp_shard)."""
    from hetpar.specs import axes

    axes.register(axes.AxisDef(name="xq", scope="plan", predicate="p", collective="toy"))
    try:
        plan = parse_inline_plan("tp=2,dp=8,pp=2,gbs=8,xq=4")
        mesh = place(MODEL, CLUSTER, plan)
        assert mesh.groups("xq") == mesh.with_experts(4, etp=2).groups("ep")
        assert {len(g) for g in _partitions(mesh, "xq")} == {4}
    finally:
        axes.unregister("xq")
