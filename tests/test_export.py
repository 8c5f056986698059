from __future__ import annotations

import argparse
import json
import re
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetpar import catalog
from hetpar.cli import export as export_cli
from hetpar.errors import ConfigError
from hetpar.export import TARGETS, Export, deepspeed, deepspeed_launch, export, megatron, parse
from hetpar.export.options import TABLES, VERSIONS, check
from hetpar.schedules import names as schedule_names
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import Plan
from hetpar.specs.stage import Replica, Stage, split_layers

LLAMA = catalog.load_model("llama3.1-8b")  # 32 layers


def model_with(layers: int) -> ModelSpec:
    return replace(LLAMA, n_layers=layers)


def explicit(tps: list[list[int]], batches: list[int], layers: int = 32, mb: int = 1) -> Plan:
    """Replicas with the given per-stage TP degrees and batches, on an even layer split."""
    reps = []
    for tp_row, batch in zip(tps, batches, strict=True):
        ranges = split_layers(layers, len(tp_row))
        pairs = zip(ranges, tp_row, strict=True)
        stages = tuple(Stage(layers=r, group="a100", tp=t) for r, t in pairs)
        reps.append(Replica(stages=stages, batch=batch, micro_batch=mb))
    return Plan(name="explicit", replicas=tuple(reps))


UNIFORM = [
    "tp=8,pp=4,dp=2,gbs=512,name=tp8pp4",
    "tp=8,pp=2,dp=4,gbs=256,sp=true,zero=3,recompute=selective,name=titan-like",
    "tp=2,dp=4,gbs=64,zero=2,recompute=full,name=zero2",
    "tp=4,pp=2,dp=2,gbs=64,mbs=2,zero=1,sp=true,recompute=selective",
    "tp=2,pp=4,vpp=2,dp=1,gbs=32,schedule=interleaved,recompute=full",
    "tp=2,dp=4,gbs=64,zero=3,precision=fp8",
    "pp=4,dp=2,gbs=64,schedule=zb-h1",
    "tp=2,cp=2,dp=2,gbs=16,sp=true,precision=fp16",
]
EXPLICIT = [
    explicit([[4, 4], [4, 4]], [32, 32]),  # expressible: two identical replicas
    explicit([[8, 4], [4, 4]], [32, 32]),  # per-stage TP degrees
    explicit([[4, 4], [2, 2, 2, 2]], [48, 16]),  # NTP replicas, uneven shares, depths
]


BIG = catalog.load_model("llama3.1-405b")  # 126 layers: room for any bundled plan's stages


def every_plan() -> list[tuple[Plan, ModelSpec]]:
    bundled = [(catalog.load_plan(n), BIG) for n in catalog.names("plans")]
    return bundled + [(catalog.load_plan(p), LLAMA) for p in UNIFORM] + [
        (p, LLAMA) for p in EXPLICIT
    ]


TARGET_VERSIONS = [(t, v) for t in TARGETS for v in sorted(VERSIONS[t])]


def export_checked(plan: Plan, model: ModelSpec, target: str, version: str | None = None
                   ) -> Export | None:
    """The export, accepted by the version's table and rules; or None when hetpar refuses it,
    in which case the refusal names a nearest plan that exports cleanly."""
    try:
        e = export(plan, model, target, version=version)
    except ConfigError as err:
        m = re.search(r"nearest plan: (\S+)", str(err))
        assert m, err
        if m.group(1) != "none":
            near = export(catalog.load_plan(m.group(1)), model, target, version=version)
            assert near.problems() == [], (str(err), near.problems())
        return None
    assert e.problems() == [], (plan, e.problems())
    return e


@pytest.mark.parametrize(("target", "version"), TARGET_VERSIONS)
def test_every_export_fits_the_option_table_and_round_trips(target: str, version: str) -> None:
    identical = 0
    for plan, model in every_plan():
        e = export_checked(plan, model, target, version)
        if e is None:
            continue
        assert e.version == version
        assert_round_trip(e, model)
        if plan.uniform and not e.warnings:
            assert e.plan == plan  # nothing lost: the import gives the very same plan
            identical += 1
        if plan.uniform and e.plan != plan:
            assert e.warnings  # every change to the plan is reported
    assert identical >= 1


