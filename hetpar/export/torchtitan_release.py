"""torchtitan 0.3.0, the release on PyPI: the 2026-02 batch options with 2026-08's
activation-checkpointing subcommands, CUDA-graph rule and expert options."""

from __future__ import annotations

from hetpar.export.schema import Option, OptionTable, Rule
from hetpar.export.schema import flag_option as _f
from hetpar.export.schema import int_option as _i
from hetpar.export.torchtitan_options import (
    _PIPELINING,
    AC_SUBCOMMAND,
    DATASETS,
    MOE_CONFIGS_2026_08,
    _configs,
    _modules,
    _titan_common,
    _titan_rules,
)

# torchtitan 0.3.0 (https://pypi.org/project/torchtitan/0.3.0/, wheel built 2026-09-03) is not
# tagged in the repository; its config files are byte-identical (git hash-object of the wheel's
# file = the blob at the commit) to pytorch/torchtitan main at 0b2a804d (2026-08-19), the
# nearest main commit by changed files (44 of its .py files differ, none below):
# - torchtitan/config/configs.py: TrainingConfig.local_batch_size, global_batch_size, seq_len,
#   disable_cuda_graphs; ParallelismConfig.pipeline_parallel_microbatch_size and
#   expert_parallel_degree (no expert_tensor_parallel_degree: EP borrows the FSDP and TP ranks).
# - torchtitan/trainer.py: Trainer.Config.__post_init__ requires local_batch_size divisible by
#   pipeline_parallel_microbatch_size with pp > 1, and _validate_cuda_graphs refuses pp > 1
#   without --training.disable_cuda_graphs; activation_checkpoint is
#   ActivationCheckpointingConfig.
# - torchtitan/distributed/activation_checkpoint.py: a tyro subcommand union
#   selective | full | memory-budget | none (--activation_checkpoint.mode is gone).
# - torchtitan/hf_datasets/text_datasets.py: HuggingFaceTextDataLoader.Config.dataset is a
#   command-line option (c4_test etc.; the grain loader that suppresses it came later, 1b04fc1c).
# - torchtitan/models/*/config_registry.py: llama3_8b/70b/405b, and the MoE configs of 2026-08
#   (qwen3_30b_a3b; deepseek_v3_671b in bf16, deepseek_v3_671b_float8 apart).
# Checked by torchtitan 0.3.0's own ConfigManager in tests/test_export_torchtitan_parser.py.
_COMMIT = "0b2a804dd374cbf3dca61151c2e2398876437736"
_AT = f"https://github.com/pytorch/torchtitan/blob/{_COMMIT}/"

TORCHTITAN_0_3_0 = OptionTable(
    framework="torchtitan",
    version="0.3.0",
    commit=_COMMIT,
    sources=("https://pypi.org/project/torchtitan/0.3.0/",) + tuple(_AT + f for f in (
        "torchtitan/config/configs.py", "torchtitan/trainer.py",
        "torchtitan/distributed/activation_checkpoint.py",
        "torchtitan/hf_datasets/text_datasets.py", "torchtitan/models/llama3/config_registry.py",
    )) + (_PIPELINING,),
    options=tuple(o for o in _titan_common("--") if "activation_checkpoint" not in o.name) + (
        _f("--training.disable_cuda_graphs"),
        Option(name=AC_SUBCOMMAND, type="str", choices=("selective", "full", "none")),
        Option(name="--module", type="str", choices=_modules(MOE_CONFIGS_2026_08)),
        Option(name="--config", type="str", choices=_configs(MOE_CONFIGS_2026_08)),
        _i("--parallelism.expert_parallel_degree"),
        _i("--parallelism.pipeline_parallel_layers_per_stage"),
        _i("--parallelism.pipeline_parallel_first_stage_less_layers", 0),
        _i("--parallelism.pipeline_parallel_last_stage_less_layers", 0),
        Option(name="--hf_assets_path", type="str"),
        Option(name="--dataloader.dataset", type="str", choices=DATASETS),
    ),
    rules=_titan_rules("--", "parallelism.pipeline_parallel_layers_per_stage") + (
        Rule(when=(), then="--hf_assets_path",
             why="llama3_8b/70b/405b read the tokenizer from ./assets/hf/Llama-3.1-<size>, "
                 "downloaded beforehand from the gated meta-llama repository"),
        Rule(when=(), then="--dataloader.dataset",
             why="llama3_8b/70b/405b set dataset c4: allenai/c4 streamed from the Hugging "
                 "Face Hub"),
        Rule(when=("--parallelism.pipeline_parallel_degree>1",),
             then="--training.disable_cuda_graphs",
             why="trainer.py Trainer.Config._validate_cuda_graphs: 'CUDA graphs do not support "
                 "pipeline parallelism yet. Set --training.disable_cuda_graphs.'"),
        Rule(when=("--parallelism.expert_parallel_degree>1",),
             then="--training.disable_cuda_graphs",
             why="trainer.py Trainer.Config._validate_cuda_graphs: 'CUDA graphs support only "
                 "expert parallel token dispatcher configurations without CPU "
                 "synchronization' (the registry's MoE configs use the all-to-all one)"),
    ),
)

EP_ONLY = ("2026-08", TORCHTITAN_0_3_0.version)
"""Versions whose expert mesh has no expert tensor parallelism and whose registry has the
2026-08 MoE configs."""
