"""Megatron-LM's option table (pretrain_gpt.py arguments and validate_args rules of a cited
commit) and its names for hetpar's pipeline schedules."""

from __future__ import annotations

from hetpar.export.schema import Option, OptionTable, Rule
from hetpar.export.schema import flag_option as _f
from hetpar.export.schema import int_option as _i
from hetpar.export.target import ScheduleNames

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
        _i("--num-distributed-optimizer-instances"),
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
        _i("--make-vocab-size-divisible-by"),
        _f("--mock-data"),
        Option(name="--data-path", type="str"),
        _f("--swiglu"),
        _f("--squared-relu"),
        Option(name="--rotary-percent", type="float"),
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
        _i("--expert-model-parallel-size"),
        _i("--expert-tensor-parallel-size"),
        _i("--moe-router-topk"),
        # arguments.py::moe_freq_type: an integer k or a Python list of 0/1 flags per layer
        Option(name="--moe-layer-freq", type="str"),
        # _add_moe_args: the routed experts' width (default ffn_hidden_size) and the shared
        # expert's; --moe-shared-expert-overlap is listed (a user may add it) but not written
        _i("--moe-ffn-hidden-size"),
        _i("--moe-shared-expert-intermediate-size"),
        _f("--moe-shared-expert-overlap"),
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
        Rule(when=("--moe-ffn-hidden-size",), then="--num-experts",
             why="TransformerConfig: 'moe_ffn_hidden_size must be None when num_experts is not "
                 "set'"),
        Rule(when=("--moe-shared-expert-intermediate-size",), then="--num-experts",
             why="the shared expert belongs to the MoE layer: a dense model builds none"),
        Rule(when=("--moe-shared-expert-overlap",), then="--moe-shared-expert-intermediate-size",
             why="_add_moe_args: 'Only effective when moe-shared-expert-intermediate-size is "
                 "set'"),
        Rule(when=("--num-distributed-optimizer-instances>1",),
             then="--use-distributed-optimizer",
             why="DistributedDataParallelConfig.num_distributed_optimizer_instances shards "
                 "the distributed optimizer inside each instance (reduce-scatter inside, "
                 "all-reduce across: param_and_grad_buffer.py); without it nothing is sharded"),
        Rule(when=("--num-distributed-optimizer-instances>1",), then="!--use-megatron-fsdp",
             why="partial DistOpt shards Megatron's own DDP buffers (param_and_grad_buffer.py); "
                 "hetpar does not export it with Megatron-FSDP"),
        Rule(when=("--use-megatron-fsdp",), then="--use-distributed-optimizer",
             why="Megatron-FSDP shards through the distributed optimizer"),
    ),
)

SCHEDULES = ScheduleNames(
    label="Megatron-LM",
    # megatron/core/pipeline_parallel/schedules.py: the pipeline function get_forward_backward_func
    # picks (interleaving iff virtual pipeline stages are given)
    by_name={
        "1f1b": "forward_backward_pipelining_without_interleaving",
        "interleaved": "forward_backward_pipelining_with_interleaving",
    },
)
