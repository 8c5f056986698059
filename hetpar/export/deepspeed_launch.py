"""The DeepSpeed export's launcher: the train.py contract's arguments (pipeline, experts),
hetpar's own train module where it can run the plan, and reading a launcher back."""

from __future__ import annotations

import re
import shlex
from dataclasses import replace

from hetpar import feasibility
from hetpar.errors import ConfigError
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import Plan

# The train.py contract (docs/exports.md): it builds the model as a PipelineModule(layers,
# num_stages=--pipeline-parallel-size, partition_method=--partition-method,
# activation_checkpoint_interval=...) when pp > 1, and calls deepspeed.initialize with the
# config. DeepSpeed reads no pipeline split from ds_config; "type:TransformerLayer" counts
# only the transformer layers (ds_utils.partition_balanced on 0/1 weights, which minimises
# the largest minus the smallest stage and, on ties, gives the earlier stages the extra
# layers): hetpar's split_layers, including when pp does not divide the layers (checked
# against DeepSpeed 0.19.8's own code in tests/test_export_oracles.py).
PARTITION = "type:TransformerLayer"

EXPERT_AXES = ("ep", "etp")
"""The plan-scope axes the DeepSpeed export carries: not in ds_config (DeepSpeed's
``deepspeed.moe.layer.MoE(..., ep_size, enable_expert_tensor_parallelism)`` takes them in
the model code) but as train.py-contract arguments, ``--ep-size`` and
``--expert-tensor-parallel``, and a launcher note."""


def expert_arguments(plan: Plan) -> list[str]:
    """train.py's expert arguments (none when ep = 1): the MoE layers' ``ep_size`` and, with
    etp = tp > 1, ``enable_expert_tensor_parallelism``."""
    if plan.degree("ep") == 1:
        return []
    return ["--ep-size", str(plan.degree("ep"))] + (
        ["--expert-tensor-parallel"] if plan.degree("etp") > 1 else [])


def expert_note(plan: Plan, model: ModelSpec) -> list[str]:
    """The launcher's note on how train.py builds the experts (deepspeed/moe/layer.py MoE's
    signature at 0.19.8; its experts' optimizer groups, deepspeed/moe/utils.py)."""
    if plan.degree("ep") == 1:
        return []
    return [f"expert parallelism: train.py builds each MoE layer as deepspeed.moe.layer.MoE("
            f"hidden_size={model.hidden}, expert=<its FFN>, num_experts={model.n_experts}, "
            f"ep_size={plan.degree('ep')}, k={model.experts_per_token}, "
            f"enable_expert_tensor_parallelism={plan.degree('etp') > 1}) from --ep-size and "
            "--expert-tensor-parallel (ep_size is a model argument, not a ds_config key), and "
            "passes deepspeed.initialize the parameters split by deepspeed.moe.utils."
            "split_params_into_different_moe_groups_for_optimizer"]


MODULE = "hetpar.runtime.deepspeed_train"
"""The train.py hetpar ships (``deepspeed --module``): dense decoders, with hetpar's own
tensor parallelism (not AutoTP) when tp > 1."""


def tp_gap(model: ModelSpec, tp: int) -> str:
    """Why hetpar's train module cannot shard ``model`` over ``tp`` ranks ('' when it can):
    its Megatron split (runtime/model.py::param_infos) cuts whole heads, KV heads, FFN units
    and, untied, vocabulary rows into equal parts (with or without a pipeline)."""
    if tp == 1:
        return ""
    shards = feasibility.tp_shards(model, tp)
    if not shards.ok:
        return shards.reason
    if not model.tied_embeddings and model.vocab % tp:
        # runtime/layout.py::check_tp: the vocabulary-parallel head does not pad
        return f"model vocab ({model.vocab}) not divisible by tp ({tp})"
    return ""


def script_gap(model: ModelSpec, tp: int) -> str:
    """Why hetpar's train module cannot run ``model`` at TP degree ``tp`` ('' when it can):
    it trains hetpar's runtime decoder, which has none of these."""
    gaps = [tp_gap(model, tp)] if tp_gap(model, tp) else []
    if model.n_experts > 1:  # `hetpar run` trains them (runtime/moe.py); untried under DeepSpeed
        gaps.append(f"mixture-of-experts layers (n_experts={model.n_experts})")
    gaps += feasibility.decoder_gaps(model)
    return "; ".join(gaps)


def model_file(config_file: str) -> str:
    """The model spec written beside ``ds_config.json`` for the train module."""
    return config_file.rsplit(".", 1)[0] + ".model.toml"


def launcher(nodes: int, per_node: int, config_file: str, plan: Plan,
             model: ModelSpec) -> list[str]:
    """`deepspeed` launcher argv, then train.py's arguments (model, pipeline shape, config):
    hetpar's train module when it can run the plan, else the contract's ``train.py``."""
    script = ["train.py"] if script_gap(model, plan.tp) else [
        "--module", MODULE, "--model", model_file(config_file)]
    argv = ["deepspeed", "--num_nodes", str(nodes), "--num_gpus", str(per_node), *script,
            "--deepspeed", "--deepspeed_config", config_file]
    if plan.pp > 1:
        argv += ["--pipeline-parallel-size", str(plan.pp), "--partition-method", PARTITION,
                 "--activation-checkpoint-interval", "1" if plan.recompute == "full" else "0"]
    elif plan.recompute == "full":  # the train module's non-pipeline model reads it too
        argv += ["--activation-checkpoint-interval", "1"]
    return argv + expert_arguments(plan)


def launcher_pp(script: str) -> int:
    """The pipeline depth the launcher passes to train.py (1 when it passes none)."""
    m = re.search(r"--pipeline-parallel-size (\d+)", script)
    return int(m.group(1)) if m else 1


def launcher_experts(plan: Plan, script: str) -> Plan:
    """``plan`` with the expert degrees the launcher passes to train.py (none: unchanged)."""
    line = next((ln for ln in script.splitlines() if ln.startswith("deepspeed ")), "")
    try:
        words = shlex.split(line)
    except ValueError as e:  # an unbalanced quote
        raise ConfigError(f"deepspeed: cannot read the launcher line: {e}") from None
    if "--ep-size" not in words[:-1]:
        return plan
    at = words.index("--ep-size") + 1
    if not words[at].isdigit():
        raise ConfigError(f"deepspeed: --ep-size {words[at]!r} in the launcher is not a degree")
    etp = plan.tp if "--expert-tensor-parallel" in words else 1
    return replace(plan, axes=(("ep", int(words[at])), ("etp", etp)))
