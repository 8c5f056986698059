"""torchtitan 0.3.0, the release on PyPI: the 2026-02 batch options with 2026-08's
activation-checkpointing subcommands, CUDA-graph rule and expert options."""

from __future__ import annotations

from hetpar.export.schema import Option, OptionTable, Rule
from hetpar.export.torchtitan_options import (
    _PIPELINING,
    CUDA_GRAPH_RULES,
    DATASETS,
    HF_ASSETS_RULE,
    SUBCOMMAND_OPTIONS,
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
    options=tuple(o for o in _titan_common("--") if "activation_checkpoint" not in o.name)
    + SUBCOMMAND_OPTIONS + (Option(name="--dataloader.dataset", type="str", choices=DATASETS),),
    rules=_titan_rules("--", "parallelism.pipeline_parallel_layers_per_stage") + (
        HF_ASSETS_RULE,
        Rule(when=(), then="--dataloader.dataset",
             why="llama3_8b/70b/405b set dataset c4: allenai/c4 streamed from the Hugging "
                 "Face Hub"),
    ) + CUDA_GRAPH_RULES,
)

EP_ONLY = ("2026-08", TORCHTITAN_0_3_0.version)
"""Versions whose expert mesh has no expert tensor parallelism and whose registry has the
2026-08 MoE configs."""
