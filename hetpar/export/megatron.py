"""The Megatron-LM export target: pretrain_gpt.py command-line arguments in a torchrun launch
script, and parsing them back."""

from __future__ import annotations

from dataclasses import replace

from hetpar import schedules
from hetpar.errors import ConfigError
from hetpar.export import checks, hybrid
from hetpar.export.megatron_launch import (
    SCRIPT,
    first_last,
    layer_sizes,
    options_of,
    parse,
    script,
    split_script,
)
from hetpar.export.megatron_model import model_arguments, model_losses, vocab_note
from hetpar.export.megatron_options import MEGATRON, SCHEDULES
from hetpar.export.nearest import common, even_tp, launch_shape
from hetpar.export.schema import OptionTable
from hetpar.export.target import Export, Target, header, register
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import Plan

__all__ = ["SCRIPT", "TARGET", "arguments", "launch_env", "nearest", "options_of", "parse",
           "script", "split_script"]

# hetpar ZeRO stage -> Megatron flags: stage 1 is the distributed optimizer; 2 and 3 are
# Megatron-FSDP sharding strategies (docs: user-guide/features/megatron_fsdp.html).
ZERO_FLAGS = {
    0: [],
    1: ["--use-distributed-optimizer"],
    2: [
        "--use-distributed-optimizer",
        "--use-megatron-fsdp",
        "--data-parallel-sharding-strategy",
        "optim_grads",
    ],
    3: [
        "--use-distributed-optimizer",
        "--use-megatron-fsdp",
        "--data-parallel-sharding-strategy",
        "optim_grads_params",
    ],
}


def nearest(plan: Plan, model: ModelSpec) -> tuple[Plan, list[str]]:
    """The nearest plan Megatron-LM can run, and what was lost on the way."""
    plan, lost = common(plan, model, carries=EXPERT_AXES, label=SCHEDULES.label)
    plan, more = SCHEDULES.keep_or_default(plan)
    lost += more
    if plan.vpp > 1 and model.n_layers % (plan.pp * plan.vpp):
        lost.append(
            f"interleaving needs {model.n_layers} layers divisible by pp*vpp="
            f"{plan.pp * plan.vpp} -> 1f1b, vpp=1"
        )
        plan = replace(plan, schedule=schedules.DEFAULT, vpp=1)
    if plan.precision == "tf32":
        lost.append("precision tf32 has no Megatron flag -> fp32")
        plan = replace(plan, precision="fp32")
    if plan.vpp == 1 and first_last(model.n_layers, plan.pp) is None:
        lost.append(
            f"hetpar's layer split {layer_sizes(model.n_layers, plan.pp)} has no Megatron "
            "form (only the first and last stage may differ); the first stage takes "
            "the remainder"
        )
    return plan, lost



