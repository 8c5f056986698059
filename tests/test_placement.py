"""``place``: every rank's coordinates and device, and the communicator groups of each axis."""

import pytest

from hetpar.catalog import load_cluster, load_model, parse_inline_plan
from hetpar.errors import ConfigError
from hetpar.placement import place
from hetpar.runtime.layout import build_layout
from hetpar.specs.plan import Plan
from hetpar.specs.stage import Replica, Stage

MODEL, CLUSTER = load_model("llama3.1-8b"), load_cluster("selene-a100")


@pytest.mark.parametrize("order", ["tp-cp-dp-pp", "tp-cp-pp-dp", "tp-dp-cp-pp"])
def test_uniform_ranks_follow_the_plan_order(order: str) -> None:
    plan = parse_inline_plan(f"tp=2,cp=2,pp=2,dp=2,gbs=8,order={order}")
    pl = place(MODEL, CLUSTER, plan)
    assert pl.world_size == 16
    deg = {"tp": 2, "cp": 2, "dp": 2, "pp": 2}
    for p in pl.ranks:
        coords = {"tp": p.tp_rank, "cp": p.cp_rank, "dp": p.replica, "pp": p.pp_rank}
        index, stride = 0, 1
        for axis in order.split("-"):
            index, stride = index + coords[axis] * stride, stride * deg[axis]
        assert p.rank == index == p.device  # one node group: device index = rank
    for axis in ("tp", "cp", "dp", "pp"):
        groups = pl.groups(axis)
        assert len(groups) == 8 and all(len(g) == 2 for g in groups), axis
        assert sorted(r for g in groups for r in g) == list(range(16)), axis
    # the device axes, then the bundled plan-scope ones (ep, etp) at degree 1
    assert [a.degree for a in pl.axes] == [2, 2, 2, 2, 1, 1]
    assert [a.name for a in pl.axes][4:] == ["ep", "etp"]


def test_heterogeneous_replicas_share_dp_groups_only_for_the_same_shard() -> None:
    g = CLUSTER.node_groups[0].name
    two = (Stage(layers=(0, 16), group=g, tp=2), Stage(layers=(16, 32), group=g, tp=2))
    a = b = Replica(stages=two, batch=4, micro_batch=1)
    c = Replica(stages=(Stage(layers=(0, 32), group=g, tp=4),), batch=4, micro_batch=1)
    pl = place(MODEL, CLUSTER, Plan(replicas=(a, b, c)))
    assert pl.world_size == 12
    dp = pl.groups("dp")
    assert sorted(len(x) for x in dp) == [1, 1, 1, 1, 2, 2, 2, 2]
    assert pl.axis("tp").degree == 4 and pl.axis("dp").degree == 3


def test_runtime_layout_is_a_view_of_the_placement() -> None:
    plan = parse_inline_plan("tp=2,pp=2,dp=2,vpp=2,gbs=8,schedule=interleaved")
    lay, pl = build_layout(plan, MODEL, CLUSTER), place(MODEL, CLUSTER, plan)
    assert lay.stage_ranks == pl.stage_ranks
    assert [(r.replica, r.pp_rank, r.tp_rank, r.chunks) for r in lay.roles] == [
        (p.replica, p.pp_rank, p.tp_rank, p.chunks) for p in pl.ranks]


def test_two_stages_on_one_device_are_refused() -> None:
    g = CLUSTER.node_groups[0].name
    s = Stage(layers=(0, 32), group=g, tp=1, devices=(0,))
    with pytest.raises(ConfigError, match="pinned by replica .* and replica"):
        place(MODEL, CLUSTER, Plan(replicas=(Replica(stages=(s,), batch=1, micro_batch=1),) * 2))
