"""DeepSpeed's option table (ds_config keys, launcher and train.py-contract arguments) and its
name for hetpar's pipeline schedules."""

from __future__ import annotations

from hetpar.export.schema import Option, OptionTable, Rule
from hetpar.export.schema import flag_option as _f
from hetpar.export.schema import int_option as _i
from hetpar.export.target import ScheduleNames

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
        # `deepspeed --module M`: run the train script as `python -m M` (launcher/runner.py)
        _f("--module"),
        _f("--deepspeed"),
        Option(name="--deepspeed_config", type="str"),
        # hetpar.runtime.deepspeed_train's model file (hetpar's own train script)
        Option(name="--model", type="str"),
        # arguments of the train.py contract (docs/exports.md): PipelineModule's own
        _i("--pipeline-parallel-size"),
        Option(name="--partition-method", type="str"),
        _i("--activation-checkpoint-interval", 0),
        # the train.py contract's expert arguments (deepspeed.moe.layer.MoE's ep_size and
        # enable_expert_tensor_parallelism are model-code arguments, not ds_config keys)
        _i("--ep-size"),
        _f("--expert-tensor-parallel"),
    ),
    rules=(
        Rule(when=("--pipeline-parallel-size>1",), then="--partition-method",
             why="PipelineModule's partition_method decides the split ('parameters' by default)"),
    ),
)

SCHEDULES = ScheduleNames(
    label="DeepSpeed",
    # PipelineEngine runs one schedule, TrainSchedule (deepspeed/runtime/pipe/schedule.py):
    # one forward, one backward per step on one chunk per rank, i.e. any lock-step schedule
    by_traits=lambda t: "TrainSchedule" if t.lockstep else None,
)
