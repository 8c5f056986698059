"""torchtitan's TOML job configuration (2025-07 and 2025-10): the nearest plan torchtitan can
run, the configuration, and parsing it back."""

from __future__ import annotations

import tomllib
from dataclasses import replace
from typing import Any

from hetpar import schedules
from hetpar.errors import ConfigError
from hetpar.export.nearest import common
from hetpar.export.target import ModelRefused, expert_fields
from hetpar.export.torchtitan_options import SCHEDULES
from hetpar.io import from_dict
from hetpar.specs.gpu import Precision
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import Plan
from hetpar.specs.stage import split_layers

# torchtitan's llama3 flavors (torchtitan/models/llama3/__init__.py) for hetpar catalog models
FLAVORS = {
    "llama3-8b": "8B",
    "llama3.1-8b": "8B",
    "llama3-70b": "70B",
    "llama3.1-70b": "70B",
    "llama3.1-405b": "405B",
}


TOML_LABEL = ("torchtitan's TOML job configuration (2025-07, 2025-10; --framework-version "
              "2026-02 or 2026-08 writes --parallelism.expert_parallel_degree)")


def nearest(plan: Plan, model: ModelSpec, carries: tuple[str, ...] = (),
            label: str = TOML_LABEL) -> tuple[Plan, list[str]]:
    """The nearest plan torchtitan can run, and what was lost on the way (``carries``: the
    plan-scope axes the caller writes; the TOML form writes none)."""
    plan, lost = common(plan, model, carries=carries, label=label)
    plan, more = SCHEDULES.keep_or_default(plan)
    lost += more
    swaps: dict[str, Precision] = {"fp16": "bf16", "tf32": "fp32"}
    if plan.precision in swaps:
        lost.append(
            f"precision {plan.precision} is not a torchtitan mixed-precision option "
            f"-> {swaps[plan.precision]}"
        )
        plan = replace(plan, precision=swaps[plan.precision])
    if plan.dp == 1 and plan.zero:
        lost.append(f"zero={plan.zero} shards nothing with dp=1 -> 0")
        plan = replace(plan, zero=0)
    if plan.zero == 1:
        lost.append(
            "ZeRO-1 (optimizer-only sharding) is not in torchtitan -> FSDP without "
            "resharding after forward (ZeRO-2)"
        )
        plan = replace(plan, zero=2)
    if plan.zero == 0 and plan.dp > 1 and plan.tp * plan.pp * plan.cp > 1:
        # torchtitan/models/llama3/infra/parallelize.py: "DDP has not supported > 1D parallelism"
        lost.append(
            "torchtitan's DDP (zero=0) cannot be combined with tp/pp/cp -> FSDP without "
            "resharding after forward (ZeRO-2)"
        )
        plan = replace(plan, zero=2)
    if plan.tp > 1 and not plan.sequence_parallel:
        lost.append(
            "torchtitan's tensor parallelism always shards norms/dropout along the "
            "sequence -> sequence_parallel on"
        )
        plan = replace(plan, sequence_parallel=True)
    return plan, lost


def model_parts(stages: list[tuple[int, int]]) -> list[list[str]]:
    """llama3 module FQNs per model part: embeddings first, norm and output last."""
    parts = [[f"layers.{i}" for i in range(a, b)] for a, b in stages]
    parts[0].insert(0, "tok_embeddings")
    parts[-1] += ["norm", "output"]
    return parts


def config(plan: Plan, model: ModelSpec, version: str = "2025-10",
           replicate: int = 1) -> dict[str, Any]:
    """The TOML job configuration (nested tables) of a TOML ``version`` for a plan made
    expressible by ``nearest``; ``replicate`` > 1: HSDP, that many copies of the FSDP group
    (``export/hybrid.py``: the plan's hierarchical sync over node groups)."""
    par: dict[str, Any] = {
        "data_parallel_replicate_degree": plan.dp if plan.zero == 0 else replicate,
        "data_parallel_shard_degree": 1 if plan.zero == 0 else plan.dp // replicate,
        "tensor_parallel_degree": plan.tp,
        "context_parallel_degree": plan.cp,
        "pipeline_parallel_degree": plan.pp,
    }
    if plan.zero == 2:  # FSDP keeping parameters gathered until backward = ZeRO-2
        par["fsdp_reshard_after_forward"] = "never"
    training: dict[str, Any] = {
        "global_batch_size": plan.batch,
        "seq_len": model.seq_len,
        "mixed_precision_param": "float32" if plan.precision == "fp32" else "bfloat16",
    }
    if plan.pp > 1:
        # each DP rank's batch is split into pipeline microbatches; stage boundaries are the
        # first layer of every later stage (JobConfig.pipeline_parallel_split_points)
        training["local_batch_size"] = plan.batch // plan.dp
        par["pipeline_parallel_microbatch_size"] = plan.micro_batch
        par["pipeline_parallel_schedule"] = SCHEDULES.require(plan.schedule)
        stages = split_layers(model.n_layers, plan.pp * plan.vpp)
        if version == "2025-07":
            par["pipeline_parallel_split_points"] = [f"layers.{a}" for a, _ in stages[1:]]
        else:  # 2025-10: the modules of each model part (ModelArgs FQNs of llama3)
            par["module_fqns_per_model_part"] = model_parts(stages)
    else:
        training["local_batch_size"] = plan.micro_batch  # the rest is gradient accumulation
    out: dict[str, Any] = {"job": {"description": plan.name}} if plan.name else {}
    out["model"] = {"name": "llama3", "flavor": FLAVORS.get(model.name, model.name)}
    if plan.precision == "fp8":
        out["model"]["converters"] = ["float8"]
    out["training"] = training
    out["parallelism"] = par
    out["activation_checkpoint"] = {"mode": plan.recompute}
    return out


