"""The DeepSpeed export target: a ds_config JSON plus a `deepspeed` launcher script, and
parsing them back."""

from __future__ import annotations

import json
import shlex
from dataclasses import replace
from pathlib import Path
from typing import Any

from hetpar import schedules
from hetpar.errors import ConfigError
from hetpar.export import checks
from hetpar.export.deepspeed_launch import (
    EXPERT_AXES,
    MODULE,
    expert_note,
    launcher,
    launcher_experts,
    launcher_pp,
    model_file,
    script_gap,
)
from hetpar.export.deepspeed_options import DEEPSPEED, SCHEDULES
from hetpar.export.nearest import common, expert_room, launch_shape
from hetpar.export.schema import OptionTable, argv_options
from hetpar.export.target import Export, Target, header, moe_losses, register
from hetpar.io import dump_toml, from_dict, parse_json, to_dict
from hetpar.specs.gpu import Precision
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import Plan


def nearest(plan: Plan, model: ModelSpec) -> tuple[Plan, list[str]]:
    """The nearest plan DeepSpeed (ZeRO, AutoTP, PipelineEngine) can run, and what was lost."""
    plan, lost = common(plan, model, carries=EXPERT_AXES, label="DeepSpeed")
    named = SCHEDULES.name_of(plan.schedule)
    if plan.pp > 1 and (not named or plan.vpp > 1):
        lost.append(
            f"schedule {plan.schedule!r} (vpp={plan.vpp}): DeepSpeed's PipelineEngine "
            f"runs 1F1B with one stage per rank -> {schedules.DEFAULT}, vpp=1"
        )
        plan = replace(plan, schedule=schedules.DEFAULT, vpp=1)
    if plan.cp > 1:
        plan, more = _fold_cp(plan)
        lost.append(more)
    if plan.degree("ep") > 1:  # after folding cp: DeepSpeed's expert groups split the dp world
        expert_room(plan, model, plan.dp, "DeepSpeed",
                    f"dp({plan.dp}) (deepspeed/utils/groups.py: expert groups divide the "
                    "data-parallel world)")
    if plan.sequence_parallel:
        lost.append("Megatron-style sequence parallelism is not in DeepSpeed AutoTP -> off")
        plan = replace(plan, sequence_parallel=False)
    if plan.pp > 1 and plan.zero >= 2:
        # PipelineEngine asserts ZeRO stage < 2 (deepspeed/runtime/pipe/engine.py)
        lost.append(f"ZeRO-{plan.zero} is incompatible with DeepSpeed pipeline parallelism -> 1")
        plan = replace(plan, zero=1)
    swaps: dict[str, Precision] = {"fp8": "bf16", "tf32": "fp32"}
    if plan.precision in swaps:
        lost.append(
            f"precision {plan.precision} has no ds_config section -> {swaps[plan.precision]}"
        )
        plan = replace(plan, precision=swaps[plan.precision])
    if plan.recompute == "selective":
        lost.append("selective recomputation is not a ds_config option -> full")
        plan = replace(plan, recompute="full")
    return plan, lost


def _fold_cp(plan: Plan) -> tuple[Plan, str]:
    """Context parallelism is not in DeepSpeed: turn the cp ranks into data-parallel ranks."""
    dp = plan.dp * plan.cp
    if plan.batch % (dp * plan.micro_batch) == 0:
        return replace(plan, dp=dp, cp=1), f"context parallelism cp={plan.cp} -> dp={dp}"
    return replace(plan, cp=1), f"context parallelism cp={plan.cp} -> dropped (fewer GPUs)"


def config(plan: Plan) -> dict[str, Any]:
    """The ds_config for a plan made expressible by ``nearest``."""
    cfg: dict[str, Any] = {
        "train_batch_size": plan.batch,
        "train_micro_batch_size_per_gpu": plan.micro_batch,
        "gradient_accumulation_steps": plan.batch // (plan.dp * plan.micro_batch),
        "zero_optimization": {"stage": plan.zero},
    }
    if plan.precision in ("bf16", "fp16"):
        cfg[plan.precision] = {"enabled": True}
    if plan.tp > 1:
        cfg["tensor_parallel"] = {"autotp_size": plan.tp}
    if plan.recompute == "full":
        cfg["activation_checkpointing"] = {
            "partition_activations": False,
            "contiguous_memory_optimization": False,
            "cpu_checkpointing": False,
        }
    if plan.name:  # the run name travels as the (disabled) TensorBoard job name
        cfg["tensorboard"] = {"enabled": False, "job_name": plan.name}
    return cfg