def test_option_table_check_can_fail() -> None:
    table = TABLES["megatron"]
    ok = {"--tensor-model-parallel-size": 2, "--sequence-parallel": None,
          "--tokenizer-type": "NullTokenizer", "--train-iters": 10}
    assert check(table, ok, {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}) == []
    assert check(table, {"--tensor-model-parallel-size": 0})
    assert check(table, {"--recompute-granularity": "some"})
    assert check(table, {"--no-such-flag": None})
    assert check(TABLES["deepspeed"], {"zero_optimization.stage": 4})


plans = st.builds(
    lambda tp, pp, dp, cp, k, mb, sched, vpp, rc, zero, prec, sp, layers: Plan(
        tp=tp, pp=pp, dp=dp, cp=cp, micro_batch=mb, global_batch=dp * mb * k * pp,
        schedule=sched, vpp=vpp if sched == "interleaved" else 1, recompute=rc, zero=zero,
        precision=prec, sequence_parallel=sp,
    ),
    st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2, 3, 4]), st.integers(1, 4),
    st.sampled_from([1, 2]), st.integers(1, 4), st.sampled_from([1, 2]),
    st.sampled_from(schedule_names()), st.integers(2, 3),
    st.sampled_from(["none", "selective", "full"]), st.integers(0, 3),
    st.sampled_from(["fp32", "tf32", "bf16", "fp16", "fp8"]), st.booleans(), st.just(0),
)


def assert_round_trip(e: Export, model: ModelSpec) -> None:
    """Reading the export back gives the exported plan (Megatron: unless its split was lost)."""
    if e.target == "megatron" and any("no Megatron form" in w for w in e.warnings):
        with pytest.raises(ConfigError, match="even split"):
            parse(e.target, e.files[0][1], model)
    elif e.target == "deepspeed":  # the pipeline depth travels on the launcher line
        pp = deepspeed_launch.launcher_pp(e.files[1][1])
        assert deepspeed.parse(e.files[0][1], pp) == e.plan, e.warnings
    else:
        assert parse(e.target, e.files[0][1], model) == e.plan, e.warnings


@settings(max_examples=60, deadline=None)
@given(plans, st.integers(12, 40), st.sampled_from(TARGET_VERSIONS))
def test_random_uniform_plans(plan: Plan, layers: int, tv: tuple[str, str]) -> None:
    model = model_with(layers)
    e = export_checked(plan, model, *tv)
    if e is None:
        return
    assert_round_trip(e, model)
    if e.plan != plan:
        assert e.warnings
    if not e.warnings:
        assert e.plan == plan


def test_warnings_name_what_is_lost() -> None:
    ntp = export(EXPLICIT[2], LLAMA, "megatron")
    text = " ".join(ntp.warnings)
    for needle in ("per-stage TP degrees [2, 4]", "NTP", "uneven batch shares [48, 16]",
                   "pipeline depths"):
        assert needle in text
    assert ntp.plan.uniform and ntp.plan.dp == 2 and ntp.plan.global_batch == 64
    same = export(EXPLICIT[0], LLAMA, "megatron")
    assert same.warnings == () and same.plan.tp == 4 and same.plan.pp == 2 and same.plan.dp == 2
    gp = export(catalog.load_plan("pp=4,gbs=32,schedule=gpipe"), LLAMA, "megatron")
    assert "gpipe" in gp.warnings[0] and gp.plan.schedule == "1f1b"
    zb = export(catalog.load_plan("pp=4,gbs=32,schedule=zb-h1"), LLAMA, "torchtitan")
    assert any("zb-h1" in w for w in zb.warnings)
    il = export(catalog.load_plan("pp=4,vpp=2,gbs=32,schedule=interleaved"), LLAMA, "deepspeed")
    assert il.plan.vpp == 1 and any("interleaved" in w for w in il.warnings)


def test_megatron_warns_that_its_layernorms_have_biases() -> None:
    """Megatron's LayerNorm always holds a bias (core/fusions/fused_layer_norm.py), which
    --disable-bias-linear leaves: a bias-free LayerNorm (ntp-480b) is warned as lost."""
    plan = catalog.load_plan("tp=8,pp=4,gbs=64")
    ntp = catalog.load_model("ntp-480b")
    lost = "bias-free LayerNorms -> LayerNorms with biases"
    assert lost in export(plan, ntp, "megatron").warnings
    assert "--disable-bias-linear" in export(plan, ntp, "megatron").files[0][1]
    for kept in (replace(ntp, norm_bias=True), replace(ntp, bias=True), LLAMA):
        assert lost not in export(plan, kept, "megatron").warnings