def arguments(plan: Plan, model: ModelSpec) -> list[str]:
    """pretrain_gpt.py arguments for a plan already made expressible by ``nearest``."""
    a = [
        "--tensor-model-parallel-size",
        str(plan.tp),
        "--pipeline-model-parallel-size",
        str(plan.pp),
        "--context-parallel-size",
        str(plan.cp),
    ]
    if plan.vpp > 1:
        a += [
            "--num-layers-per-virtual-pipeline-stage",
            str(model.n_layers // (plan.pp * plan.vpp)),
        ]
    elif plan.pp > 1:
        fl = first_last(model.n_layers, plan.pp)
        first, last = (
            fl
            if fl is not None
            else (model.n_layers - (plan.pp - 1) * (model.n_layers // plan.pp), None)
        )
        a += ["--decoder-first-pipeline-num-layers", str(first)] if first is not None else []
        a += ["--decoder-last-pipeline-num-layers", str(last)] if last is not None else []
    a += expert_arguments(plan)
    a += ["--micro-batch-size", str(plan.micro_batch), "--global-batch-size", str(plan.batch)]
    a += ["--sequence-parallel"] if plan.sequence_parallel else []
    if plan.recompute == "selective":
        a += ["--recompute-granularity", "selective"]
    elif plan.recompute == "full":
        a += [
            "--recompute-granularity",
            "full",
            "--recompute-method",
            "uniform",
            "--recompute-num-layers",
            "1",
        ]
    a += ZERO_FLAGS[plan.zero]
    a += {"bf16": ["--bf16"], "fp16": ["--fp16"], "fp8": ["--bf16", "--fp8-format", "hybrid"]}.get(
        plan.precision, []
    )
    if plan.zero >= 2:  # validate_args: Megatron-FSDP saves only this checkpoint format
        a += ["--ckpt-format", "fsdp_dtensor"]
    # a benchmark run as launched: mock data, a tokenizer that downloads nothing (NullTokenizer
    # reads --vocab-size), and the iteration count and learning rate pretrain_gpt.py needs
    a += ["--mock-data", "--tokenizer-type", "NullTokenizer", "--train-iters", "100", "--lr",
          "3e-4"]
    return a + model_arguments(model)


EXPERT_AXES = ("ep", "etp")
"""The plan-scope axes Megatron-LM's export writes."""


def expert_arguments(plan: Plan) -> list[str]:
    """EP and ETP as Megatron-LM's _add_moe_args options (``--expert-model-parallel-size``,
    ``--expert-tensor-parallel-size``, whose default None means tp); etp is written whenever
    ep > 1, since hetpar's etp = 1 there is not Megatron's default."""
    ep, etp = plan.degree("ep"), plan.degree("etp")
    if ep == 1:
        return []
    return ["--expert-model-parallel-size", str(ep), "--expert-tensor-parallel-size", str(etp)]


def hybrid_arguments(plan: Plan, replicate: int) -> list[str]:
    """Hybrid sharding as Megatron-LM's partial distributed optimizer: the DP ranks cut into
    ``replicate`` contiguous groups that each shard the optimizer, the groups all-reducing
    the gradients across (megatron-core 0.16.1 ``parallel_state.initialize_model_parallel``:
    ``intra_partial_data_parallel_size = dp * cp // num_distributed_optimizer_instances``).
    ZeRO-1 only: ZeRO-2/3 is Megatron-FSDP here, whose hybrid form is not exported."""
    if replicate == 1:
        return []
    if plan.zero != 1:
        what = f"{hybrid.FIELD} with zero_scope" if hybrid.hierarchical(plan) else \
            "plan.zero_scope"
        raise ConfigError(
            f"export: {what} = 'group' (hybrid sharding) and zero = {plan.zero} has no "
            "Megatron-LM option: --num-distributed-optimizer-instances "
            "partitions the distributed optimizer (ZeRO-1), not Megatron-FSDP; nearest plan: "
            "zero = 1")
    return ["--num-distributed-optimizer-instances", str(replicate)]


def launch_env(plan: Plan) -> dict[str, str | None]:
    """Environment the launch script sets (None: unset), per megatron_options.MEGATRON's rules.

    TP or CP needs CUDA_DEVICE_MAX_CONNECTIONS=1 before Blackwell (harmless after it);
    Megatron-FSDP (zero >= 2) refuses 1, so the variable is unset.
    """
    if plan.zero >= 2:
        return {"CUDA_DEVICE_MAX_CONNECTIONS": None}
    if plan.tp > 1 or plan.cp > 1:
        return {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    return {}



def write(plan: Plan, model: ModelSpec, *, table: OptionTable, per_node: int | None,
          config_name: str, replicate: int = 1) -> Export:
    """The launch script ``megatron_args.sh`` (``config_name`` is not used: one file);
    ``replicate`` > 1: that many distributed-optimizer instances (``export/hybrid.py``)."""
    even_tp(plan, model)
    near, lost = nearest(plan, model)
    lost += model_losses(model)  # Megatron has expert options: no MoE loss
    argv = arguments(near, model) + hybrid_arguments(near, replicate)
    env = launch_env(near)
    nodes, per = launch_shape(near.num_gpus(), per_node)
    text = script(argv, nodes, per, [*header(table, plan, model, lost),
                                     vocab_note(model, near.tp)], env)
    return Export(
        target="megatron",
        plan=near,
        warnings=tuple(lost),
        files=(("megatron_args.sh", text),),
        options=options_of(argv),
        version=table.version,
        env=env,
    )


TARGET = register(Target(
    name="megatron", help="pretrain_gpt.py arguments in a torchrun launch script",
    hybrid="--num-distributed-optimizer-instances",
    tables=(MEGATRON,), schedules=SCHEDULES, write=write, parse=parse, check=checks.megatron,
))
