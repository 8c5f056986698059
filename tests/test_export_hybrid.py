"""dp_sync = 'hierarchical' in the exports: hybrid sharding where the framework runs what the
simulator prices (export/hybrid.py), a one-line refusal naming the nearest plan elsewhere."""

from __future__ import annotations

import dataclasses

import pytest

from hetpar.catalog import load_model, parse_inline_plan
from hetpar.errors import ConfigError
from hetpar.export import export, get, parse
from hetpar.sim import simulate
from hetpar.specs.cluster import ClusterSpec, NodeGroup

HSDP = "tp=1,dp=8,gbs=64,recompute=full,zero=1,zero_scope=group,dp_sync=hierarchical"


def _cluster(nodes: int = 1, per_node: int = 4, groups: int = 2) -> ClusterSpec:
    """``groups`` node groups of ``nodes`` nodes of ``per_node`` A100s each."""
    return ClusterSpec(name="hybrid", node_groups=tuple(
        NodeGroup(name=f"g{i}", gpu="A100-SXM4-80GB", num_nodes=nodes, gpus_per_node=per_node)
        for i in range(groups)))


@pytest.fixture(scope="module")
def model():
    return load_model("llama3.1-8b")  # the registry forms have configs for llama3 sizes only


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny-llama")


@pytest.mark.parametrize("version", ["2025-07", "2025-10", "2026-02", "0.3.0", "2026-08"])
def test_torchtitan_hsdp_is_node_groups_by_shard(model, version):
    e = export(parse_inline_plan(HSDP), model, "torchtitan", cluster=_cluster(), version=version)
    opts = {k.lstrip("-").removeprefix("parallelism."): v for k, v in e.options.items()}
    assert (opts["data_parallel_replicate_degree"], opts["data_parallel_shard_degree"]) == (2, 4)
    assert e.problems() == []


def test_torchtitan_hsdp_reads_back_as_the_hierarchical_plan(model):
    e = export(parse_inline_plan(HSDP), model, "torchtitan", cluster=_cluster(),
               version="2025-10")
    back = parse("torchtitan", e.files[0][1], model)
    assert (back.dp, back.zero_scope, back.collectives.dp_sync) == (8, "group", "hierarchical")


def test_exported_shard_degree_is_what_the_simulator_shards_the_optimizer_over(model, tiny):
    """HSDP's shard degree divides the optimizer in the simulator's price of the plan (the
    zero = 0 plan keeps it whole): the export runs the memory the plan was checked for."""
    c = _cluster()
    e = export(parse_inline_plan(HSDP), model, "torchtitan", cluster=c, version="2025-10")
    shard = e.options["parallelism.data_parallel_shard_degree"]
    hybrid = simulate(tiny, c, parse_inline_plan(HSDP)).to_dict()["memory"][0]
    whole = simulate(tiny, c, parse_inline_plan(HSDP.replace(
        "zero=1,zero_scope=group", "zero=0"))).to_dict()["memory"][0]
    assert hybrid["optimizer_gib"] == pytest.approx(whole["optimizer_gib"] / shard, rel=1e-6)


def test_megatron_writes_distributed_optimizer_instances(model):
    e = export(parse_inline_plan(HSDP), model, "megatron", cluster=_cluster(groups=4, per_node=2))
    assert e.options["--num-distributed-optimizer-instances"] == 4
    assert "--use-distributed-optimizer" in e.options
    assert e.problems() == []
    back = parse("megatron", e.files[0][1], model)
    assert (back.zero, back.zero_scope, back.collectives.dp_sync) == (1, "group", "hierarchical")
    check = get("megatron").check_export(e)  # megatron-core's DistributedDataParallelConfig
    if check.accepted is None:
        pytest.skip(check.message)
    assert check.accepted, check.message


@pytest.mark.parametrize("change, target, match", [
    ("zero=0", "torchtitan", "zero = 0 is a hierarchical all-reduce"),
    ("zero=0", "megatron", "zero = 0 is a hierarchical all-reduce"),
    ("zero=1", "torchtitan", "zero_scope = 'all' shards ZeRO over all 8 replicas"),
    ("zero=3,zero_scope=group", "megatron", "not Megatron-FSDP; nearest plan: zero = 1"),
    ("zero=3,zero_scope=group", "deepspeed", "MiCS .* was removed"),
])
def test_refusals_name_the_field_and_the_nearest_plan(model, change, target, match):
    plan = parse_inline_plan(HSDP.replace("zero=1,zero_scope=group", change))
    with pytest.raises(ConfigError, match=match) as err:
        export(plan, model, target, cluster=_cluster())
    assert "plan.collectives.dp_sync = 'hierarchical'" in str(err.value)
    assert "nearest plan" in str(err.value) and "\n" not in str(err.value)


def test_shard_groups_over_several_nodes_are_refused(model):
    """Priced hierarchically inside the group, run as one flat reduce-scatter by the framework."""
    with pytest.raises(ConfigError, match="shard groups span nodes"):
        export(parse_inline_plan(HSDP), model, "torchtitan", cluster=_cluster(nodes=2, per_node=2))


def test_unequal_groups_and_a_missing_cluster_are_refused(model):
    uneven = ClusterSpec(name="uneven", node_groups=(
        NodeGroup(name="a", gpu="A100-SXM4-80GB", num_nodes=1, gpus_per_node=6),
        NodeGroup(name="b", gpu="A100-SXM4-80GB", num_nodes=1, gpus_per_node=2)))
    with pytest.raises(ConfigError, match="as many replicas on every node group"):
        export(parse_inline_plan(HSDP), model, "torchtitan", cluster=uneven)
    with pytest.raises(ConfigError, match="needs --cluster"):
        export(parse_inline_plan(HSDP), model, "torchtitan")


