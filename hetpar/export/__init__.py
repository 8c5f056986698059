"""Export hetpar plans to Megatron-LM, torchtitan and DeepSpeed, and read such exports back."""

from __future__ import annotations

import json
from dataclasses import dataclass

from hetpar.errors import ConfigError, Infeasible
from hetpar.export import deepspeed, megatron, megatron_model, torchtitan
from hetpar.export.nearest import launch_shape
from hetpar.export.options import DEEPSPEED, TABLES, argv_options, check
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
    """The framework options written, for validation against ``options.TABLES``."""

    def problems(self) -> list[str]:
        """Options that break the framework's documented option table (empty when valid)."""
        return check(TABLES[self.target], self.options)


def export(
    plan: Plan,
    model: ModelSpec,
    target: str,
    cluster: ClusterSpec | None = None,
    config_name: str = "",
) -> Export:
    """Export ``plan`` for ``model`` to ``target`` (one of TARGETS).

    ``cluster`` sets GPUs per node for the launch command (default 8); ``config_name`` is
    the file name the launch command refers to.
    """
    if target not in TARGETS:
        raise ConfigError(f"export: unknown target {target!r}; known: {', '.join(TARGETS)}")
    _check_layers(plan, model)
    per_node = None
    if cluster is not None:
        group = cluster.group(plan.group) if plan.group else cluster.node_groups[0]
        per_node = group.gpus_per_node
    if target == "megatron":
        return _megatron(plan, model, per_node)
    if target == "torchtitan":
        return _torchtitan(plan, model, per_node, config_name or "torchtitan.toml")
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


def _header(target: str, plan: Plan, model: ModelSpec, lost: list[str]) -> list[str]:
    head = [
        f"hetpar export of plan {plan.name or '(unnamed)'} for {model.name} -> {target}",
        "option names from: " + ", ".join(TABLES[target].sources),
    ]
    return head + [f"warning: {w}" for w in lost]


def _megatron(plan: Plan, model: ModelSpec, per_node: int | None) -> Export:
    near, lost = megatron.nearest(plan, model)
    lost += megatron_model.model_losses(model) + _moe_losses(model, "megatron")
    argv = megatron.arguments(near, model)
    nodes, per = launch_shape(near.num_gpus(), per_node)
    text = megatron.script(argv, nodes, per, _header("megatron", plan, model, lost))
    return Export(
        target="megatron",
        plan=near,
        warnings=tuple(lost),
        files=(("megatron_args.sh", text),),
        options=megatron.options_of(argv),
    )


def _torchtitan(plan: Plan, model: ModelSpec, per_node: int | None, name: str) -> Export:
    near, lost = torchtitan.nearest(plan, model)
    lost += torchtitan.model_losses(model) + _moe_losses(model, "torchtitan")
    cfg = torchtitan.config(near, model)
    nodes, per = launch_shape(near.num_gpus(), per_node)
    head = _header("torchtitan", plan, model, lost) + [
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
    )


def _deepspeed(plan: Plan, model: ModelSpec, per_node: int | None, name: str) -> Export:
    near, lost = deepspeed.nearest(plan, model)
    lost += _moe_losses(model, "deepspeed")
    cfg = deepspeed.config(near)
    nodes, per = launch_shape(near.num_gpus(), per_node)
    argv = deepspeed.launcher(nodes, per, name)
    script = "#!/bin/sh\n" + "".join(f"# {h}\n" for h in _header("deepspeed", plan, model, lost))
    script += " ".join(argv) + ' "$@"\n'
    options = deepspeed.flatten(cfg)
    options.update(argv_options(argv[1:5] + argv[6:], DEEPSPEED))  # launcher flags, not the script
    launch = name.rsplit(".", 1)[0] + ".sh"
    return Export(
        target="deepspeed",
        plan=near,
        warnings=tuple(lost),
        files=((name, json.dumps(cfg, indent=2) + "\n"), (launch, script)),
        options=options,
    )


def parse(target: str, text: str, model: ModelSpec) -> Plan:
    """Read an export back: Megatron launch script/args, torchtitan TOML or ds_config JSON."""
    if target == "megatron":
        return megatron.parse(text, model)
    if target == "torchtitan":
        return torchtitan.parse(text, model)
    if target == "deepspeed":
        return deepspeed.parse(text)
    raise ConfigError(f"import: unknown framework {target!r}; known: {', '.join(TARGETS)}")


__all__ = ["TARGETS", "Export", "export", "parse"]
