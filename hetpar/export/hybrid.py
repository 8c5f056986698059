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

import re
from dataclasses import replace

from hetpar.errors import ConfigError
from hetpar.placement import place
from hetpar.specs.cluster import ClusterSpec
from hetpar.specs.collectives import Collectives
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import Plan

FIELD = "plan.collectives.dp_sync = 'hierarchical'"


def hierarchical(plan: Plan) -> bool:
    """True when the plan forces the hierarchical DP sync."""
    return plan.collectives is not None and plan.collectives.dp_sync == "hierarchical"


def replicas(plan: Plan, model: ModelSpec, cluster: ClusterSpec | None, target: str,
             option: str) -> int:
    """How many copies of the ZeRO group the export writes (``option`` carries it, empty: the
    target has none): 1 unless the plan shards ZeRO per node group (``zero_scope = 'group'``)
    or forces the hierarchical sync, else the node groups' count, or ConfigError naming why
    the target cannot run it and the nearest plan."""
    if not hierarchical(plan):
        return _flat(plan, model, cluster, target, option) if plan.zero_scope == "group" else 1
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


def _flat(plan: Plan, model: ModelSpec, cluster: ClusterSpec | None, target: str,
          option: str) -> int:
    """zero_scope = 'group' without the forced hierarchical sync: the simulator reduce-scatters
    over each node group's replicas (a shard group may span nodes, one call as the
    frameworks' hybrid sharding runs it) and all-reduces the shards across the groups
    (``sim/structure._cross_sync``): hybrid sharding with one shard group per node group."""
    field = "plan.zero_scope = 'group'"
    if not option:
        raise ConfigError(f"export: {field} (ZeRO per node group, hybrid sharding) has no "
                          f"option in {target}: {NO_OPTION.get(target, 'none is known')}; "
                          "nearest plan: zero_scope = 'all'")
    if cluster is None:
        raise ConfigError(f"export: {field} needs --cluster: the shard groups are the "
                          "replicas on each node group; nearest plan without it: "
                          "zero_scope = 'all'")
    # dp_sync "auto" on a cluster whose collectives are "hierarchical" or "best" may price a
    # shard group over several nodes in two levels (sim/network.py: the cluster's policy)
    auto = plan.collectives is None or plan.collectives.dp_sync == "auto"
    return _groups(plan, model, cluster, one_node=auto and cluster.collectives != "nccl")


def _groups(plan: Plan, model: ModelSpec, cluster: ClusterSpec, one_node: bool = True) -> int:
    """The number of node groups holding replicas, each with as many, each in one node
    (``one_node``: the hierarchical sync's condition)."""
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
                          f"got {sizes}; nearest plan: zero_scope = 'all'")
    wide = {g: len(n) for g, n in nodes.items() if len(n) > 1}
    if wide and one_node:
        why = FIELD if hierarchical(plan) else \
            f"dp_sync 'auto' on a cluster whose collectives = {cluster.collectives!r}"
        raise ConfigError(f"export: {why} with zero_scope = 'group': the shard groups span "
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


MARK = "# hybrid sharding: zero_scope = 'group'"
"""The header line of a hybrid-sharding export; it names the plan's ``dp_sync``, which no
framework option carries (both read back HSDP / distributed-optimizer instances as it)."""


def note(files: tuple[tuple[str, str], ...], plan: Plan,
         replicate: int) -> tuple[tuple[str, str], ...]:
    """``files`` with a line after the main file's first (shebang or comment) naming the shard
    groups and the plan's dp_sync."""
    dp_sync = plan.collectives.dp_sync if plan.collectives else "auto"
    line = f"{MARK}, {replicate} shard groups (one per node group), dp_sync = '{dp_sync}'"
    (name, text), rest = files[0], files[1:]
    if not text.startswith("#"):  # a JSON main file has no comments
        return files
    first, _, tail = text.partition("\n")
    return ((name, f"{first}\n{line}\n{tail}"), *rest)


def read_back(plan: Plan, text: str) -> Plan:
    """``plan`` read from an export, with the dp_sync its hybrid-sharding header names (the
    frameworks' options say only that the ZeRO groups are per node group)."""
    m = re.search(re.escape(MARK) + r".*dp_sync = '(\w+)'", text)
    if m is None or plan.zero_scope != "group":
        return plan
    c = replace(plan.collectives or Collectives(), dp_sync=m.group(1))  # type: ignore[arg-type]
    return replace(plan, collectives=None if c.is_auto else c)