def test_megatron_uneven_splits() -> None:
    # 33 layers on 4 stages = [9, 8, 8, 8]: the first-stage option expresses it exactly
    m33 = model_with(33)
    e = export(catalog.load_plan("pp=4,gbs=32"), m33, "megatron")
    assert e.warnings == ()
    assert e.options["--decoder-first-pipeline-num-layers"] == 9
    assert parse("megatron", e.files[0][1], m33) == e.plan
    # 35 layers = [9, 9, 9, 8]: first and last options, the middle stages get 9 each
    e = export(catalog.load_plan("pp=4,gbs=32"), model_with(35), "megatron")
    assert (e.options["--decoder-first-pipeline-num-layers"],
            e.options["--decoder-last-pipeline-num-layers"]) == (9, 8)
    # 30 layers on 4 = [8, 8, 7, 7]: no Megatron form, warned
    e = export(catalog.load_plan("pp=4,gbs=32"), model_with(30), "megatron")
    assert any("no Megatron form" in w for w in e.warnings)


def test_torchtitan_and_deepspeed_contents() -> None:
    plan = catalog.load_plan("tp=2,pp=2,vpp=2,dp=2,gbs=64,mbs=2,zero=3,schedule=interleaved")
    e = export(plan, LLAMA, "torchtitan", version="2025-07")
    cfg = tomllib.loads(e.files[0][1])
    par = cfg["parallelism"]
    assert par["pipeline_parallel_schedule"] == "Interleaved1F1B"
    assert par["pipeline_parallel_split_points"] == ["layers.8", "layers.16", "layers.24"]
    assert (par["data_parallel_shard_degree"], par["tensor_parallel_degree"]) == (2, 2)
    assert cfg["training"]["local_batch_size"] == 32
    # the last TOML version names the modules of each part; the 2025-07 key is unknown there
    par10 = tomllib.loads(export(plan, LLAMA, "torchtitan", version="2025-10").files[0][1])[
        "parallelism"]
    parts = par10["module_fqns_per_model_part"]
    assert parts[0][:2] == ["tok_embeddings", "layers.0"] and parts[-1][-2:] == ["norm", "output"]
    assert sum(len(p) for p in parts) == 32 + 3 and "pipeline_parallel_split_points" not in par10
    assert check(VERSIONS["torchtitan"]["2025-10"], {"parallelism.pipeline_parallel_split_points":
                                                     ["layers.8"]})
    t10 = VERSIONS["torchtitan"]["2025-10"]
    assert any("module_fqns_per_model_part" in p for p in check(
        t10, {"parallelism.pipeline_parallel_degree": 2}))  # torchtitan would split itself
    assert any("DDP" in p for p in check(t10, {"parallelism.data_parallel_replicate_degree": 2,
                                               "parallelism.tensor_parallel_degree": 2}))
    # 2026-02: a launch script of the registry config plus overrides
    r = export(plan, LLAMA, "torchtitan", version="2026-02")
    assert (r.version, r.files[0][0]) == ("2026-02", "torchtitan_train.sh")
    assert "--module llama3 \\\n    --config llama3_8b" in r.files[0][1]
    assert r.options["--parallelism.pipeline_parallel_layers_per_stage"] == 8
    # a benchmark launch with nothing to download: llama3_debugmodel's tokenizer and data in
    # the torchtitan checkout instead of llama3_8b's Hub assets; the script says how to switch
    assert (r.options["--hf_assets_path"], r.options["--dataloader.dataset"]) == (
        "./tests/assets/tokenizer", "c4_test")
    assert "for real data and tokenizer replace those two lines" in r.files[0][1]
    assert parse("torchtitan", r.files[0][1], LLAMA) == r.plan
    t26 = VERSIONS["torchtitan"]["2026-02"]
    bare = {k: v for k, v in r.options.items()
            if k not in ("--hf_assets_path", "--dataloader.dataset")}
    assert [p.split(" needs ")[1].split(":")[0] for p in check(t26, bare)] == [
        "--hf_assets_path", "--dataloader.dataset"]  # the registry configs' Hub downloads
    assert check(t26, {**r.options, "--dataloader.dataset": "c5"})  # not in DATASETS
    d = export(catalog.load_plan("tp=2,pp=2,dp=2,gbs=64,mbs=2,zero=3"), LLAMA, "deepspeed")
    ds = json.loads(d.files[0][1])
    assert ds["gradient_accumulation_steps"] == 16 and ds["zero_optimization"]["stage"] == 1
    assert "pipeline" not in ds  # DeepSpeed reads the split from PipelineModule, not here
    assert any("ZeRO-3 is incompatible" in w for w in d.warnings)
    assert "--num_gpus 8" in d.files[1][1]
    assert "--pipeline-parallel-size 2 --partition-method type:TransformerLayer" in d.files[1][1]


