"""torchtitan's Python config registry form (2026-02 on): a torchrun launch script running
``-m torchtitan.train --module llama3 --config NAME`` with command-line overrides."""

from __future__ import annotations

import re
import shlex
from dataclasses import replace

from hetpar.errors import ConfigError
from hetpar.export import torchtitan_experts, torchtitan_toml
from hetpar.export.nearest import divisible_plan
from hetpar.export.schema import OptionTable, argv_options
from hetpar.export.torchtitan_options import (
    AC_SUBCOMMAND,
    BENCHMARK_ASSETS,
    BENCHMARK_DATASET,
    TORCHTITAN_2026_02,
    TORCHTITAN_2026_08,
)
from hetpar.export.torchtitan_release import TORCHTITAN_0_3_0
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


def module_config(model: ModelSpec, table: OptionTable) -> tuple[str, str]:
    """(--module, --config) of a catalog model: llama3's, or an MoE model's own module."""
    if model.n_experts > 1:
        return torchtitan_experts.entry(model, table)
    return "llama3", config_name(model)


def nearest(plan: Plan, model: ModelSpec,
            table: OptionTable = TORCHTITAN_2026_02) -> tuple[Plan, list[str]]:
    """torchtitan's nearest plan, then what the registry form cannot say."""
    moe = model.n_experts > 1
    name = module_config(model, table)[1]
    plan, lost = torchtitan_toml.nearest(plan, model, carries=torchtitan_experts.EXPERT_AXES
                                         if moe else (), label=f"torchtitan {table.version}")
    if moe:
        plan, more = torchtitan_experts.nearest(plan, model, table)
        lost += more
    native = name in NATIVE_FP8 or (table.version, name) in torchtitan_experts.NATIVE_FP8
    if plan.precision == "fp8" and not native:
        lost.append(f"float8 converters are not a command-line override of {name} -> bf16")
        plan = replace(plan, precision="bf16")
    elif plan.precision != "fp8" and native:
        lost.append(f"{name} applies float8 converters itself -> precision fp8")
        plan = replace(plan, precision="fp8")
    parts = plan.pp * plan.vpp
    if plan.pp > 1 and model.n_layers % parts:
        near = divisible_plan(plan, model.n_layers, vpp=True)
        raise ConfigError(
            f"export: torchtitan 2026-02 and later split {model.n_layers} layers by "
            f"pipeline_parallel_layers_per_stage, which needs them divisible by pp*vpp={parts}; "
            f"nearest plan: {near}" + ("" if moe else " (or --framework-version 2025-10, "
                                       "which takes any split)")
        )
    return plan, lost


def arguments(plan: Plan, model: ModelSpec,
              table: OptionTable = TORCHTITAN_2026_02, replicate: int = 1) -> list[str]:
    """``--module``/``--config`` and the overrides for a plan made expressible by ``nearest``
    (2026-08: token-count batches and the checkpointing subcommand, ``_token_arguments``)."""
    if table.version == TORCHTITAN_2026_08.version:
        return _token_arguments(plan, model, replicate)
    cfg = torchtitan_toml.config(plan, model, version="2025-10", replicate=replicate)
    module, name = module_config(model, table)
    argv = ["--module", module, "--config", name]
    argv += torchtitan_experts.arguments(plan, table) if model.n_experts > 1 else []
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
    argv += ["--hf_assets_path", BENCHMARK_ASSETS, "--dataloader.dataset", BENCHMARK_DATASET]
    return _release_form(argv, plan) if table.version == TORCHTITAN_0_3_0.version else argv


def _release_form(argv: list[str], plan: Plan) -> list[str]:
    """0.3.0 (torchtitan_release.py): the 2026-02 overrides with the checkpointing policy as
    the subcommand, last, and CUDA graphs off with a pipeline (Trainer.Config refuses both)."""
    i = argv.index("--activation_checkpoint.mode")
    mode, argv = argv[i + 1], argv[:i] + argv[i + 2:]
    return argv + _no_graphs(plan) + [f"{AC_SUBCOMMAND}:{mode}"]


