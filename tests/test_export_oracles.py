"""The 16 kinds of plans, exported to every target and version and loaded by the framework's own
code where it installs on CPU (DeepSpeed's DeepSpeedConfig, megatron-core's TransformerConfig
and DistributedDataParallelConfig), else by the version's regenerated option table and validator
rules (Megatron-LM's training arguments, torchtitan). Each export is accepted as launched, or
refused by hetpar with a ConfigError naming a nearest plan that is itself accepted.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import re
import shlex
import tomllib
from types import SimpleNamespace

import pytest

from hetpar import catalog
from hetpar.errors import ConfigError, Infeasible
from hetpar.export import TARGETS, Export, checks, deepspeed_launch, export, torchtitan_check
from hetpar.export.options import VERSIONS
from hetpar.io import from_dict
from hetpar.specs.gpu import Precision
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import Plan
from hetpar.specs.stage import Replica, Stage, split_layers

LLAMA = catalog.load_model("llama3.1-8b")  # 32 layers
MIXTRAL = catalog.load_model("mixtral-8x7b")


def _explicit(stages: list[list[tuple[int, int, int]]], batches: list[int],
              groups: tuple[str, ...] = ("a100",), precision: Precision = "bf16") -> Plan:
    """Replicas of (first layer, end layer, tp) stages; stage i of a replica runs on node group
    groups[i % len(groups)]."""
    reps = tuple(
        Replica(stages=tuple(Stage(layers=(a, b), group=groups[i % len(groups)], tp=t)
                             for i, (a, b, t) in enumerate(row)),
                batch=batch, micro_batch=1)
        for row, batch in zip(stages, batches, strict=True)
    )
    return Plan(name="explicit", replicas=reps, precision=precision)


KINDS: dict[str, tuple[Plan, ModelSpec]] = {
    "uniform": (catalog.load_plan("tp=2,pp=2,dp=2,gbs=64"), LLAMA),
    "data-parallel": (catalog.load_plan("dp=8,gbs=64"), LLAMA),
    "interleaved": (catalog.load_plan("tp=2,pp=4,vpp=2,gbs=32,schedule=interleaved"), LLAMA),
    "uneven-split": (_explicit([[(0, 10, 2), (10, 20, 2), (20, 26, 2), (26, 32, 2)]] * 2,
                               [32, 32]), LLAMA),
    "zero1": (catalog.load_plan("tp=2,dp=4,gbs=64,zero=1"), LLAMA),
    "zero2": (catalog.load_plan("dp=8,gbs=64,zero=2"), LLAMA),
    "zero3": (catalog.load_plan("tp=2,dp=4,gbs=64,zero=3,sp=true"), LLAMA),
    "context-parallel": (catalog.load_plan("tp=2,cp=2,dp=2,gbs=16,sp=true"), LLAMA),
    "fp8": (catalog.load_plan("tp=2,dp=4,gbs=64,precision=fp8"), LLAMA),
    "moe": (catalog.load_plan("tp=2,pp=2,dp=2,gbs=64"), MIXTRAL),
    "ntp": (_explicit([[(0, 16, 4), (16, 32, 4)], [(0, 8, 2), (8, 16, 2), (16, 24, 2),
                                                   (24, 32, 2)]], [48, 16]), LLAMA),
    # V100 then A100 stages (the v100-a100 cluster's groups), per-stage TP, an uneven split;
    # fp16, the V100's tensor-core precision
    "mixed-gpu": (_explicit([[(0, 12, 8), (12, 32, 4)], [(0, 16, 4), (16, 32, 4)]],
                            [32, 32], groups=("v100", "a100"), precision="fp16"), LLAMA),
    "full-recompute": (catalog.load_plan("tp=4,pp=2,gbs=32,recompute=full"), LLAMA),
    "selective-sp": (catalog.load_plan("tp=4,pp=2,dp=2,gbs=64,mbs=2,sp=true,zero=1,"
                                       "recompute=selective"), LLAMA),
    "fp16-pipeline": (catalog.load_plan("pp=4,dp=2,gbs=64,precision=fp16"), LLAMA),
    "zero-bubble": (catalog.load_plan("pp=4,dp=2,gbs=64,schedule=zb-h1"), LLAMA),
}
CASES = [(k, t, v) for k in KINDS for t in TARGETS for v in sorted(VERSIONS[t])]


def test_sixteen_kinds() -> None:
    assert len(KINDS) == 16


# ------------------------------------------------------------------ the frameworks' own code


def deepspeed_oracle(e: Export, model: ModelSpec) -> None:
    """DeepSpeedConfig with a model-parallel unit of the exported DP size accepts the config,
    and every key written is one DeepSpeed reads (it ignores unknown top-level keys)."""
    ds_config = pytest.importorskip("deepspeed.runtime.config", reason="DeepSpeed is not installed")
    cfg = json.loads(e.files[0][1])
    dp = e.plan.dp

    class Mpu:  # what DeepSpeedConfig asks of Megatron-style model-parallel units
        def get_data_parallel_world_size(self) -> int:
            return dp

    get_rank = ds_config.dist.get_rank
    ds_config.dist.get_rank = lambda *a, **k: 0  # no process group on a CPU test machine
    try:
        parsed = ds_config.DeepSpeedConfig(dict(cfg), mpu=Mpu())
    finally:
        ds_config.dist.get_rank = get_rank
    assert parsed.train_batch_size == e.plan.batch
    assert parsed.zero_optimization_stage == e.plan.zero
    assert parsed.gradient_accumulation_steps * dp * parsed.train_micro_batch_size_per_gpu == (
        e.plan.batch)
    read = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
            "zero_optimization", "bf16", "fp16", "tensor_parallel", "activation_checkpointing",
            "tensorboard"}
    assert set(cfg) <= read
    assert deepspeed_launch.launcher_pp(e.files[1][1]) == e.plan.pp
    specs = deepspeed_train_oracle(e, model)
    if e.plan.pp > 1:
        assert deepspeed_split(e.files[1][1], specs) == [
            b - a for a, b in split_layers(model.n_layers, e.plan.pp)]


def deepspeed_train_oracle(e: Export, model: ModelSpec) -> list[object]:
    """The train script the launcher runs: hetpar's module (its own argument parser reads the
    launcher's arguments, the model file beside the config is the exported model; its
    PipelineModule layers are returned), or the contract's train.py when the header says why
    hetpar's cannot run the plan (then the contract's layers: embedding, n_layers x
    TransformerLayer, norm, head)."""
    script = e.files[1][1]
    launch = next(ln for ln in script.splitlines() if ln.startswith("deepspeed "))
    words = shlex.split(launch)[:-1]  # without "$@"
    if "--module" not in words:
        assert "train.py" in words and "cannot run this plan" in script, script
        assert deepspeed_launch.script_gap(model, e.plan.tp)

        class Embedding: ...
        class TransformerLayer: ...  # the class name the contract in docs/exports.md asks for
        class Norm: ...
        class Head: ...

        return [Embedding, *[TransformerLayer] * model.n_layers, Norm, Head]
    pytest.importorskip("torch", reason="the runtime extra: pip install -e .[runtime]")
    # hetpar's own modules: a broken import fails, it is no skip
    train = importlib.import_module("hetpar.runtime.deepspeed_train")
    modules = importlib.import_module("hetpar.runtime.deepspeed_modules")
    module = words.index("--module")
    assert words[module + 1] == deepspeed_launch.MODULE
    assert not deepspeed_launch.script_gap(model, e.plan.tp)
    args = train.arguments(words[module + 2:])
    model_name, model_text = e.files[2]
    assert (args.deepspeed, args.deepspeed_config, args.model) == (
        True, e.files[0][0], model_name)
    assert args.pipeline_parallel_size == e.plan.pp
    assert from_dict(ModelSpec, tomllib.loads(model_text), model_name) == model
    return list(modules.layer_specs(model, seed=0))


def deepspeed_split(script: str, specs: list[object]) -> list[int]:
    """Transformer layers per stage as DeepSpeed's PipelineModule partitions the train
    script's layers by the launcher's --partition-method: its own _find_layer_type regex and
    partition_balanced (deepspeed/runtime/pipe/module.py::_partition_layers, 'type:' branch)."""
    pipe = pytest.importorskip("deepspeed.runtime.pipe.module", reason="DeepSpeed is not installed")
    ds_utils = pytest.importorskip("deepspeed.runtime.utils", reason="DeepSpeed is not installed")
    m = re.search(r"--partition-method type:(\S+)", script)
    assert m, script
    pp = deepspeed_launch.launcher_pp(script)
    weights = [0] * len(specs)
    for i in pipe.PipelineModule._find_layer_type(SimpleNamespace(_layer_specs=specs),
                                                  m.group(1)):
        weights[i] = 1
    parts = ds_utils.partition_balanced(weights=weights, num_parts=pp)
    return [sum(weights[parts[s]:parts[s + 1]]) for s in range(pp)]


def torchtitan_oracle(e: Export, model: ModelSpec) -> None:
    """torchtitan's own ConfigManager (the release the Makefile installs, 0.3.0) parses the
    launch script of its own form: the registry config, tyro's overrides and Trainer.Config's
    validators; the degrees, batches and policy it reads are the exported plan's."""
    if torchtitan_check.installed() is None:
        pytest.skip("torchtitan is not installed (the Makefile installs torchtitan==0.3.0)")
    if torchtitan_check.installed() != e.version:
        return  # another release's form: checked by the option table above only
    cfg, _ = torchtitan_check.parse(e.files[0][1])
    plan, par, tr = e.plan, cfg.parallelism, cfg.training
    assert (par.tensor_parallel_degree, par.pipeline_parallel_degree,
            par.context_parallel_degree) == (plan.tp, plan.pp, plan.cp)
    assert par.data_parallel_replicate_degree * par.data_parallel_shard_degree == plan.dp
    assert (tr.global_batch_size, tr.seq_len) == (plan.batch, model.seq_len)
    if plan.pp > 1:
        assert tr.local_batch_size == plan.batch // plan.dp
        assert par.pipeline_parallel_microbatch_size == plan.micro_batch
        assert par.pipeline_parallel_layers_per_stage * plan.pp * plan.vpp == model.n_layers
    else:
        assert tr.local_batch_size == plan.micro_batch
    ac = type(cfg.activation_checkpoint).__qualname__.split(".")[0]
    assert ac == {"full": "FullAC", "selective": "SelectiveAC", "none": "NoneType"}[
        plan.recompute]


