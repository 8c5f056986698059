"""``hetpar export --check``: an export read by the installed framework's own code, or "not
checked" saying why (the framework is not importable, or has no parser hetpar can call)."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import json
from types import ModuleType
from typing import Any

from hetpar.export.target import Check, Export


def _module(name: str) -> ModuleType | None:
    """``name`` imported, or None when it is not installed (no half-imported framework)."""
    try:
        if importlib.util.find_spec(name.split(".")[0]) is None:
            return None
        return importlib.import_module(name)
    except ImportError:
        return None


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "(version unknown)"


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".rstrip(": ")


def deepspeed(e: Export) -> Check:
    """DeepSpeed's ``DeepSpeedConfig`` (deepspeed/runtime/config.py) on the ds_config JSON, with
    a model-parallel unit of the exported data-parallel size (its batch arithmetic needs it)."""
    ds = _module("deepspeed.runtime.config")
    if ds is None:
        return Check(accepted=None, message="not checked: DeepSpeed is not installed "
                     "(pip install deepspeed)")
    dp = e.plan.dp

    class Mpu:  # what DeepSpeedConfig asks of a Megatron-style model-parallel unit
        def get_data_parallel_world_size(self) -> int:
            return dp

    where = f"DeepSpeed {_version('deepspeed')} DeepSpeedConfig"
    get_rank = ds.dist.get_rank
    ds.dist.get_rank = lambda *a, **k: 0  # no process group exists outside a launched job
    try:
        ds.DeepSpeedConfig(json.loads(e.files[0][1]), mpu=Mpu())
    except Exception as err:  # the framework's own refusal, whatever its type
        return Check(accepted=False, message=f"{where} refused it: {_first_line(err)}")
    finally:
        ds.dist.get_rank = get_rank
    return Check(accepted=True, message=f"accepted by {where}")


def megatron(e: Export) -> Check:
    """megatron-core's ``TransformerConfig`` and ``DistributedDataParallelConfig`` (the part of
    Megatron-LM on PyPI) built from the arguments as Megatron-LM's
    core_transformer_config_from_args does; Megatron-LM's own argument parser
    (megatron.training.arguments) is not on PyPI, and its arguments are checked by hetpar's
    option table only."""
    tc = _module("megatron.core.transformer.transformer_config")
    ddp = _module("megatron.core.distributed")
    if tc is None or ddp is None:
        return Check(accepted=None, message="not checked: megatron-core is not installed "
                     "(pip install megatron-core); Megatron-LM's parser is not on PyPI")
    where = (f"megatron-core {_version('megatron-core')} TransformerConfig and "
             "DistributedDataParallelConfig (Megatron-LM's argument parser not run)")
    o = e.options
    try:
        tc.TransformerConfig(**transformer_kwargs(o, tc.torch))
        ddp.DistributedDataParallelConfig(**ddp_kwargs(o))
    except Exception as err:  # the framework's own refusal, whatever its type
        return Check(accepted=False, message=f"{where} refused it: {_first_line(err)}")
    return Check(accepted=True, message=f"accepted by {where}")


def ddp_kwargs(o: dict[str, object]) -> dict[str, object]:
    """DistributedDataParallelConfig's fields from Megatron-LM's arguments (Megatron-LM
    megatron/training/training.py::get_model builds it from the same names)."""
    return {
        "use_distributed_optimizer": "--use-distributed-optimizer" in o,
        "use_megatron_fsdp": "--use-megatron-fsdp" in o,
        "data_parallel_sharding_strategy": str(o.get("--data-parallel-sharding-strategy",
                                                     "no_shard")),
        "num_distributed_optimizer_instances": int(str(
            o.get("--num-distributed-optimizer-instances", 1))),
    }


def transformer_kwargs(o: dict[str, object], torch: Any) -> dict[str, object]:
    """TransformerConfig's fields from Megatron-LM's arguments (Megatron-LM
    megatron/training/arguments.py::core_transformer_config_from_args maps each by name); the
    one mapping, which the oracle tests call too. ``torch``: the module megatron-core imported
    (the dtypes)."""
    pp = int(str(o["--pipeline-model-parallel-size"]))
    dtype = torch.bfloat16 if "--bf16" in o else torch.float16 if "--fp16" in o else \
        torch.float32
    kw: dict[str, object] = {
        "num_layers": o["--num-layers"], "hidden_size": o["--hidden-size"],
        "ffn_hidden_size": o["--ffn-hidden-size"],
        "num_attention_heads": o["--num-attention-heads"],
        "num_query_groups": o.get("--num-query-groups"),
        "tensor_model_parallel_size": o["--tensor-model-parallel-size"],
        "pipeline_model_parallel_size": pp,
        "context_parallel_size": o["--context-parallel-size"],
        "sequence_parallel": "--sequence-parallel" in o,
        "bf16": "--bf16" in o, "fp16": "--fp16" in o, "params_dtype": dtype,
        "pipeline_dtype": dtype if pp > 1 else None, "fp8": o.get("--fp8-format"),
        "gated_linear_unit": "--swiglu" in o,
        "add_bias_linear": "--disable-bias-linear" not in o,
        "normalization": o["--normalization"],
        "recompute_granularity": o.get("--recompute-granularity"),
        "recompute_method": o.get("--recompute-method"),
        "recompute_num_layers": o.get("--recompute-num-layers"),
        "num_layers_in_first_pipeline_stage": o.get("--decoder-first-pipeline-num-layers"),
        "num_layers_in_last_pipeline_stage": o.get("--decoder-last-pipeline-num-layers"),
        "num_moe_experts": o.get("--num-experts"),
        "moe_router_topk": o.get("--moe-router-topk", 2),
    }
    if "--num-layers-per-virtual-pipeline-stage" in o:
        per = int(str(o["--num-layers-per-virtual-pipeline-stage"]))
        kw["virtual_pipeline_model_parallel_size"] = int(str(o["--num-layers"])) // (pp * per)
    if kw["num_moe_experts"] is not None:  # the experts default to --ffn-hidden-size wide
        kw["moe_ffn_hidden_size"] = o.get("--moe-ffn-hidden-size", o["--ffn-hidden-size"])
        kw["moe_shared_expert_intermediate_size"] = o.get(
            "--moe-shared-expert-intermediate-size")
    return {k: v for k, v in kw.items() if v is not None or k == "fp8"}


def torchtitan(e: Export) -> Check:
    """torchtitan's own ConfigManager (``export/torchtitan_check.py``) when the installed
    release is the export's version; otherwise hetpar's option table only."""
    from hetpar.export import torchtitan_check  # imports torchtitan only when installed
    return torchtitan_check.check(e)
