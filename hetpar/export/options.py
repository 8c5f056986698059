"""Option tables of the export targets (name, type, allowed values), from their public docs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from hetpar.errors import ConfigError

OptionType = Literal["int", "float", "bool", "str", "flag", "list"]


@dataclass(frozen=True, kw_only=True)
class Option:
    """One framework option: a command-line flag or a (dotted) configuration key."""

    name: str
    type: OptionType
    """``flag`` = a command-line switch without a value; ``list`` = a list of strings."""
    choices: tuple[str | int, ...] = ()
    """Allowed values (empty = any value of the type)."""
    min: int | None = None
    """Smallest allowed value for ``int`` options."""


@dataclass(frozen=True, kw_only=True)
class OptionTable:
    """The options hetpar writes for one framework, and the documentation they come from."""

    framework: str
    sources: tuple[str, ...]
    options: tuple[Option, ...]

    def get(self, name: str) -> Option | None:
        """The option called ``name``, or None."""
        return next((o for o in self.options if o.name == name), None)


def _i(name: str, lo: int = 1) -> Option:
    return Option(name=name, type="int", min=lo)


def _f(name: str) -> Option:
    return Option(name=name, type="flag")


MEGATRON = OptionTable(
    framework="megatron",
    sources=(
        # argparse definitions (names, types, choices) of pretrain_gpt.py's arguments
        "https://github.com/NVIDIA/Megatron-LM/blob/main/megatron/training/arguments.py",
        "https://docs.nvidia.com/megatron-core/developer-guide/latest/user-guide/features/megatron_fsdp.html",
    ),
    options=(
        _i("--tensor-model-parallel-size"),
        _i("--pipeline-model-parallel-size"),
        _i("--context-parallel-size"),
        _i("--num-layers-per-virtual-pipeline-stage"),
        _i("--num-virtual-stages-per-pipeline-rank"),
        _i("--decoder-first-pipeline-num-layers", 0),
        _i("--decoder-last-pipeline-num-layers", 0),
        _i("--micro-batch-size"),
        _i("--global-batch-size"),
        _f("--sequence-parallel"),
        Option(name="--recompute-granularity", type="str", choices=("full", "selective")),
        Option(name="--recompute-method", type="str", choices=("uniform", "block")),
        _i("--recompute-num-layers"),
        _f("--use-distributed-optimizer"),
        _f("--use-megatron-fsdp"),
        Option(
            name="--data-parallel-sharding-strategy",
            type="str",
            choices=("no_shard", "optim", "optim_grads", "optim_grads_params"),
        ),
        _f("--bf16"),
        _f("--fp16"),
        Option(name="--fp8-format", type="str", choices=("e4m3", "hybrid")),
        _i("--num-layers"),
        _i("--hidden-size"),
        _i("--ffn-hidden-size"),
        _i("--num-attention-heads"),
        _f("--group-query-attention"),
        _i("--num-query-groups"),
        _i("--kv-channels"),
        _i("--seq-length"),
        _i("--max-position-embeddings"),
        _i("--vocab-size"),
        _f("--swiglu"),
        Option(name="--normalization", type="str", choices=("LayerNorm", "RMSNorm")),
        Option(
            name="--position-embedding-type",
            type="str",
            choices=("learned_absolute", "rope", "relative", "none"),
        ),
        _f("--untie-embeddings-and-output-weights"),
        _f("--disable-bias-linear"),
        _f("--add-qkv-bias"),
        _f("--qk-layernorm"),
        _i("--num-experts"),
        _i("--moe-router-topk"),
        _i("--moe-layer-freq"),
        Option(name="--wandb-exp-name", type="str"),
    ),
)

TORCHTITAN = OptionTable(
    framework="torchtitan",
    sources=(
        # JobConfig dataclasses: section.field names, types and Literal choices
        "https://github.com/pytorch/torchtitan/blob/000204a4a8bf3d0f31adc44fc29855fbb6ea13d8/torchtitan/config/job_config.py",
        # schedule names accepted by torch.distributed.pipelining.get_schedule_class
        "https://docs.pytorch.org/docs/stable/distributed.pipelining.html",
    ),
    options=(
        Option(name="job.description", type="str"),
        Option(name="model.name", type="str"),
        Option(name="model.flavor", type="str"),
        Option(name="model.converters", type="list", choices=("float8", "mx")),
        _i("training.local_batch_size"),
        _i("training.global_batch_size"),
        _i("training.seq_len"),
        Option(name="training.mixed_precision_param", type="str", choices=("bfloat16", "float32")),
        _i("parallelism.data_parallel_replicate_degree"),
        _i("parallelism.data_parallel_shard_degree"),
        Option(
            name="parallelism.fsdp_reshard_after_forward",
            type="str",
            choices=("default", "always", "never"),
        ),
        _i("parallelism.tensor_parallel_degree"),
        _i("parallelism.pipeline_parallel_degree"),
        Option(name="parallelism.pipeline_parallel_split_points", type="list"),
        Option(
            name="parallelism.pipeline_parallel_schedule",
            type="str",
            choices=(
                "1F1B",
                "Interleaved1F1B",
                "GPipe",
                "LoopedBFS",
                "InterleavedZeroBubble",
                "ZBVZeroBubble",
                "DualPipeV",
            ),
        ),
        _i("parallelism.pipeline_parallel_microbatch_size"),
        _i("parallelism.context_parallel_degree"),
        Option(
            name="activation_checkpoint.mode", type="str", choices=("selective", "full", "none")
        ),
        Option(name="activation_checkpoint.selective_ac_option", type="str"),
    ),
)

DEEPSPEED = OptionTable(
    framework="deepspeed",
    sources=(
        "https://www.deepspeed.ai/docs/config-json/",
        "https://www.deepspeed.ai/tutorials/pipeline/",
        # AutoTP training (DeepSpeed >= 0.16.4): the tensor_parallel.autotp_size key
        "https://www.deepspeed.ai/tutorials/autotp-training/",
        "https://www.deepspeed.ai/getting-started/#launching-deepspeed-training",
    ),
    options=(
        _i("train_batch_size"),
        _i("train_micro_batch_size_per_gpu"),
        _i("gradient_accumulation_steps"),
        Option(name="zero_optimization.stage", type="int", choices=(0, 1, 2, 3)),
        Option(name="bf16.enabled", type="bool"),
        Option(name="fp16.enabled", type="bool"),
        _i("tensor_parallel.autotp_size"),
        _i("pipeline.stages"),
        Option(name="pipeline.partition", type="str", choices=("uniform", "parameters", "best")),
        _i("pipeline.activation_checkpoint_interval", 0),
        Option(name="activation_checkpointing.partition_activations", type="bool"),
        Option(name="activation_checkpointing.contiguous_memory_optimization", type="bool"),
        Option(name="activation_checkpointing.cpu_checkpointing", type="bool"),
        Option(name="tensorboard.enabled", type="bool"),
        Option(name="tensorboard.job_name", type="str"),
        # launcher (the `deepspeed` command) arguments
        _i("--num_nodes"),
        _i("--num_gpus"),
        _f("--deepspeed"),
        Option(name="--deepspeed_config", type="str"),
    ),
)

TABLES = {t.framework: t for t in (MEGATRON, TORCHTITAN, DEEPSPEED)}


def check(table: OptionTable, items: Mapping[str, object]) -> list[str]:
    """Problems with ``items`` (option name -> value; None for a flag) against ``table``."""
    problems = []
    for name, value in items.items():
        opt = table.get(name)
        if opt is None:
            problems.append(f"{table.framework}: unknown option {name}")
        elif not _fits(opt, value):
            problems.append(
                f"{table.framework}: {name}={value!r} not allowed ({opt.type} {opt.choices})"
            )
    return problems


def _fits(opt: Option, value: object) -> bool:
    if opt.type == "flag":
        return value is None
    if opt.type == "list":
        return isinstance(value, list) and all(
            isinstance(v, str) and (not opt.choices or v in opt.choices) for v in value
        )
    kinds: dict[str, tuple[type, ...]] = {
        "int": (int,),
        "float": (int, float),
        "bool": (bool,),
        "str": (str,),
    }
    if not isinstance(value, kinds[opt.type]) or (opt.type != "bool" and isinstance(value, bool)):
        return False
    if opt.choices and value not in opt.choices:
        return False
    return not (opt.min is not None and isinstance(value, int) and value < opt.min)


def argv_options(argv: list[str], table: OptionTable) -> dict[str, object]:
    """Command-line ``argv`` as option -> value: ints typed per ``table``, None for flags."""
    out: dict[str, object] = {}
    i = 0
    while i < len(argv):
        name = argv[i]
        if not name.startswith("--"):
            raise ConfigError(f"{table.framework}: expected an option, got {name!r}")
        value: object = None
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            value, i = argv[i + 1], i + 1
            opt = table.get(name)
            if opt is not None and opt.type == "int":
                try:
                    value = int(str(value))
                except ValueError:
                    raise ConfigError(
                        f"{table.framework}: {name} expects an integer, got {value!r}"
                    ) from None
        out[name] = value
        i += 1
    return out
