"""torchtitan's option tables per version (JobConfig fields in TOML, or the config registry's
command-line overrides, and the checks torchtitan applies) and its names for hetpar's
pipeline schedules."""

from __future__ import annotations

from hetpar.export.schema import Option, OptionTable, Rule
from hetpar.export.schema import flag_option as _f
from hetpar.export.schema import int_option as _i
from hetpar.export.target import ScheduleNames

_PIPELINING = "https://docs.pytorch.org/docs/stable/distributed.pipelining.html"
_SCHEDULES = ("1F1B", "Interleaved1F1B", "GPipe", "LoopedBFS", "InterleavedZeroBubble",
              "ZBVZeroBubble", "DualPipeV")


def _titan_common(prefix: str) -> tuple[Option, ...]:
    """JobConfig fields of every torchtitan version hetpar targets up to 2026-02 (``prefix``:
    ``--`` on the command line of the registry form, nothing in TOML)."""
    p = prefix
    return (
        _i(f"{p}training.local_batch_size"),
        _i(f"{p}training.global_batch_size"),
        _i(f"{p}training.seq_len"),
        _i(f"{p}parallelism.pipeline_parallel_microbatch_size"),
        Option(name=f"{p}activation_checkpoint.mode", type="str",
               choices=("selective", "full", "none")),
    ) + _titan_parallel(p)


