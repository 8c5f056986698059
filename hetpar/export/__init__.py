"""Export hetpar plans to Megatron-LM, torchtitan and DeepSpeed, and read such exports back."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from hetpar.errors import ConfigError, Infeasible
from hetpar.export import deepspeed, megatron, megatron_model, torchtitan, torchtitan_registry
from hetpar.export.nearest import launch_shape
from hetpar.export.options import DEEPSPEED, argv_options, check, table
from hetpar.io import dump_toml
from hetpar.specs.cluster import ClusterSpec
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import Plan

TARGETS = ("megatron", "torchtitan", "deepspeed")


@dataclass(frozen=True, kw_only=True)
class Export:
    """An exported plan: the files to write, what was lost, and the plan actually exported."""

    target: str
    plan: Plan
    """The nearest plan the framework can express (equal to the input when nothing is lost)."""
    warnings: tuple[str, ...]
    files: tuple[tuple[str, str], ...]
    """(file name, content) pairs; the first is the main one."""
    options: dict[str, object]
    """The framework options written, for validation against ``options.VERSIONS``."""
    version: str = ""
    """The framework version whose option table and rules the export follows."""
    env: dict[str, str | None] = field(default_factory=dict)
    """Environment variables the launch script sets (None: unsets)."""

    def problems(self) -> list[str]:
        """Options or environment that break the version's option table and validator rules
        (empty when the framework accepts the export as launched)."""
        return check(table(self.target, self.version or None), self.options, self.env)


def export(
    plan: Plan,
    model: ModelSpec,
    target: str,
    cluster: ClusterSpec | None = None,
    config_name: str = "",
    version: str | None = None,
) -> Export:
    """Export ``plan`` for ``model`` to ``target`` (one of TARGETS) at framework ``version``
    (one of ``options.VERSIONS[target]``; default the newest).

    ``cluster`` sets GPUs per node for the launch command (default 8); ``config_name`` is
    the file name the launch command refers to. A plan the version cannot run even in its
    nearest form raises ConfigError naming the nearest plan it can.
    """
    if target not in TARGETS:
        raise ConfigError(f"export: unknown target {target!r}; known: {', '.join(TARGETS)}")
    _check_layers(plan, model)
    tab = table(target, version)
    per_node = None
    if cluster is not None:
        group = cluster.group(plan.group) if plan.group else cluster.node_groups[0]
        per_node = group.gpus_per_node
    if target == "megatron":
        return _megatron(plan, model, per_node)
    if target == "torchtitan" and tab.version == "2026-02":
        return _torchtitan_registry(plan, model, per_node, config_name or "torchtitan_train.sh")
    if target == "torchtitan":
        return _torchtitan(plan, model, per_node, config_name or "torchtitan.toml", tab.version)
    return _deepspeed(plan, model, per_node, config_name or "ds_config.json")


def _check_layers(plan: Plan, model: ModelSpec) -> None:
    """Every pipeline chunk needs a layer: pp=64 of a 32-layer model is not a plan to export."""
    chunks = plan.pp * plan.vpp if plan.uniform else max(len(r.stages) for r in plan.replicas)
    if chunks > model.n_layers:
        raise Infeasible("divisibility", f"pp*vpp = {chunks} pipeline chunks > "
                         f"{model.n_layers} layers of {model.name}: a stage would have no layers")
    for r in plan.replicas:
        if any(s.n_layers == 0 for s in r.stages):
            raise Infeasible("divisibility", "a pipeline stage has no layers")


def _moe_losses(model: ModelSpec, target: str) -> list[str]:
    """torchtitan's job file and DeepSpeed's config carry no mixture-of-experts options."""
    if model.n_experts <= 1 or target == "megatron":
        return []
    return [f"{model.name} is a mixture of experts ({model.n_experts} experts, top-"
            f"{model.experts_per_token}): the {target} files carry no expert options, so the "
            "experts must come from the model code, else they are dropped"]


def _header(target: str, plan: Plan, model: ModelSpec, lost: list[str], version: str) -> list[str]:
    tab = table(target, version)
    head = [
        f"hetpar export of plan {plan.name or '(unnamed)'} for {model.name} -> {target}",
        f"framework version {tab.version} (commit {tab.commit}); options and rules from: "
        + ", ".join(tab.sources),
        f"model: {model.source}" if model.source else f"model: {model.name}",
    ]
    return head + [f"warning: {w}" for w in lost]


def _megatron(plan: Plan, model: ModelSpec, per_node: int | None) -> Export:
    near, lost = megatron.nearest(plan, model)
    lost += megatron_model.model_losses(model) + _moe_losses(model, "megatron")
    argv = megatron.arguments(near, model)
    env = megatron.launch_env(near)
    nodes, per = launch_shape(near.num_gpus(), per_node)
    version = table("megatron").version
    head = _header("megatron", plan, model, lost, version)
    text = megatron.script(argv, nodes, per, head, env)
    return Export(
        target="megatron",
        plan=near,
        warnings=tuple(lost),
        files=(("megatron_args.sh", text),),
        options=megatron.options_of(argv),
        version=version,
        env=env,
    )


def _torchtitan(
    plan: Plan, model: ModelSpec, per_node: int | None, name: str, version: str
) -> Export:
    near, lost = torchtitan.nearest(plan, model)
    lost += torchtitan.model_losses(model) + _moe_losses(model, "torchtitan")
    cfg = torchtitan.config(near, model, version)
    nodes, per = launch_shape(near.num_gpus(), per_node)
    head = _header("torchtitan", plan, model, lost, version) + [
        f"launch: torchrun --nnodes {nodes} --nproc-per-node {per} -m torchtitan.train "
        f"--job.config_file {name}"
    ]
    text = "".join(f"# {h}\n" for h in head) + dump_toml(cfg)
    return Export(
        target="torchtitan",
        plan=near,
        warnings=tuple(lost),
        files=((name, text),),
        options=torchtitan.flatten(cfg),
        version=version,
    )


def _torchtitan_registry(plan: Plan, model: ModelSpec, per_node: int | None, name: str) -> Export:
    if name.endswith(".toml"):
        raise ConfigError(
            f"export: torchtitan 2026-02 is launched by a script, not a TOML: give --out "
            f"{name[:-5]}.sh (or --framework-version 2025-10 for a TOML job config)"
        )
    near, lost = torchtitan_registry.nearest(plan, model)
    argv = torchtitan_registry.arguments(near, model)
    nodes, per = launch_shape(near.num_gpus(), per_node)
    head = _header("torchtitan", plan, model, lost, "2026-02")
    return Export(
        target="torchtitan",
        plan=near,
        warnings=tuple(lost),
        files=((name, torchtitan_registry.script(argv, nodes, per, head)),),
        options=torchtitan_registry.options_of(argv),
        version="2026-02",
    )


def _deepspeed(plan: Plan, model: ModelSpec, per_node: int | None, name: str) -> Export:
    near, lost = deepspeed.nearest(plan, model)
    lost += _moe_losses(model, "deepspeed")
    cfg = deepspeed.config(near)
    nodes, per = launch_shape(near.num_gpus(), per_node)
    argv = deepspeed.launcher(nodes, per, name, near)
    version = table("deepspeed").version
    head = _header("deepspeed", plan, model, lost, version) + [
        "train.py: your training script; it must follow the contract in hetpar's "
        "docs/exports.md (PipelineModule arguments below when pp > 1)"
    ]
    script = "#!/bin/sh\n" + "".join(f"# {h}\n" for h in head)
    script += " ".join(argv) + ' "$@"\n'
    options = deepspeed.flatten(cfg)
    options.update(argv_options(argv[1:5] + argv[6:], DEEPSPEED))  # flags, not the script
    launch = name.rsplit(".", 1)[0] + ".sh"
    return Export(
        target="deepspeed",
        plan=near,
        warnings=tuple(lost),
        files=((name, json.dumps(cfg, indent=2) + "\n"), (launch, script)),
        options=options,
        version=version,
    )


def parse(target: str, text: str, model: ModelSpec) -> Plan:
    """Read an export back: Megatron launch script/args, torchtitan TOML or launch script
    (registry form), or ds_config JSON."""
    if target == "megatron":
        return megatron.parse(text, model)
    if target == "torchtitan":
        if "torchtitan.train" in text and "--module" in text:  # the 2026-02 launch script
            return torchtitan_registry.parse(text, model)
        return torchtitan.parse(text, model)
    if target == "deepspeed":
        return deepspeed.parse(text)
    raise ConfigError(f"import: unknown framework {target!r}; known: {', '.join(TARGETS)}")


__all__ = ["TARGETS", "Export", "export", "parse"]
