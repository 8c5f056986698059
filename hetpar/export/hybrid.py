"""``dp_sync = "hierarchical"`` in the exports: hybrid sharding where a framework runs it.

The simulator prices ``dp_sync = "hierarchical"`` per ZeRO stage (``sim/structure._dp_sync``,
``net.collectives.hierarchical``):

- zero = 0: the all-reduce of replicated gradients as reduce-scatter inside each node, an
  all-reduce of the 1/k shards across nodes and an all-gather inside. Every rank keeps the
  whole optimizer. The frameworks' hybrid sharding moves the same bytes but shards the
  optimizer inside the group (less memory, 1/k of the optimizer step), so it is another plan.
- zero >= 1, zero_scope = "all": ZeRO shards over every replica, its reduce-scatter and
  all-gather decomposed level by level. Hybrid sharding keeps one copy per group: more memory
  than the plan was checked for.
- zero >= 1, zero_scope = "group": ZeRO shards over the replicas of one node group and the
  shards are all-reduced across the groups (``_cross_sync``). This is hybrid sharding: torchtitan
  HSDP (``data_parallel_replicate_degree`` x ``data_parallel_shard_degree``, the replicate
  dimension outermost in ``ParallelDims``' mesh) and Megatron-LM's partial distributed optimizer
  (``--num-distributed-optimizer-instances``: ``parallel_state.initialize_model_parallel`` cuts
  the DP ranks into that many contiguous intra-partial groups, megatron-core 0.16.1). It is
  exported when every shard group sits in one node: a shard group over several nodes is priced
  hierarchically, where the framework reduce-scatters it in one flat NCCL call.
"""

from __future__ import annotations

from hetpar.errors import ConfigError
from hetpar.placement import place
from hetpar.specs.cluster import ClusterSpec
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import Plan

FIELD = "plan.collectives.dp_sync = 'hierarchical'"


def hierarchical(plan: Plan) -> bool:
    """True when the plan forces the hierarchical DP sync."""
    return plan.collectives is not None and plan.collectives.dp_sync == "hierarchical"


def replicas(plan: Plan, model: ModelSpec, cluster: ClusterSpec | None, target: str,
             option: str) -> int:
    """How many copies of the ZeRO group the export writes (``option`` carries it, empty: the
    target has none): 1 unless the plan forces the hierarchical sync, else the node groups'
    count, or ConfigError naming why the target cannot run it and the nearest plan."""
    if not hierarchical(plan):
        return 1
    if plan.zero == 0:
        raise ConfigError(
            f"export: {FIELD} with zero = 0 is a hierarchical all-reduce of replicated weights "
            "(reduce-scatter inside each node, all-reduce of the shards across, all-gather "
            "inside), which no framework option runs: hybrid sharding also shards the optimizer "
            "inside the group; nearest plans: zero >= 1 with zero_scope = 'group', or "
            "dp_sync = 'flat'")
    if plan.zero_scope != "group":
        raise ConfigError(
            f"export: {FIELD} with zero_scope = 'all' shards ZeRO over all {plan.dp} replicas; "
            "the frameworks' hybrid sharding keeps one copy per group; nearest plans: "
            "zero_scope = 'group', or dp_sync = 'flat'")
    if not option:
        raise ConfigError(f"export: {FIELD} (hybrid sharding, zero_scope = 'group') has no "
                          f"option in {target}: {NO_OPTION.get(target, 'none is known')}; "
                          "nearest plan: dp_sync = 'flat' with zero_scope = 'all'")
    if cluster is None:
        raise ConfigError(f"export: {FIELD} with zero_scope = 'group' needs --cluster: the "
                          "shard groups are the replicas on each node group")
    return _groups(plan, model, cluster)


def _groups(plan: Plan, model: ModelSpec, cluster: ClusterSpec) -> int:
    """The number of node groups holding replicas, each with as many, each in one node."""
    mesh = place(model, cluster, plan)
    reps: dict[str, set[int]] = {}
    nodes: dict[str, set[int]] = {}
    for p in mesh.ranks:
        reps.setdefault(p.group, set()).add(p.replica)
        nodes.setdefault(p.group, set()).add(p.device // cluster.group(p.group).gpus_per_node)
    sizes = {g: len(r) for g, r in reps.items()}
    if len(set(sizes.values())) != 1:
        raise ConfigError(f"export: {FIELD} with zero_scope = 'group': the frameworks' "
                          "replicate x shard mesh needs as many replicas on every node group, "
                          f"got {sizes}")
    wide = {g: len(n) for g, n in nodes.items() if len(n) > 1}
    if wide:
        raise ConfigError(f"export: {FIELD} with zero_scope = 'group': the shard groups span "
                          f"nodes ({wide}); the plan prices their reduce-scatter inside nodes "
                          "first, the frameworks run it as one flat call; nearest plan: "
                          "dp_sync = 'flat', or node groups of one node each")
    return len(sizes)


NO_OPTION = {
    "deepspeed": "MiCS (zero_optimization.mics_shard_size, mics_hierarchical_params_gather) "
                 "was removed (DeepSpeedConfig refuses both keys, deepspeed/runtime/config.py "
                 "_REMOVED_ZERO_CONFIG_KEYS), and ZeRO++ hpZ (zero_hpz_partition_size) keeps a "
                 "second copy of the weights inside a node while gradients and optimizer stay "
                 "sharded over every replica",
}
"""Why a bundled target without a hybrid-sharding option has none (for the refusal)."""
