"""Hierarchical gradient sync on gloo: same training as the single-process reference."""

import dataclasses
import os

from loadscale import limits
from runtime_helpers import CFG, TINY_GPT, _rank_fn

from hetpar.runtime import ncclenv
from hetpar.runtime.gradsync import sync_groups
from hetpar.runtime.hiersync import needed_groups, split
from hetpar.runtime.launch import launch
from hetpar.runtime.layout import build_layout
from hetpar.runtime.trainer import gather_full, reference
from hetpar.specs.cluster import ClusterSpec, NodeGroup
from hetpar.specs.collectives import Collectives
from hetpar.specs.plan import Plan


def test_split_groups_ranks_by_node():
    nodes = (0, 0, 1, 1, 2, 2)
    assert split((0, 1, 2, 3, 4, 5), nodes) == ([(0, 1), (2, 3), (4, 5)], [(0, 2, 4), (1, 3, 5)])
    assert split((0, 2, 4), nodes) is None  # one rank per node: a flat ring already
    assert split((0, 1, 2), nodes) is None  # uneven: flat


def test_hierarchical_sync_trains_like_the_reference():
    cluster = ClusterSpec(name="two-boxes", collectives="best", node_groups=(
        NodeGroup(name="box", gpu="cpu", num_nodes=2, gpus_per_node=2),))
    plan = Plan(tp=1, pp=1, dp=4, micro_batch=1, global_batch=8)
    layout = build_layout(plan, TINY_GPT, cluster)
    assert layout.hierarchical and layout.nodes == (0, 0, 1, 1)
    assert needed_groups(sync_groups(layout), layout.nodes)  # the sync does go hierarchical
    res = launch(_rank_fn, layout.world_size, layout, CFG, 3, **limits(CFG.timeout_s))
    ref_losses, ref_params = reference(TINY_GPT, layout.plan.batch, 3, CFG)
    for r in res:
        for a, b in zip(r.losses, ref_losses, strict=True):
            assert abs(a - b) <= 1e-5 * abs(b)
    for rep in range(layout.replicas):
        for name, p in gather_full(layout, res, rep).items():
            assert (p - ref_params[name]).abs().max().item() <= 1e-6, name
    flat = dataclasses.replace(cluster, collectives="nccl")
    assert not build_layout(plan, TINY_GPT, flat).hierarchical


def test_the_plans_dp_sync_picks_the_sync_and_both_train_alike():
    """collectives.dp_sync wins over the cluster's collectives; on 2 faked nodes x 2 gloo ranks
    the hierarchical and the flat sync give the same losses."""
    nccl = ClusterSpec(name="two-boxes", collectives="nccl", node_groups=(
        NodeGroup(name="box", gpu="cpu", num_nodes=2, gpus_per_node=2),))
    base = Plan(tp=1, pp=1, dp=4, micro_batch=1, global_batch=8)
    hier = dataclasses.replace(base, collectives=Collectives(dp_sync="hierarchical"))
    flat = dataclasses.replace(base, collectives=Collectives(dp_sync="flat"))
    lh = build_layout(hier, TINY_GPT, nccl)
    lf = build_layout(flat, TINY_GPT, dataclasses.replace(nccl, collectives="best"))
    assert lh.hierarchical and not lf.hierarchical
    losses = [launch(_rank_fn, lay.world_size, lay, CFG, 3, **limits(CFG.timeout_s))[0].losses
              for lay in (lh, lf)]
    for a, b in zip(*losses, strict=True):
        assert abs(a - b) <= 1e-5 * abs(b)


def test_forced_nccl_choice_is_set_for_nccl_and_warned_about_on_gloo(monkeypatch):
    plan = Plan(tp=1, pp=1, dp=4, micro_batch=1, global_batch=8,
                collectives=Collectives(algorithm="ring", protocol="LL128"))
    for k in ("NCCL_ALGO", "NCCL_PROTO"):
        monkeypatch.delenv(k, raising=False)
    line = ncclenv.apply(plan, "gloo")
    assert "NCCL_ALGO=Ring NCCL_PROTO=LL128" in line and "gloo" in line and "\n" not in line
    assert "NCCL_ALGO" not in os.environ
    assert ncclenv.apply(plan, "nccl") == ""
    assert (os.environ["NCCL_ALGO"], os.environ["NCCL_PROTO"]) == ("Ring", "LL128")
    assert ncclenv.apply(dataclasses.replace(plan, collectives=None), "gloo") == ""