def _no_graphs(plan: Plan) -> list[str]:
    """``--training.disable_cuda_graphs`` where Trainer.Config._validate_cuda_graphs (0.3.0,
    2026-08) refuses CUDA graphs, on by default: with a pipeline ("CUDA graphs do not support
    pipeline parallelism yet"), and with expert parallelism over the registry configs'
    all-to-all token dispatcher ("CUDA graphs support only expert parallel token dispatcher
    configurations without CPU synchronization"). A flag."""
    return ["--training.disable_cuda_graphs"] if plan.pp > 1 or plan.degree("ep") > 1 else []


def _token_arguments(plan: Plan, model: ModelSpec, replicate: int = 1) -> list[str]:
    """2026-08: a microbatch is micro_batch x seq_len token slots per DP rank, a step
    global_batch x seq_len (gradient accumulation, trainer.py, makes up the rest); a pipeline
    runs the DP rank's batch as batch / (dp x micro_batch) microbatches; the checkpointing
    policy is a subcommand, last (torchtitan_options.py cites the files)."""
    cfg = torchtitan_toml.config(plan, model, version="2025-10", replicate=replicate)
    seq = model.seq_len
    module, name = module_config(model, TORCHTITAN_2026_08)
    argv = ["--module", module, "--config", name,
            "--training.num_tokens_per_microbatch_per_dp_rank", str(plan.micro_batch * seq),
            "--training.num_tokens_per_train_step", str(plan.batch * seq),
            "--training.max_context_length", str(seq),
            "--training.mixed_precision_param", cfg["training"]["mixed_precision_param"]]
    for key, value in cfg["parallelism"].items():
        if key not in ("module_fqns_per_model_part", "pipeline_parallel_microbatch_size"):
            argv += [f"--parallelism.{key}", str(value)]
    argv += _no_graphs(plan)
    if plan.pp > 1:
        argv += [
            "--parallelism.num_pp_microbatches", str(plan.batch // (plan.dp * plan.micro_batch)),
            "--parallelism.pipeline_parallel_layers_per_stage",
            str(model.n_layers // (plan.pp * plan.vpp)),
            "--parallelism.pipeline_parallel_first_stage_less_layers", "0",
            "--parallelism.pipeline_parallel_last_stage_less_layers", "0",
        ]
    if model.n_experts > 1:
        argv += torchtitan_experts.arguments(plan, TORCHTITAN_2026_08)
    return argv + ["--hf_assets_path", BENCHMARK_ASSETS, f"{AC_SUBCOMMAND}:{plan.recompute}"]


REAL_DATA_2026_08 = [
    f"a benchmark: run from the root of a torchtitan checkout; --hf_assets_path "
    f"{BENCHMARK_ASSETS} is its test tokenizer; the dataset is the config's own (llama3_8b/"
    "70b/405b: c4, allenai/c4 streamed from the Hugging Face Hub): torchtitan 2026-08 takes "
    "no dataset on the command line (GrainDataLoader.Config.dataset is suppressed)",
    "for the real tokenizer replace that line, e.g. --hf_assets_path ./assets/hf/Llama-3.1-8B "
    "(python scripts/download_hf_assets.py --repo_id meta-llama/Llama-3.1-8B --assets "
    "tokenizer)",
]

REAL_DATA = [
    f"a benchmark: run from the root of a torchtitan checkout; --hf_assets_path "
    f"{BENCHMARK_ASSETS} (its test tokenizer) and --dataloader.dataset {BENCHMARK_DATASET} "
    "(tests/assets/c4_test) need no download",
    "for real data and tokenizer replace those two lines, e.g. --hf_assets_path "
    "./assets/hf/Llama-3.1-8B (python scripts/download_hf_assets.py --repo_id "
    "meta-llama/Llama-3.1-8B --assets tokenizer) and --dataloader.dataset c4 (allenai/c4 "
    "from the Hugging Face Hub)",
]


def script(argv: list[str], nodes: int, per_node: int, header: list[str],
           notes: list[str] | None = None) -> str:
    """The launch script: torchrun with one override per line, the script's own arguments,
    then any subcommand (2026-08's activation-checkpoint:NAME), last as torchtitan's tests
    place it (run_moe_tests.sh)."""
    notes = REAL_DATA if notes is None else notes
    lines = ["#!/bin/sh"] + [f"# {h}" for h in header + notes]
    lines.append(f"torchrun --nnodes {nodes} --nproc-per-node {per_node} -m torchtitan.train \\")
    options = [w for w in argv if not w.startswith(f"{AC_SUBCOMMAND}:")]
    i = 0
    while i < len(options):  # an option and its value, or a flag alone
        step = 2 if i + 1 < len(options) and not options[i + 1].startswith("--") else 1
        lines.append("    " + " ".join(shlex.quote(w) for w in options[i : i + step]) + " \\")
        i += step
    subcommands = argv[len(options):]
    lines.append('    "$@"' + "".join(f" \\\n    {w}" for w in subcommands))
    return "\n".join(lines) + "\n"


def options_of(argv: list[str], table: OptionTable = TORCHTITAN_2026_02) -> dict[str, object]:
    """The overrides as option -> value, typed per ``table``; the checkpointing subcommand
    ``activation-checkpoint:NAME`` as option ``activation-checkpoint`` = NAME."""
    words = [w for w in argv if not w.startswith(f"{AC_SUBCOMMAND}:")]
    ac = [w.split(":", 1)[1] for w in argv if w.startswith(f"{AC_SUBCOMMAND}:")]
    return {**argv_options(words, table), **({AC_SUBCOMMAND: ac[-1]} if ac else {})}


def parse(text: str, model: ModelSpec) -> Plan:
    """The uniform hetpar plan a registry-form launch script describes."""
    body = " ".join(ln.rstrip("\\") for ln in text.splitlines() if not ln.lstrip().startswith("#"))
    words = shlex.split(body)
    if "torchtitan.train" not in words:
        raise ConfigError("torchtitan: no '-m torchtitan.train' line in the launch script")
    argv = [w for w in words[words.index("torchtitan.train") + 1 :] if w != "$@"]
    tokens = "--training.num_tokens_per_train_step" in argv
    release = not tokens and any(w.startswith(f"{AC_SUBCOMMAND}:") for w in argv)  # 0.3.0
    table = TORCHTITAN_2026_08 if tokens else TORCHTITAN_0_3_0 if release else TORCHTITAN_2026_02
    cfg: dict[str, dict[str, object]] = {}
    for name, value in options_of(argv, table).items():
        if "." in name:
            section, key = name[2:].split(".", 1)
            cfg.setdefault(section, {})[key] = value
    par = dict(cfg.get("parallelism", {}))
    if tokens:
        cfg = _batch_form(cfg, options_of(argv, TORCHTITAN_2026_08).get(AC_SUBCOMMAND))
    elif release:
        cfg["activation_checkpoint"] = {"mode": options_of(argv, table)[AC_SUBCOMMAND]}
    plan = torchtitan_toml.parse_config(cfg, model)
    if model.n_experts > 1:
        plan = torchtitan_experts.read_axes(plan, par, tokens or release)
    m = re.search(r"^# hetpar export of plan (.+) for \S+ -> ", text, re.MULTILINE)
    return replace(plan, name=m.group(1)) if m and m.group(1) != "(unnamed)" else plan


def _batch_form(cfg: dict[str, dict[str, object]], ac: object) -> dict[str, dict[str, object]]:
    """A 2026-08 configuration in the sequence-count keys ``parse_config`` reads."""
    tr, par = cfg.get("training", {}), dict(cfg.get("parallelism", {}))
    try:
        seq = int(str(tr["max_context_length"]))
        micro = int(str(tr["num_tokens_per_microbatch_per_dp_rank"])) // seq
        batch = int(str(tr["num_tokens_per_train_step"])) // seq
    except KeyError as e:
        raise ConfigError(f"torchtitan: the launch script has no --training.{e.args[0]}") from None
    training: dict[str, object] = {"global_batch_size": batch, "seq_len": seq,
                                   **{k: v for k, v in tr.items() if not k.startswith(("num_",
                                                                                       "max_"))}}
    if int(str(par.get("pipeline_parallel_degree", 1))) > 1:
        n = int(str(par.pop("num_pp_microbatches", 1)))
        training["local_batch_size"] = micro * n
        par["pipeline_parallel_microbatch_size"] = micro
    else:
        training["local_batch_size"] = micro
    return {**cfg, "training": training, "parallelism": par,
            "activation_checkpoint": {"mode": ac or "selective"}}
