"""torchtitan's mixture-of-experts models and expert parallelism (the config registry, 2026-02
on): the registry config of a catalog MoE model, the nearest plan torchtitan's expert mesh
takes, the overrides that say it, and reading them back."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from hetpar.export.nearest import expert_room, with_degree
from hetpar.export.schema import OptionTable
from hetpar.export.target import ModelRefused, expert_fields
from hetpar.export.torchtitan_options import MOE_CONFIGS_2026_02, MOE_CONFIGS_2026_08
from hetpar.export.torchtitan_release import EP_ONLY
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import Plan

EXPERT_AXES = ("ep", "etp")
"""The plan-scope axes the registry form writes for a mixture-of-experts model."""

# 00d1c0e4's deepseek_v3_671b sets model_converters Float8LinearConverter and
# Float8GroupedMMConverter itself (torchtitan_options.py cites the file)
NATIVE_FP8 = {("2026-02", "deepseek_v3_671b")}


def _configs(table: OptionTable) -> dict[str, tuple[str, str]]:
    return MOE_CONFIGS_2026_08 if table.version in EP_ONLY else MOE_CONFIGS_2026_02


def entry(model: ModelSpec, table: OptionTable) -> tuple[str, str]:
    """(--module, --config) of a catalog MoE model, or ModelRefused naming the ones it has."""
    configs = _configs(table)
    if model.name not in configs:
        raise ModelRefused(
            f"export: model {model.name!r} is a mixture of experts (n_experts={model.n_experts}, "
            f"experts_per_token={model.experts_per_token}{expert_fields(model)}); torchtitan "
            f"{table.version}'s config registry has MoE configs for "
            f"{', '.join(configs)} only"
        )
    return configs[model.name]


def nearest(plan: Plan, model: ModelSpec, table: OptionTable) -> tuple[Plan, list[str]]:
    """The expert degrees torchtitan's mesh can take (after the dense rules), and what changed;
    ConfigError naming ep and the nearest plan when ep does not fit the ranks it borrows."""
    lost: list[str] = []
    ep, etp, tp = plan.degree("ep"), plan.degree("etp"), plan.tp
    if ep == 1 and tp > 1 and etp != tp:  # EP off, TP on: experts sharded as the dense MLP
        lost.append(f"with expert_parallel_degree 1 torchtitan shards the experts over "
                    f"tensor parallelism -> etp={tp}")
        plan = with_degree(plan, "etp", tp)
    if ep > 1 and etp > 1 and table.version in EP_ONLY:
        lost.append(f"etp={etp}: torchtitan {table.version} has no expert tensor parallelism "
                    "(EP borrows the FSDP and TP ranks, each expert whole on its rank) -> etp=1")
        plan, etp = with_degree(plan, "etp", 1), 1
    if ep > 1 and plan.zero == 0 and plan.dp > 1:
        lost.append("torchtitan carves EP from the FSDP ranks (data_parallel_shard_degree); "
                    "DDP (zero=0) has none -> FSDP without resharding after forward (ZeRO-2)")
        plan = replace(plan, zero=2)
    if ep > 1:
        shard = plan.dp if plan.zero else 1
        why = f"dp_shard({shard}) x cp({plan.cp})" + (f" x tp({tp})" if etp == 1 else "")
        room = shard * plan.cp * (tp if etp == 1 else 1)
        expert_room(plan, model, room, f"torchtitan {table.version}", why)
    return plan, lost


def arguments(plan: Plan, table: OptionTable) -> list[str]:
    """The expert overrides, always written for an MoE model: the registry configs set their
    own degree (2026-08's deepseek_v3_671b: expert_parallel_degree=2)."""
    argv = ["--parallelism.expert_parallel_degree", str(plan.degree("ep"))]
    if plan.degree("ep") > 1 and table.version not in EP_ONLY:
        argv += ["--parallelism.expert_tensor_parallel_degree", str(plan.degree("etp"))]
    return argv


def read_axes(plan: Plan, par: Mapping[str, object], tokens: bool) -> Plan:
    """``plan`` with the expert degrees a registry launch describes (``tokens``: a version
    without expert tensor parallelism, 2026-08 or 0.3.0)."""
    ep = int(str(par.get("expert_parallel_degree", 1)))
    etp = (plan.tp if ep == 1 else 1 if tokens
           else int(str(par.get("expert_tensor_parallel_degree", 1))))
    return replace(plan, axes=(("ep", ep), ("etp", etp)))