@pytest.mark.parametrize(("spec", "tokens", "pp_micro"), [
    ("tp=2,pp=2,vpp=2,dp=2,gbs=64,mbs=2,zero=3,schedule=interleaved,recompute=full",
     (2 * 8192, 64 * 8192), 16),
    ("tp=2,dp=4,gbs=64,mbs=2,zero=3,recompute=selective", (2 * 8192, 64 * 8192), None),
])
def test_torchtitan_now_counts_tokens_and_checkpoints_by_subcommand(
        spec: str, tokens: tuple[int, int], pp_micro: int | None) -> None:
    """The newest torchtitan (b5bcd76c, 2026-08) is the default: batches in token slots
    (micro_batch x seq_len per DP rank, global_batch x seq_len per step), pipeline
    microbatches counted, the checkpointing policy a subcommand after the script's own
    arguments; none of 2026-02's batch, AC-mode or dataset options remain, and the script
    parses back to the plan (torchtitan_options.py cites the files read at that commit)."""
    plan = catalog.load_plan(spec)
    r = export(plan, LLAMA, "torchtitan")
    assert r.version == "2026-08" and r.problems() == []
    o = r.options
    assert (o["--training.num_tokens_per_microbatch_per_dp_rank"],
            o["--training.num_tokens_per_train_step"]) == tokens
    assert o["--training.max_context_length"] == LLAMA.seq_len == 8192
    assert o.get("--parallelism.num_pp_microbatches") == pp_micro
    # torchtitan refuses its default CUDA graphs with a pipeline (_validate_cuda_graphs)
    assert ("--training.disable_cuda_graphs" in o) == (pp_micro is not None)
    assert o["activation-checkpoint"] == plan.recompute
    assert r.files[0][1].rstrip().endswith(f'"$@" \\\n    activation-checkpoint:{plan.recompute}')
    gone = ("--training.local_batch_size", "--training.global_batch_size", "--training.seq_len",
            "--activation_checkpoint.mode", "--dataloader.dataset",
            "--parallelism.pipeline_parallel_microbatch_size")
    assert not [k for k in gone if k in o or k in r.files[0][1]]
    assert parse("torchtitan", r.files[0][1], LLAMA) == r.plan
    t08 = VERSIONS["torchtitan"]["2026-08"]
    assert any("--training.seq_len" in p for p in check(t08, {"--training.seq_len": 8192}))
    if pp_micro:
        for key in ("--parallelism.num_pp_microbatches", "--training.disable_cuda_graphs"):
            bare = {k: v for k, v in o.items() if k != key}
            assert any(key in p for p in check(t08, bare))


def test_refusals_name_the_nearest_plan() -> None:
    # DeepSpeed's type: partitioning gives hetpar's [8, 8, 7, 7] split of 30 layers itself
    # (DeepSpeed's own code: tests/test_export_oracles.py): exported, not refused
    d = export(catalog.load_plan("pp=4,dp=3,gbs=24"), model_with(30), "deepspeed")
    assert d.problems() == [] and d.warnings == () and d.plan.pp == 4
    # torchtitan's registry splits by layers per stage; the TOML form takes any split
    with pytest.raises(ConfigError, match="nearest plan: .*pp=3.*framework-version 2025-10"):
        export(catalog.load_plan("pp=4,dp=3,gbs=24"), model_with(30), "torchtitan")
    assert export(catalog.load_plan("pp=4,dp=3,gbs=24"), model_with(30), "torchtitan",
                  version="2025-10").problems() == []
    with pytest.raises(ConfigError, match="launched by a script, not a TOML: give --out x.sh"):
        export(catalog.load_plan("pp=4,gbs=24"), LLAMA, "torchtitan", config_name="x.toml")
    with pytest.raises(ConfigError, match="supported: 0.3.0, 2025-07, 2025-10, 2026-02, 2026-08"):
        export(catalog.load_plan("pp=4,gbs=24"), LLAMA, "torchtitan", version="2024-01")


