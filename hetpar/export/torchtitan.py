"""The torchtitan export target: a launch script of the config registry (2026-02 on) or a TOML
job configuration (2025-07, 2025-10), and parsing either back."""

from __future__ import annotations

from hetpar.errors import ConfigError
from hetpar.export import checks, torchtitan_registry, torchtitan_toml
from hetpar.export.nearest import even_tp, launch_shape
from hetpar.export.schema import OptionTable
from hetpar.export.target import Export, Target, header, moe_losses, register
from hetpar.export.torchtitan_options import (
    SCHEDULES,
    TORCHTITAN_2025_07,
    TORCHTITAN_2025_10,
    TORCHTITAN_2026_02,
    TORCHTITAN_2026_08,
)
from hetpar.export.torchtitan_release import TORCHTITAN_0_3_0
from hetpar.io import dump_toml
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import Plan


def write(plan: Plan, model: ModelSpec, *, table: OptionTable, per_node: int | None,
          config_name: str, replicate: int = 1) -> Export:
    """The registry form's launch script (2026-02) or a TOML job configuration;
    ``replicate`` > 1: HSDP (``export/hybrid.py``)."""
    even_tp(plan, model)
    if table.version in (TORCHTITAN_2026_02.version, TORCHTITAN_0_3_0.version,
                         TORCHTITAN_2026_08.version):
        return _registry(plan, model, per_node, config_name or "torchtitan_train.sh", table,
                         replicate)
    return _toml(plan, model, per_node, config_name or "torchtitan.toml", table, replicate)


def _toml(plan: Plan, model: ModelSpec, per_node: int | None, name: str,
          table: OptionTable, replicate: int = 1) -> Export:
    model_lost = torchtitan_toml.model_losses(model)  # an MoE model first: ModelRefused
    near, lost = torchtitan_toml.nearest(plan, model)
    lost += model_lost + moe_losses(model, "torchtitan")
    cfg = torchtitan_toml.config(near, model, table.version, replicate)
    nodes, per = launch_shape(near.num_gpus(), per_node)
    head = header(table, plan, model, lost) + [
        f"launch: torchrun --nnodes {nodes} --nproc-per-node {per} -m torchtitan.train "
        f"--job.config_file {name}"
    ]
    text = "".join(f"# {h}\n" for h in head) + dump_toml(cfg)
    return Export(
        target="torchtitan",
        plan=near,
        warnings=tuple(lost),
        files=((name, text),),
        options=torchtitan_toml.flatten(cfg),
        version=table.version,
    )


def _registry(plan: Plan, model: ModelSpec, per_node: int | None, name: str,
              table: OptionTable, replicate: int = 1) -> Export:
    if name.endswith(".toml"):
        raise ConfigError(
            f"export: torchtitan {table.version} is launched by a script, not a TOML: give "
            f"--out {name[:-5]}.sh (or --framework-version 2025-10 for a TOML job config)"
        )
    near, lost = torchtitan_registry.nearest(plan, model, table)
    argv = torchtitan_registry.arguments(near, model, table, replicate)
    nodes, per = launch_shape(near.num_gpus(), per_node)
    head = header(table, plan, model, lost)
    notes = (torchtitan_registry.REAL_DATA_2026_08 if table is TORCHTITAN_2026_08
             else torchtitan_registry.REAL_DATA)
    return Export(
        target="torchtitan",
        plan=near,
        warnings=tuple(lost),
        files=((name, torchtitan_registry.script(argv, nodes, per, head, notes)),),
        options=torchtitan_registry.options_of(argv, table),
        version=table.version,
    )


def parse(text: str, model: ModelSpec) -> Plan:
    """The plan a registry-form launch script or a TOML job configuration describes."""
    if "torchtitan.train" in text and "--module" in text:  # a 2026-02/2026-08 launch script
        return torchtitan_registry.parse(text, model)
    return torchtitan_toml.parse(text, model)


TARGET = register(Target(
    name="torchtitan",
    hybrid="parallelism.data_parallel_replicate_degree x data_parallel_shard_degree (HSDP)",
    help="a config-registry launch script (2026-08: token-count batches; 0.3.0, the PyPI "
         "release; 2026-02) or a TOML job config (2025-07, 2025-10)",
    tables=(TORCHTITAN_2025_07, TORCHTITAN_2025_10, TORCHTITAN_2026_02, TORCHTITAN_0_3_0,
            TORCHTITAN_2026_08),
    schedules=SCHEDULES, write=write, parse=parse, check=checks.torchtitan,
))