def flatten(cfg: dict[str, Any], prefix: str = "") -> dict[str, object]:
    """Dotted keys -> values, for the option-table check."""
    out: dict[str, object] = {}
    for k, v in cfg.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def parse(text: str, pp: int = 1) -> Plan:
    """The uniform hetpar plan a ds_config describes (dp from the batch arithmetic; ``pp``
    from the launcher's --pipeline-parallel-size, which the config does not hold)."""
    cfg = parse_json(text, "deepspeed")
    if not isinstance(cfg, dict):
        raise ConfigError("deepspeed: the config must be a JSON object")
    mbs = cfg.get("train_micro_batch_size_per_gpu", 1)
    gas, tbs = cfg.get("gradient_accumulation_steps", 1), cfg.get("train_batch_size")
    if not all(isinstance(v, int) and v > 0 for v in (mbs, gas, tbs)):
        raise ConfigError(
            "deepspeed: train_batch_size, train_micro_batch_size_per_gpu and "
            f"gradient_accumulation_steps must be positive integers, got "
            f"{tbs!r}, {mbs!r}, {gas!r}"
        )
    if tbs % (mbs * gas):
        raise ConfigError(
            f"deepspeed: train_batch_size {tbs} is not a multiple of "
            f"micro batch {mbs} x accumulation {gas}"
        )
    on = {k for k in ("bf16", "fp16") if cfg.get(k, {}).get("enabled") is True}
    data = {
        "name": cfg.get("tensorboard", {}).get("job_name", ""),
        "tp": cfg.get("tensor_parallel", {}).get("autotp_size", 1),
        "pp": cfg.get("pipeline", {}).get("stages", pp),  # older exports wrote it here
        "dp": tbs // (mbs * gas),
        "micro_batch": mbs,
        "global_batch": tbs,
        "zero": cfg.get("zero_optimization", {}).get("stage", 0),
        "precision": "bf16" if "bf16" in on else "fp16" if "fp16" in on else "fp32",
        "recompute": "full" if "activation_checkpointing" in cfg else "none",
    }
    return from_dict(Plan, data, "deepspeed config")


def write(plan: Plan, model: ModelSpec, *, table: OptionTable, per_node: int | None,
          config_name: str) -> Export:
    """``ds_config.json`` (or ``config_name``) and the launcher ``<stem>.sh`` beside it."""
    name = config_name or "ds_config.json"
    near, lost = nearest(plan, model)
    lost += moe_losses(model, "deepspeed")
    cfg = config(near)
    nodes, per = launch_shape(near.num_gpus(), per_node)
    argv = launcher(nodes, per, name, near, model)
    gap = script_gap(model, near.tp)
    head = header(table, plan, model, lost) + ([
        f"train.py: your training script (hetpar's {MODULE} cannot run this plan: {gap}); it "
        "must follow the contract in hetpar's docs/exports.md"
    ] if gap else [f"train.py: hetpar's {MODULE} (needs hetpar, DeepSpeed and torch where "
                   f"it runs) trains the model in {model_file(name)} on mock tokens"] + ([
        f"tp={near.tp} is hetpar's own Megatron-style tensor parallelism, not DeepSpeed "
        "AutoTP: the script reads tensor_parallel.autotp_size as its degree, shards its "
        "decoder and gives DeepSpeed the config without that key plus a model-parallel unit "
        "(with pp > 1 a PipelineModule topology with a model axis), so ZeRO and gradient "
        "averaging use the data-parallel group only"
    ] if near.tp > 1 else [])) + expert_note(near, model)
    script = "#!/bin/sh\n" + "".join(f"# {h}\n" for h in head)
    script += shlex.join(argv) + ' "$@"\n'
    options = flatten(cfg)
    options.update(argv_options([w for w in argv[1:] if w not in ("train.py", MODULE)], table))
    launch = name.rsplit(".", 1)[0] + ".sh"
    return Export(
        target="deepspeed",
        plan=near,
        warnings=tuple(lost),
        files=((name, json.dumps(cfg, indent=2) + "\n"), (launch, script))
        + (() if gap else ((model_file(name), dump_toml(to_dict(model))),)),
        options=options,
        version=table.version,
    )


def read(path: Path, text: str, model: ModelSpec) -> tuple[Plan, list[str]]:
    """The plan of a ds_config, with the pipeline depth from the launcher ``<stem>.sh`` beside
    it (pp = 1, noted, when there is none)."""
    launch = path.with_suffix(".sh")
    if not launch.is_file():
        return parse(text, 1), [f"no launcher {launch} beside the config: pp taken as 1"]
    script = launch.read_text(encoding="utf-8", errors="replace")
    return launcher_experts(parse(text, launcher_pp(script)), script), []


TARGET = register(Target(
    name="deepspeed", help="a ds_config JSON and its deepspeed launcher",
    tables=(DEEPSPEED,), schedules=SCHEDULES, write=write,
    parse=lambda text, model: parse(text), read=read, check=checks.deepspeed,
))