def _titan_parallel(p: str) -> tuple[Option, ...]:
    """The precision and parallelism fields every version has (2026-08 included)."""
    return (
        Option(name=f"{p}training.mixed_precision_param", type="str",
               choices=("bfloat16", "float32")),
        _i(f"{p}parallelism.data_parallel_replicate_degree"),
        _i(f"{p}parallelism.data_parallel_shard_degree"),
        Option(name=f"{p}parallelism.fsdp_reshard_after_forward", type="str",
               choices=("default", "always", "never")),
        _i(f"{p}parallelism.tensor_parallel_degree"),
        _i(f"{p}parallelism.pipeline_parallel_degree"),
        Option(name=f"{p}parallelism.pipeline_parallel_schedule", type="str", choices=_SCHEDULES),
        _i(f"{p}parallelism.context_parallel_degree"),
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

_TT = "https://github.com/pytorch/torchtitan/blob/"

# The registry form's data and tokenizer, as read with the code index (the files below; the
# index holds config_registry.py at 00d1c0e4 itself, the others at the nearest stored commits):
# - config_registry.py@00d1c0e4: llama3_8b/70b/405b set Trainer.Config(hf_assets_path=
#   "./assets/hf/Llama-3.1-<size>") and dataloader=HuggingFaceTextDataLoader.Config(dataset="c4")
#   (both downloaded); llama3_debugmodel, at the same commit, hf_assets_path=
#   "./tests/assets/tokenizer" and dataset="c4_test", both inside the torchtitan checkout.
# - trainer.py@003fe280: hf_assets_path is a top-level Trainer.Config field (the tokenizer is
#   built from it); dataloader is the field holding the loader's Config.
# - hf_datasets/text_datasets.py@8cbe53d8: HuggingFaceTextDataLoader.Config.dataset: str;
#   DATASETS["c4_test"] = tests/assets/c4_test read by load_dataset(path, split="train"),
#   "c4" and "c4_validation" = allenai/c4 streamed from the Hub.
# - the spelling: tyro turns field paths into --section.key with underscores kept, as
#   torchtitan's own tests pass them: a top-level field --dump_folder
#   (tests/integration_tests/run_tests.py@cfb93265), --dataloader.num_workers and
#   --validator.dataloader.dataset c4_test (tests/integration_tests/features.py@9db06501).
# - tests/assets/tokenizer/tokenizer.json and tokenizer_config.json are in the index; the c4_test
#   data file is not (the index holds no data files): it is the set llama3_debugmodel reads.
DATASETS = ("c4_test", "c4", "c4_validation")
BENCHMARK_ASSETS = "./tests/assets/tokenizer"  # llama3_debugmodel's, in the checkout
BENCHMARK_DATASET = "c4_test"

# The mixture-of-experts models of the config registry, per version: hetpar catalog model ->
# (--module, --config), each a function of torchtitan/models/<module>/config_registry.py at
# the table's commit (read with git show <commit>:<file> from the fetched repository):
# - 00d1c0e4 (2026-02): deepseek_v3_671b (model_registry("671B"), Float8 converters on the
#   linear layers and the experts' grouped GEMMs), gpt_oss_20b / gpt_oss_120b
#   (model_registry("20b") / ("120b")); qwen3 has qwen3_moe_debug only, no 30B-A3B.
# - b5bcd76c (2026-08): the same plus qwen3_30b_a3b (model_registry("30B-A3B")); its
#   deepseek_v3_671b is bf16 (the float8 one is deepseek_v3_671b_float8).
# Expert parallelism (torchtitan/config/configs.py ParallelismConfig and
# torchtitan/distributed/parallel_dims.py at the same commits): 2026-02 has
# expert_parallel_degree and expert_tensor_parallel_degree (etp = 1 or tp; efsdp = dp_shard x
# cp x tp / (etp x ep)); 2026-08 has expert_parallel_degree only ("EP borrows ranks from FSDP
# and TP: efsdp = dp_shard * cp * tp / ep": the experts are whole on each EP rank); with EP off
# and TP on both shard the experts over TP (the dense {TP} layout of
# models/common/moe_sharding.py at b5bcd76c; llama4/parallelize.py apply_moe_ep_tp at
# 00d1c0e4).
MOE_CONFIGS_2026_02 = {
    "deepseek-v3": ("deepseek_v3", "deepseek_v3_671b"),
    "gpt-oss-20b": ("gpt_oss", "gpt_oss_20b"),
    "gpt-oss-120b": ("gpt_oss", "gpt_oss_120b"),
}
MOE_CONFIGS_2026_08 = {**MOE_CONFIGS_2026_02, "qwen3-30b-a3b": ("qwen3", "qwen3_30b_a3b")}
_LLAMA3_CONFIGS = ("llama3_debugmodel", "llama3_8b", "llama3_70b", "llama3_405b")


def _modules(moe: dict[str, tuple[str, str]]) -> tuple[str, ...]:
    return ("llama3",) + tuple(sorted({m for m, _ in moe.values()}))


def _configs(moe: dict[str, tuple[str, str]]) -> tuple[str, ...]:
    return _LLAMA3_CONFIGS + tuple(c for _, c in moe.values())


TORCHTITAN_2026_02 = OptionTable(
    framework="torchtitan",
    version="2026-02",
    commit="00d1c0e444a822e293533784a3ff0c99570f2329",
    sources=(
        # Python config registry (--module/--config) with tyro command-line overrides
        "https://github.com/pytorch/torchtitan/blob/00d1c0e444a822e293533784a3ff0c99570f2329/torchtitan/models/llama3/config_registry.py",
        # TrainingConfig / ParallelismConfig fields (first/last_stage_less_layers default 1)
        _TT + "0014ac2ca45ae15db6706b4f5cc3e67546c98885/torchtitan/config/configs.py",
        # Trainer.Config.hf_assets_path and .dataloader; DATASETS and the dataloader's dataset
        _TT + "003fe28042153d6b84958a3a4004987d8dc4cd53/torchtitan/trainer.py",
        _TT + "8cbe53d8dedff0888898733a6685f4e5e61fbeb4/torchtitan/hf_datasets/text_datasets.py",
        _PIPELINING,
    ),
    options=_titan_common("--") + (
        Option(name="--module", type="str", choices=_modules(MOE_CONFIGS_2026_02)),
        Option(name="--config", type="str", choices=_configs(MOE_CONFIGS_2026_02)),
        _i("--parallelism.pipeline_parallel_layers_per_stage"),
        _i("--parallelism.pipeline_parallel_first_stage_less_layers", 0),
        _i("--parallelism.pipeline_parallel_last_stage_less_layers", 0),
        Option(name="--hf_assets_path", type="str"),
        Option(name="--dataloader.dataset", type="str", choices=DATASETS),
        _i("--parallelism.expert_parallel_degree"),
        _i("--parallelism.expert_tensor_parallel_degree"),
    ),
    rules=_titan_rules("--", "parallelism.pipeline_parallel_layers_per_stage") + (
        Rule(when=(), then="--hf_assets_path",
             why="llama3_8b/70b/405b read the tokenizer from ./assets/hf/Llama-3.1-<size>, "
                 "downloaded beforehand from the gated meta-llama repository "
                 "(scripts/download_hf_assets.py)"),
        Rule(when=(), then="--dataloader.dataset",
             why="llama3_8b/70b/405b set dataset c4: allenai/c4 streamed from the Hugging "
                 "Face Hub"),
    ),
)

# The current torchtitan (b5bcd76c, 2026-08-21), read from the fetched repository at that
# commit (git show b5bcd76c:<file>):
# - torchtitan/config/configs.py: TrainingConfig has num_tokens_per_microbatch_per_dp_rank
#   (token slots per DP rank in one forward, before CP/TP sharding), num_tokens_per_train_step
#   (-1: that x num_pp_microbatches x DP degree) and max_context_length; local_batch_size,
#   global_batch_size and seq_len are gone; ParallelismConfig.num_pp_microbatches replaces
#   pipeline_parallel_microbatch_size (the pipeline_parallel_* split, schedule and degree
#   fields stay).
# - torchtitan/trainer.py: gradient accumulation = num_tokens_per_train_step / (tokens per
#   microbatch x num_pp_microbatches x DP degree), which must divide exactly; tokens per
#   microbatch divisible by TP (sequence parallel on) x 2 CP (CP > 1); Trainer.Config keeps
#   hf_assets_path (the tokenizer); activation_checkpoint is ActivationCheckpointingConfig.
# - torchtitan/distributed/activation_checkpoint.py: ActivationCheckpointingConfig is a tyro
#   subcommand union selective | full | memory-budget | none, spelled activation-checkpoint:NAME
#   as torchtitan's own tests pass it
#   (torchtitan/experiments/transformers_modeling_backend/tests/run_moe_tests.sh).
# - torchtitan/components/data/loader.py: GrainDataLoader.Config.dataset is
#   tyro.conf.Suppress, so the dataset is the config's (llama3_8b/70b/405b: c4, allenai/c4
#   from the Hub, models/llama3/config_registry.py) with no command-line override; packing
#   (components/data/packing.py) splits each microbatch's token slots into rows with
#   positions modulo max_context_length.
_TT_NOW = "b5bcd76c66d0acb1a08b176d9639425bc55e0b2a"
AC_SUBCOMMAND = "activation-checkpoint"

# The options and rules the 2026-08 form and the 0.3.0 release share (activation
# checkpointing as subcommands, the MoE registry, the CUDA-graph checks).
SUBCOMMAND_OPTIONS = (
    _f("--training.disable_cuda_graphs"),
    Option(name=AC_SUBCOMMAND, type="str", choices=("selective", "full", "none")),
    Option(name="--module", type="str", choices=_modules(MOE_CONFIGS_2026_08)),
    Option(name="--config", type="str", choices=_configs(MOE_CONFIGS_2026_08)),
    _i("--parallelism.expert_parallel_degree"),
    _i("--parallelism.pipeline_parallel_layers_per_stage"),
    _i("--parallelism.pipeline_parallel_first_stage_less_layers", 0),
    _i("--parallelism.pipeline_parallel_last_stage_less_layers", 0),
    Option(name="--hf_assets_path", type="str"),
)
HF_ASSETS_RULE = Rule(when=(), then="--hf_assets_path",
                      why="llama3_8b/70b/405b read the tokenizer from "
                          "./assets/hf/Llama-3.1-<size>, downloaded beforehand from the gated "
                          "meta-llama repository")
CUDA_GRAPH_RULES = (
    Rule(when=("--parallelism.pipeline_parallel_degree>1",),
         then="--training.disable_cuda_graphs",
         why="trainer.py Trainer.Config._validate_cuda_graphs: 'CUDA graphs do not support "
             "pipeline parallelism yet. Set --training.disable_cuda_graphs.'"),
    Rule(when=("--parallelism.expert_parallel_degree>1",),
         then="--training.disable_cuda_graphs",
         why="trainer.py Trainer.Config._validate_cuda_graphs: 'CUDA graphs support only "
             "expert parallel token dispatcher configurations without CPU "
             "synchronization' (the registry's MoE configs use the all-to-all one)"),
)


TORCHTITAN_2026_08 = OptionTable(
    framework="torchtitan",
    version="2026-08",
    commit=_TT_NOW,
    sources=tuple(f"{_TT}{_TT_NOW}/{f}" for f in (
        "torchtitan/config/configs.py", "torchtitan/trainer.py",
        "torchtitan/distributed/activation_checkpoint.py",
        "torchtitan/components/data/loader.py", "torchtitan/models/llama3/config_registry.py",
    )) + (_PIPELINING,),
    options=_titan_parallel("--") + (
        _i("--training.num_tokens_per_microbatch_per_dp_rank"),
        _i("--training.num_tokens_per_train_step"),
        _i("--training.max_context_length"),
        _i("--parallelism.num_pp_microbatches"),
    ) + SUBCOMMAND_OPTIONS,
    rules=_titan_rules("--", "parallelism.pipeline_parallel_layers_per_stage") + (
        HF_ASSETS_RULE,
        Rule(when=("--parallelism.pipeline_parallel_degree>1",),
             then="--parallelism.num_pp_microbatches",
             why="its default 1 would run the whole DP-rank batch as one pipeline microbatch"),
    ) + CUDA_GRAPH_RULES,
)

SCHEDULES = ScheduleNames(
    label="torchtitan",
    # parallelism.pipeline_parallel_schedule: torch.distributed.pipelining schedule classes
    by_name={"gpipe": "GPipe", "1f1b": "1F1B", "interleaved": "Interleaved1F1B"},
)