def test_deepspeed_itself_refuses_the_mics_keys():
    """The refusal's reason, from the installed DeepSpeed's own config parser."""
    ds_config = pytest.importorskip("deepspeed.runtime.config", reason="DeepSpeed not installed")
    cfg = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 1,
           "zero_optimization": {"stage": 3, "mics_shard_size": 4}}
    get_rank = ds_config.dist.get_rank
    ds_config.dist.get_rank = lambda *a, **k: 0  # no process group on a CPU test machine
    try:
        with pytest.raises(Exception, match="MiCS"):
            ds_config.DeepSpeedConfig(cfg)
    finally:
        ds_config.dist.get_rank = get_rank


# zero_scope = "group" without the forced hierarchical sync: ZeRO over each node group's
# replicas, the shards all-reduced across the groups, as the simulator prices it
# (sim/structure._cross_sync); a shard group may span nodes (one flat call, as priced).
GROUP = "tp=1,dp=8,gbs=64,recompute=full,zero=1,zero_scope=group"


@pytest.mark.parametrize("version", ["2025-07", "2025-10", "2026-02", "0.3.0", "2026-08"])
@pytest.mark.parametrize("sync", ["", ",dp_sync=flat"])
def test_torchtitan_writes_zero_per_node_group_as_hsdp(model, version, sync):
    c = _cluster(nodes=2, per_node=2)  # each group's 4 replicas over 2 nodes: flat is fine
    e = export(parse_inline_plan(GROUP + sync), model, "torchtitan", cluster=c, version=version)
    opts = {k.lstrip("-").removeprefix("parallelism."): v for k, v in e.options.items()}
    assert (opts["data_parallel_replicate_degree"], opts["data_parallel_shard_degree"]) == (2, 4)
    assert e.problems() == []
    back = parse("torchtitan", e.files[0][1], model)
    assert back.zero_scope == "group"
    assert (back.collectives.dp_sync if back.collectives else "auto") == (
        "flat" if sync else "auto")


def test_megatron_writes_zero_per_node_group_as_optimizer_instances(model):
    e = export(parse_inline_plan(GROUP), model, "megatron", cluster=_cluster(groups=4, per_node=2))
    assert e.options["--num-distributed-optimizer-instances"] == 4 and e.problems() == []
    back = parse("megatron", e.files[0][1], model)
    assert (back.zero, back.zero_scope, back.collectives) == (1, "group", None)


def test_shard_degree_is_what_the_simulator_shards_the_optimizer_over_without_hierarchy(
        model, tiny):
    c = _cluster(nodes=2, per_node=2)
    e = export(parse_inline_plan(GROUP), model, "torchtitan", cluster=c, version="2025-10")
    shard = e.options["parallelism.data_parallel_shard_degree"]
    grouped = simulate(tiny, c, parse_inline_plan(GROUP)).to_dict()["memory"][0]
    whole = simulate(tiny, c, parse_inline_plan(GROUP.replace("zero=1,zero_scope=group",
                                                              "zero=0"))).to_dict()["memory"][0]
    assert shard == 4
    assert grouped["optimizer_gib"] == pytest.approx(whole["optimizer_gib"] / shard, rel=1e-6)


@pytest.mark.parametrize(("target", "cluster", "match"), [
    ("deepspeed", True, "has no option in deepspeed: MiCS"),
    ("torchtitan", False, "needs --cluster"),
    ("megatron", False, "needs --cluster"),
])
def test_zero_per_node_group_refusals_name_the_nearest_plan(model, target, cluster, match):
    with pytest.raises(ConfigError, match=match) as err:
        export(parse_inline_plan(GROUP), model, target, cluster=_cluster() if cluster else None)
    msg = str(err.value)
    assert msg.startswith("export: plan.zero_scope = 'group'") and "\n" not in msg
    assert msg.endswith(("nearest plan: zero_scope = 'all'",
                         "nearest plan without it: zero_scope = 'all'")), msg


def test_zero_per_node_group_refusals_for_uneven_groups_and_megatron_fsdp(model):
    uneven = ClusterSpec(name="uneven", node_groups=(
        NodeGroup(name="a", gpu="A100-SXM4-80GB", num_nodes=1, gpus_per_node=6),
        NodeGroup(name="b", gpu="A100-SXM4-80GB", num_nodes=1, gpus_per_node=2)))
    with pytest.raises(ConfigError, match="as many replicas on every node group.*nearest plan: "
                       "zero_scope = 'all'"):
        export(parse_inline_plan(GROUP), model, "torchtitan", cluster=uneven)
    with pytest.raises(ConfigError, match="plan.zero_scope = 'group' .hybrid sharding. and zero "
                       "= 3 has no Megatron-LM option.*nearest plan: zero = 1"):
        export(parse_inline_plan(GROUP.replace("zero=1", "zero=3")), model, "megatron",
               cluster=_cluster())


def test_zero_per_node_group_over_nodes_on_a_hierarchical_cluster_needs_flat(model):
    """dp_sync 'auto' takes the cluster's collectives: 'hierarchical' prices a shard group over
    two nodes in two levels, which HSDP's one reduce-scatter does not run; 'flat' exports."""
    c = dataclasses.replace(_cluster(nodes=2, per_node=2), collectives="hierarchical")
    with pytest.raises(ConfigError, match="dp_sync 'auto' on a cluster whose collectives = "
                       "'hierarchical' with zero_scope = 'group': the shard groups span nodes"):
        export(parse_inline_plan(GROUP), model, "torchtitan", cluster=c)
    e = export(parse_inline_plan(GROUP + ",dp_sync=flat"), model, "torchtitan", cluster=c)
    assert e.options["--parallelism.data_parallel_replicate_degree"] == 2