def test_megatron_launches_as_its_validator_requires() -> None:
    """The environment and option pairs validate_args checks (options.MEGATRON.rules)."""
    tp = export(catalog.load_plan("tp=2,dp=2,gbs=8,name=run1"), LLAMA, "megatron")
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in tp.files[0][1]
    assert "--wandb-exp-name" not in tp.options  # does nothing without --wandb-project
    assert tp.options["--tokenizer-type"] == "NullTokenizer" and "--mock-data" in tp.options
    assert parse("megatron", tp.files[0][1], LLAMA).name == "run1"  # from the header
    fsdp = export(catalog.load_plan("tp=2,dp=2,gbs=8,zero=3"), LLAMA, "megatron")
    assert "unset CUDA_DEVICE_MAX_CONNECTIONS" in fsdp.files[0][1]
    assert fsdp.options["--ckpt-format"] == "fsdp_dtensor"
    plain = export(catalog.load_plan("dp=4,gbs=8"), LLAMA, "megatron")
    assert plain.env == {} and "CUDA_DEVICE_MAX_CONNECTIONS" not in plain.files[0][1]
    # the rules fail when the launcher would not satisfy them
    table = TABLES["megatron"]
    assert any("CUDA_DEVICE_MAX_CONNECTIONS=1" in p for p in check(table, tp.options, {}))
    assert any("fsdp_dtensor" in p for p in check(
        table, {k: v for k, v in fsdp.options.items() if k != "--ckpt-format"}, fsdp.env))
    assert any("!=1" in p for p in check(table, fsdp.options, {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}))
    assert any("--wandb-project" in p for p in check(
        table, {**plain.options, "--wandb-exp-name": "x"}, plain.env))


def test_parse_errors() -> None:
    with pytest.raises(ConfigError, match="expects an integer"):
        parse("megatron", "--tensor-model-parallel-size two", LLAMA)
    with pytest.raises(ConfigError, match="cannot parse TOML"):
        parse("torchtitan", "[parallelism", LLAMA)
    with pytest.raises(ConfigError, match="not a multiple"):
        parse("deepspeed", '{"train_batch_size": 10, "train_micro_batch_size_per_gpu": 4}', LLAMA)
    with pytest.raises(ConfigError, match="unknown framework"):
        parse("jax", "", LLAMA)
    assert megatron.split_script("--micro-batch-size 2")[1] == ["--micro-batch-size", "2"]


def run_cli(*argv: str) -> int:
    p = argparse.ArgumentParser()
    export_cli.add_arguments(p)
    return export_cli.run(p.parse_args(list(argv)))


def test_cli_writes_files_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ds.json"
    assert run_cli("--plan", "tp=2,dp=4,gbs=64,schedule=gpipe", "--model", "llama3.1-8b",
                   "--to", "deepspeed", "--out", str(out), "--cluster", "selene-a100") == 0
    assert json.loads(out.read_text())["tensor_parallel"]["autotp_size"] == 2
    assert "--deepspeed_config ds.json" in (tmp_path / "ds.sh").read_text()
    assert "warning: schedule 'gpipe'" in capsys.readouterr().err
    assert run_cli("--plan", "tp=2,gbs=8", "--model", "llama3.1-8b", "--to", "megatron",
                   "--json") == 0
    data = json.loads(capsys.readouterr().out)
    assert data["plan"]["tp"] == 2 and "megatron_args.sh" in data["files"]
    # no temp files; tp=2 without a pipeline runs hetpar's train module, whose model file
    # the export writes beside the config
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds.json", "ds.model.toml", "ds.sh"]


@pytest.mark.parametrize(("target", "version"), TARGET_VERSIONS)
def test_invalid_schedule_combinations_become_1f1b(target: str, version: str) -> None:
    for text in ("pp=4,vpp=2,gbs=32", "pp=4,gbs=32,schedule=interleaved",
                 "pp=4,vpp=2,gbs=6,schedule=interleaved"):  # vpp unused; vpp=1; 6 % 4 != 0
        e = export(catalog.load_plan(text), LLAMA, target, version=version)
        assert (e.plan.schedule, e.plan.vpp) == ("1f1b", 1)
        assert any("cannot run this plan" in w for w in e.warnings)
        assert_round_trip(e, LLAMA)


def test_megatron_parse_needs_launcher_and_matching_model() -> None:
    e = export(catalog.load_plan("tp=2,dp=2,gbs=8"), LLAMA, "megatron")
    _, argv = megatron.split_script(e.files[0][1])
    with pytest.raises(ConfigError, match="world size"):
        parse("megatron", " ".join(argv), LLAMA)
    with pytest.raises(ConfigError, match="--num-layers 32 but model"):
        parse("megatron", e.files[0][1], model_with(40))