def model_losses(model: ModelSpec) -> list[str]:
    """What the export cannot say about the model itself (an MoE model cannot be a llama3
    flavor at all: ModelRefused, which ``export`` completes with the targets that accept the
    plan)."""
    if model.n_experts > 1:
        raise ModelRefused(
            f"export: model {model.name!r} is a mixture of experts (n_experts={model.n_experts}, "
            f"experts_per_token={model.experts_per_token}{expert_fields(model)}); hetpar "
            "exports torchtitan's dense llama3 model only (its MoE models have their own "
            "modules)"
        )
    if model.name in FLAVORS:
        return []
    return [
        f"torchtitan has no flavor for model {model.name!r}: register a llama3 flavor with "
        f"n_layers={model.n_layers}, dim={model.hidden}, n_heads={model.n_heads}, "
        f"n_kv_heads={model.n_kv_heads}, vocab_size={model.vocab}"
    ]


def flatten(cfg: dict[str, Any]) -> dict[str, object]:
    """``section.key -> value`` for the option-table check."""
    return {f"{sec}.{k}": v for sec, table in cfg.items() for k, v in table.items()}


def parse(text: str, model: ModelSpec) -> Plan:
    """The uniform hetpar plan a torchtitan TOML job configuration describes."""
    try:
        cfg = tomllib.loads(text)
    except (ValueError, RecursionError) as e:  # TOMLDecodeError, a 5000-digit int, nesting
        raise ConfigError(f"torchtitan: cannot parse TOML: {e}") from None
    return parse_config(cfg, model)


def _parts_of(par: dict[str, Any], n_layers: int) -> tuple[int, list[str]]:
    """(model parts, split points as 'layers.i') from either TOML pipeline form."""
    if "module_fqns_per_model_part" in par:
        parts = par["module_fqns_per_model_part"]
        firsts = [next((m for m in p if m.startswith("layers.")), "") for p in parts[1:]]
        return len(parts), firsts
    points = par.get("pipeline_parallel_split_points", [])
    if "pipeline_parallel_layers_per_stage" in par:  # registry form: even parts
        per = par["pipeline_parallel_layers_per_stage"]
        if n_layers % per:
            raise ConfigError(f"torchtitan: {n_layers} layers not divisible by {per} per stage")
        return n_layers // per, [f"layers.{i}" for i in range(per, n_layers, per)]
    return len(points) + 1, points


def parse_config(cfg: dict[str, Any], model: ModelSpec) -> Plan:
    """The uniform hetpar plan a torchtitan job configuration (nested tables) describes."""
    par, tr = cfg.get("parallelism", {}), cfg.get("training", {})
    shard, rep = (
        par.get("data_parallel_shard_degree", 1),
        par.get("data_parallel_replicate_degree", 1),
    )
    if shard < 1:
        raise ConfigError(
            "torchtitan: data_parallel_shard_degree -1 (auto) needs the world size; "
            "give it explicitly"
        )
    pp, dp = par.get("pipeline_parallel_degree", 1), shard * rep
    vpp, schedule = 1, schedules.DEFAULT
    if pp > 1:
        n_parts, points = _parts_of(par, model.n_layers)
        vpp = n_parts // pp
        want = [f"layers.{a}" for a, _ in split_layers(model.n_layers, pp * vpp)[1:]]
        if points != want:
            raise ConfigError(
                f"torchtitan: split points {points} are not hetpar's even split "
                f"{want}; import supports that split only"
            )
        known = SCHEDULES.known()
        schedule = SCHEDULES.schedule_of(par.get("pipeline_parallel_schedule", "1F1B")) or ""
        if not schedule:
            raise ConfigError(
                f"torchtitan: schedule {par.get('pipeline_parallel_schedule')!r} "
                f"has no hetpar counterpart; known: {', '.join(known)}"
            )
    zero = 0 if shard == 1 else 2 if par.get("fsdp_reshard_after_forward") == "never" else 3
    fp8 = "float8" in cfg.get("model", {}).get("converters", [])
    precision = "fp8" if fp8 else "fp32" if tr.get("mixed_precision_param") == "float32" else "bf16"
    tp = par.get("tensor_parallel_degree", 1)
    data = {
        "name": cfg.get("job", {}).get("description", ""),
        "tp": tp,
        "pp": pp,
        "dp": dp,
        "cp": par.get("context_parallel_degree", 1),
        "vpp": vpp,
        "schedule": schedule,
        "micro_batch": par.get("pipeline_parallel_microbatch_size", 1)
        if pp > 1
        else tr.get("local_batch_size", 1),
        "global_batch": tr.get("global_batch_size"),
        "sequence_parallel": tp > 1,
        "recompute": cfg.get("activation_checkpoint", {}).get("mode", "selective"),
        "zero": zero,
        "precision": precision,
    }
    if rep > 1 and shard > 1:  # HSDP: sharded inside each replica group, all-reduced across
        data |= {"zero_scope": "group", "collectives": {"dp_sync": "hierarchical"}}
    return from_dict(Plan, data, "torchtitan config")