def megatron_oracle(e: Export, model: ModelSpec) -> None:
    """megatron-core's TransformerConfig and DistributedDataParallelConfig accept the degrees
    and model shape, built from the arguments by the export's own mapping
    (``hetpar.export.checks``, as core_transformer_config_from_args does)."""
    torch = pytest.importorskip("torch", reason="the runtime extra: pip install -e .[runtime]")
    tc = pytest.importorskip("megatron.core.transformer.transformer_config",
                             reason="the oracle extra: Megatron-Core")
    ddp = pytest.importorskip("megatron.core.distributed", reason="the oracle extra: Megatron-Core")
    o = e.options
    kw = checks.transformer_kwargs(o, torch)  # the export's own mapping, as --check runs it
    if "--num-layers-per-virtual-pipeline-stage" in o:
        pp = int(str(o["--pipeline-model-parallel-size"]))
        per = int(str(o["--num-layers-per-virtual-pipeline-stage"]))
        # validate_args: the layers per pipeline stage must split into virtual stages
        assert model.n_layers % pp == 0 and (model.n_layers // pp) % per == 0
        assert kw["virtual_pipeline_model_parallel_size"] == model.n_layers // (pp * per)
    fields = {f.name for f in dataclasses.fields(tc.TransformerConfig)}
    assert set(kw) <= fields
    tc.TransformerConfig(**kw)
    ddp.DistributedDataParallelConfig(**checks.ddp_kwargs(o))


def accepted_elsewhere(msg: str, plan: Plan, model: ModelSpec, refused_by: str) -> list[str]:
    """The targets a one-line refusal of ``model`` names as exporting this very plan ('this
    plan exports with --to X or --to Y'): each must accept it as launched (option table and
    rules, then the framework's own code where it installs), and every other registered
    target must refuse it or break its rules. Returns the named targets."""
    assert "\n" not in msg, msg
    m = re.search(r"; this plan exports with (.+)$", msg)
    assert m, msg
    named = re.findall(r"--to (\S+)", m.group(1))
    assert named and refused_by not in named, msg
    for target in named:
        e = export(plan, model, target)
        assert e.problems() == [], (target, e.problems())
        if target == "deepspeed":
            deepspeed_oracle(e, model)
        elif target == "megatron":
            megatron_oracle(e, model)
    for target in set(TARGETS) - set(named) - {refused_by}:
        try:
            assert export(plan, model, target).problems(), target
        except (ConfigError, Infeasible):
            pass
    return named


# ------------------------------------------------------------------ the test


@pytest.mark.parametrize(("kind", "target", "version"), CASES)
def test_exports_accepted_as_launched_or_refused_with_nearest(
    kind: str, target: str, version: str
) -> None:
    plan, model = KINDS[kind]
    try:
        e = export(plan, model, target, version=version)
    except ConfigError as err:  # refused by hetpar itself: the nearest plan must export
        if f"model {model.name!r}" in str(err):  # no plan of this model has a form there
            assert (kind, target) == ("moe", "torchtitan"), err
            assert accepted_elsewhere(str(err), plan, model, target)
            return
        m = re.search(r"nearest plan: (\S+)", str(err))
        assert m and m.group(1) != "none", err
        e = export(catalog.load_plan(m.group(1)), model, target, version=version)
    assert e.problems() == []  # the version's option table and validator rules
    # the framework commit the version's table was regenerated from is in the launch files
    assert any(f"(commit {VERSIONS[target][version].commit})" in text for _, text in e.files)
    if target == "deepspeed":
        deepspeed_oracle(e, model)
    elif target == "megatron":
        megatron_oracle(e, model)
    elif target == "torchtitan":
        torchtitan_oracle(e, model)


def test_deepspeed_partitions_as_hetpar_splits_when_pp_does_not_divide() -> None:
    """The exported pipeline statement gives hetpar's even split (earlier stages take the
    extra layers) by DeepSpeed's own partitioning, whether or not pp divides the layers."""
    for n_layers in range(2, 41):
        model = dataclasses.replace(LLAMA, n_layers=n_layers)
        for pp in range(2, min(n_layers, 8) + 1):
            e = export(catalog.load_plan(f"pp={pp},gbs={pp}"), model, "deepspeed")
            assert e.plan.pp == pp and e.problems() == []
            assert deepspeed_split(e.files[1][1], deepspeed_train_oracle(e, model)) == [
                b - a for a, b in split_layers(n_layers, pp)], (n_layers, pp)
