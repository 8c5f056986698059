"""torchtitan's Python config registry form (2026-02 on): a torchrun launch script running
``-m torchtitan.train --module llama3 --config NAME`` with command-line overrides."""

from __future__ import annotations

import re
import shlex
from dataclasses import replace

from hetpar.errors import ConfigError
from hetpar.export import torchtitan_toml
from hetpar.export.nearest import divisible_plan
from hetpar.export.schema import argv_options
from hetpar.export.torchtitan_options import (
    BENCHMARK_ASSETS,
    BENCHMARK_DATASET,
    TORCHTITAN_2026_02,
)
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import Plan

# torchtitan/models/llama3/config_registry.py: one function per model size
CONFIGS = {"8B": "llama3_8b", "70B": "llama3_70b", "405B": "llama3_405b"}
NATIVE_FP8 = {"llama3_405b"}  # configs whose model_converters already apply float8


def config_name(model: ModelSpec) -> str:
    """The registry config of a catalog model, or ConfigError naming what is missing."""
    torchtitan_toml.model_losses(model)  # refuses MoE models
    flavor = torchtitan_toml.FLAVORS.get(model.name)
    if flavor is None:
        raise ConfigError(
            f"export: torchtitan 2026-02 has registry configs for {', '.join(CONFIGS.values())} "
            f"only; model {model.name!r} needs its own config_registry entry (or "
            "--framework-version 2025-10 with a registered flavor)"
        )
    return CONFIGS[flavor]


def nearest(plan: Plan, model: ModelSpec) -> tuple[Plan, list[str]]:
    """torchtitan's nearest plan, then what the registry form cannot say."""
    plan, lost = torchtitan_toml.nearest(plan, model)
    name = config_name(model)
    if plan.precision == "fp8" and name not in NATIVE_FP8:
        lost.append(f"float8 converters are not a command-line override of {name} -> bf16")
        plan = replace(plan, precision="bf16")
    elif plan.precision != "fp8" and name in NATIVE_FP8:
        lost.append(f"{name} applies float8 converters itself -> precision fp8")
        plan = replace(plan, precision="fp8")
    parts = plan.pp * plan.vpp
    if plan.pp > 1 and model.n_layers % parts:
        near = divisible_plan(plan, model.n_layers, vpp=True)
        raise ConfigError(
            f"export: torchtitan 2026-02 splits {model.n_layers} layers by "
            f"pipeline_parallel_layers_per_stage, which needs them divisible by pp*vpp={parts}; "
            f"nearest plan: {near} (or --framework-version 2025-10, "
            "which takes any split)"
        )
    return plan, lost


def arguments(plan: Plan, model: ModelSpec) -> list[str]:
    """``--module``/``--config`` and the overrides for a plan made expressible by ``nearest``."""
    cfg = torchtitan_toml.config(plan, model, version="2025-10")
    argv = ["--module", "llama3", "--config", config_name(model)]
    for section in ("training", "parallelism", "activation_checkpoint"):
        for key, value in cfg.get(section, {}).items():
            if key != "module_fqns_per_model_part":
                argv += [f"--{section}.{key}", str(value)]
    if plan.pp > 1:  # even parts; the embedding and output are not counted as layers
        argv += [
            "--parallelism.pipeline_parallel_layers_per_stage",
            str(model.n_layers // (plan.pp * plan.vpp)),
            "--parallelism.pipeline_parallel_first_stage_less_layers", "0",
            "--parallelism.pipeline_parallel_last_stage_less_layers", "0",
        ]
    # a benchmark launch with nothing to download (like Megatron's --mock-data), from the
    # torchtitan checkout: llama3_debugmodel's tokenizer and data (torchtitan_options.py)
    return argv + ["--hf_assets_path", BENCHMARK_ASSETS, "--dataloader.dataset", BENCHMARK_DATASET]


REAL_DATA = [
    f"a benchmark: run from the root of a torchtitan checkout; --hf_assets_path "
    f"{BENCHMARK_ASSETS} (its test tokenizer) and --dataloader.dataset {BENCHMARK_DATASET} "
    "(tests/assets/c4_test) need no download",
    "for real data and tokenizer replace those two lines, e.g. --hf_assets_path "
    "./assets/hf/Llama-3.1-8B (python scripts/download_hf_assets.py --repo_id "
    "meta-llama/Llama-3.1-8B --assets tokenizer) and --dataloader.dataset c4 (allenai/c4 "
    "from the Hugging Face Hub)",
]


def script(argv: list[str], nodes: int, per_node: int, header: list[str]) -> str:
    """The launch script: torchrun with one override per line."""
    lines = ["#!/bin/sh"] + [f"# {h}" for h in header + REAL_DATA]
    lines.append(f"torchrun --nnodes {nodes} --nproc-per-node {per_node} -m torchtitan.train \\")
    for i in range(0, len(argv), 2):
        lines.append("    " + " ".join(shlex.quote(w) for w in argv[i : i + 2]) + " \\")
    lines.append('    "$@"')
    return "\n".join(lines) + "\n"


def options_of(argv: list[str]) -> dict[str, object]:
    """The overrides as option -> value, typed per the 2026-02 table."""
    return argv_options(argv, TORCHTITAN_2026_02)


def parse(text: str, model: ModelSpec) -> Plan:
    """The uniform hetpar plan a registry-form launch script describes."""
    body = " ".join(ln.rstrip("\\") for ln in text.splitlines() if not ln.lstrip().startswith("#"))
    words = shlex.split(body)
    if "torchtitan.train" not in words:
        raise ConfigError("torchtitan: no '-m torchtitan.train' line in the launch script")
    argv = [w for w in words[words.index("torchtitan.train") + 1 :] if w != "$@"]
    cfg: dict[str, dict[str, object]] = {}
    for name, value in options_of(argv).items():
        if "." in name:
            section, key = name[2:].split(".", 1)
            cfg.setdefault(section, {})[key] = value
    plan = torchtitan_toml.parse_config(cfg, model)
    m = re.search(r"^# hetpar export of plan (.+) for \S+ -> ", text, re.MULTILINE)
    return replace(plan, name=m.group(1)) if m and m.group(1) != "(unnamed)" else plan
