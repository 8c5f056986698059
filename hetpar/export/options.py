"""Option tables of the export targets per framework version: names, types, allowed values,
and the validator rules (environment variables, option pairs) of a cited framework commit."""

from __future__ import annotations

from hetpar.errors import ConfigError
from hetpar.export.schema import Option, OptionTable, Rule, argv_options, check
from hetpar.export.schema import flag_option as _f
from hetpar.export.schema import int_option as _i

__all__ = ["Option", "OptionTable", "Rule", "argv_options", "check"]


MEGATRON_COMMIT = "000c4ac24f61159c138b0975def722c65245983c"
_MEGATRON_ARGS = f"https://github.com/NVIDIA/Megatron-LM/blob/{MEGATRON_COMMIT}/megatron/training/arguments.py"
_TP_OR_CP_ENV = (
    "validate_args: 'Using tensor model parallelism or context parallelism require setting the "
    "environment variable CUDA_DEVICE_MAX_CONNECTIONS to 1' (pre-Blackwell GPUs)"
)

MEGATRON = OptionTable(
    framework="megatron",
    version="2026-01",
    commit=MEGATRON_COMMIT,
    sources=(
        # argparse definitions (names, types, choices) and validate_args of pretrain_gpt.py
        _MEGATRON_ARGS,
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
        _i("--train-iters"),
        Option(name="--lr", type="str"),
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
        Option(
            name="--ckpt-format",
            type="str",
            choices=("torch", "torch_dist", "torch_dcp", "fsdp_dtensor"),
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
        Option(
            name="--tokenizer-type",
            type="str",
            choices=("NullTokenizer", "HuggingFaceTokenizer", "GPT2BPETokenizer"),
        ),
        Option(name="--tokenizer-model", type="str"),
        _i("--vocab-size"),
        _f("--mock-data"),
        Option(name="--data-path", type="str"),
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
        Option(name="--wandb-project", type="str"),
        Option(name="--wandb-exp-name", type="str"),
    ),
    rules=(
        Rule(when=("--tensor-model-parallel-size>1", "!--use-megatron-fsdp"),
             then="env:CUDA_DEVICE_MAX_CONNECTIONS=1", why=_TP_OR_CP_ENV),
        Rule(when=("--context-parallel-size>1", "!--use-megatron-fsdp"),
             then="env:CUDA_DEVICE_MAX_CONNECTIONS=1", why=_TP_OR_CP_ENV),
        Rule(when=("--use-megatron-fsdp",), then="env:CUDA_DEVICE_MAX_CONNECTIONS!=1",
             why="validate_args: 'FSDP always requires CUDA_DEVICE_MAX_CONNECTIONS value "
                 "large than one'"),
        Rule(when=("--use-megatron-fsdp",), then="--ckpt-format=fsdp_dtensor",
             why="validate_args: 'Megatron FSDP only supports fsdp_dtensor checkpoint format'"),
        Rule(when=("--ckpt-format=fsdp_dtensor",), then="--use-megatron-fsdp",
             why="validate_args: '--ckpt-format fsdp_dtensor is only tested with Megatron FSDP'"),
        Rule(when=(), then="--tokenizer-type",
             why="without it pretrain_gpt.py builds GPT2BPETokenizer and downloads a vocabulary"),
        Rule(when=("--vocab-size",), then="--tokenizer-type=NullTokenizer",
             why="--vocab-size is read only by NullTokenizer; other tokenizers ignore it"),
        Rule(when=("--mock-data",), then="!--data-path",
             why="validate_args: 'A single data source must be provided in training mode'"),
        Rule(when=(), then="--train-iters",
             why="update_train_iters divides train_samples (None) without it"),
        Rule(when=("--wandb-exp-name",), then="--wandb-project",
             why="--wandb-exp-name does nothing without --wandb-project"),
        Rule(when=("--recompute-granularity=selective",), then="!--recompute-method",
             why="validate_args: 'recompute method is not yet supported for selective'"),
        Rule(when=("--use-megatron-fsdp",), then="--use-distributed-optimizer",
             why="Megatron-FSDP shards through the distributed optimizer"),
    ),
)

_PIPELINING = "https://docs.pytorch.org/docs/stable/distributed.pipelining.html"
_SCHEDULES = ("1F1B", "Interleaved1F1B", "GPipe", "LoopedBFS", "InterleavedZeroBubble",
              "ZBVZeroBubble", "DualPipeV")


def _titan_common(prefix: str) -> tuple[Option, ...]:
    """JobConfig fields every torchtitan version hetpar targets has (``prefix``: ``--`` on the
    command line of the registry form, nothing in TOML)."""
    p = prefix
    return (
        _i(f"{p}training.local_batch_size"),
        _i(f"{p}training.global_batch_size"),
        _i(f"{p}training.seq_len"),
        Option(name=f"{p}training.mixed_precision_param", type="str",
               choices=("bfloat16", "float32")),
        _i(f"{p}parallelism.data_parallel_replicate_degree"),
        _i(f"{p}parallelism.data_parallel_shard_degree"),
        Option(name=f"{p}parallelism.fsdp_reshard_after_forward", type="str",
               choices=("default", "always", "never")),
        _i(f"{p}parallelism.tensor_parallel_degree"),
        _i(f"{p}parallelism.pipeline_parallel_degree"),
        Option(name=f"{p}parallelism.pipeline_parallel_schedule", type="str", choices=_SCHEDULES),
        _i(f"{p}parallelism.pipeline_parallel_microbatch_size"),
        _i(f"{p}parallelism.context_parallel_degree"),
        Option(name=f"{p}activation_checkpoint.mode", type="str",
               choices=("selective", "full", "none")),
    )


def _titan_rules(prefix: str, split_key: str) -> tuple[Rule, ...]:
    """torchtitan's checks on the options hetpar writes (``prefix`` as in _titan_common)."""
    p = prefix
    ddp = ("DDP has not supported > 1D parallelism (models/llama3/infra/parallelize.py): "
           "replicas without sharding cannot combine with tp/pp/cp")
    return (
        Rule(when=(f"{p}parallelism.pipeline_parallel_degree>1",), then=f"{p}{split_key}",
             why="without it torchtitan infers the split itself (counting the embedding and "
                 "output as layers), not the exported split"),
        Rule(when=(f"{p}parallelism.data_parallel_replicate_degree>1",
                   f"{p}parallelism.tensor_parallel_degree>1"),
             then=f"{p}parallelism.data_parallel_shard_degree>1", why=ddp),
        Rule(when=(f"{p}parallelism.data_parallel_replicate_degree>1",
                   f"{p}parallelism.pipeline_parallel_degree>1"),
             then=f"{p}parallelism.data_parallel_shard_degree>1", why=ddp),
    )


_TOML_MODEL = (
    Option(name="job.description", type="str"),
    Option(name="model.name", type="str"),
    Option(name="model.flavor", type="str"),
    Option(name="model.converters", type="list", choices=("float8", "mx")),
)

TORCHTITAN_2025_07 = OptionTable(
    framework="torchtitan",
    version="2025-07",
    commit="000204a4a8bf3d0f31adc44fc29855fbb6ea13d8",
    sources=(
        # JobConfig dataclasses: section.field names, types and Literal choices
        "https://github.com/pytorch/torchtitan/blob/000204a4a8bf3d0f31adc44fc29855fbb6ea13d8/torchtitan/config/job_config.py",
        _PIPELINING,
    ),
    options=_TOML_MODEL + _titan_common("") + (
        Option(name="parallelism.pipeline_parallel_split_points", type="list"),
    ),
    rules=_titan_rules("", "parallelism.pipeline_parallel_split_points"),
)

TORCHTITAN_2025_10 = OptionTable(
    framework="torchtitan",
    version="2025-10",
    commit="6404b932421f5ce382e7dac5ad381b2c17b1373c",
    sources=(
        # the last TOML job config: split points replaced by module_fqns_per_model_part
        "https://github.com/pytorch/torchtitan/blob/6404b932421f5ce382e7dac5ad381b2c17b1373c/torchtitan/config/job_config.py",
        _PIPELINING,
    ),
    options=_TOML_MODEL + _titan_common("") + (
        Option(name="parallelism.module_fqns_per_model_part", type="nested"),
    ),
    rules=_titan_rules("", "parallelism.module_fqns_per_model_part"),
)

TORCHTITAN_2026_02 = OptionTable(
    framework="torchtitan",
    version="2026-02",
    commit="00d1c0e444a822e293533784a3ff0c99570f2329",
    sources=(
        # Python config registry (--module/--config) with tyro command-line overrides
        "https://github.com/pytorch/torchtitan/blob/00d1c0e444a822e293533784a3ff0c99570f2329/torchtitan/models/llama3/config_registry.py",
        # TrainingConfig / ParallelismConfig fields (first/last_stage_less_layers default 1)
        "https://github.com/pytorch/torchtitan/blob/0014ac2ca45ae15db6706b4f5cc3e67546c98885/torchtitan/config/configs.py",
        _PIPELINING,
    ),
    options=_titan_common("--") + (
        Option(name="--module", type="str", choices=("llama3",)),
        Option(name="--config", type="str",
               choices=("llama3_debugmodel", "llama3_8b", "llama3_70b", "llama3_405b")),
        _i("--parallelism.pipeline_parallel_layers_per_stage"),
        _i("--parallelism.pipeline_parallel_first_stage_less_layers", 0),
        _i("--parallelism.pipeline_parallel_last_stage_less_layers", 0),
    ),
    rules=_titan_rules("--", "parallelism.pipeline_parallel_layers_per_stage"),
)

DEEPSPEED = OptionTable(
    framework="deepspeed",
    version="0.19.8",
    commit="v0.19.8",
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
        # arguments of the train.py contract (docs/exports.md): PipelineModule's own
        _i("--pipeline-parallel-size"),
        Option(name="--partition-method", type="str"),
        _i("--activation-checkpoint-interval", 0),
    ),
    rules=(
        Rule(when=("--pipeline-parallel-size>1",), then="--partition-method",
             why="PipelineModule's partition_method decides the split ('parameters' by default)"),
    ),
)

VERSIONS: dict[str, dict[str, OptionTable]] = {
    "megatron": {MEGATRON.version: MEGATRON},
    "torchtitan": {t.version: t for t in (TORCHTITAN_2025_07, TORCHTITAN_2025_10,
                                          TORCHTITAN_2026_02)},
    "deepspeed": {DEEPSPEED.version: DEEPSPEED},
}
TORCHTITAN = TORCHTITAN_2026_02
TABLES = {name: tables[max(tables)] for name, tables in VERSIONS.items()}
"""The newest supported version of each target (the default of ``--framework-version``)."""


def table(target: str, version: str | None = None) -> OptionTable:
    """The option table of ``target`` at ``version`` (default: the newest supported)."""
    tables = VERSIONS[target]
    if version is None:
        return TABLES[target]
    if version not in tables:
        raise ConfigError(
            f"export: --framework-version {version!r} is not a supported {target} version; "
            f"supported: {', '.join(sorted(tables))}"
        )
    return tables[version]
