"""Qwen-MoE exports: Megatron-LM writes the expert widths; targets that cannot say them warn
(DeepSpeed: its files carry no model shape) or refuse (torchtitan), naming the fields."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import replace
from pathlib import Path

import pytest
from test_export_oracles import accepted_elsewhere, deepspeed_oracle, megatron_oracle

from hetpar import catalog
from hetpar.errors import ConfigError
from hetpar.export import deepspeed, export, get, parse
from hetpar.export.options import TABLES, check

HF = Path(__file__).parent / "fixtures" / "hf"
QWEN15 = catalog.load_model(str(HF / "qwen1.5-moe-a2.7b.json"))
QWEN3 = catalog.load_model(str(HF / "qwen3-30b-a3b.json"))
MIXTRAL = catalog.load_model("mixtral-8x7b")
PLAN = catalog.load_plan("tp=2,pp=2,dp=2,gbs=64")


def _argv(script: str) -> list[str]:
    return script.replace("\\\n", " ").split()


def _value(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def test_megatron_writes_qwen15_moe_expert_sizes() -> None:
    # config.json: num_experts 60, num_experts_per_tok 4, moe_intermediate_size 1408,
    # shared_expert_intermediate_size 5632 (gated), intermediate_size 5632
    e = export(PLAN, QWEN15, "megatron")
    argv = _argv(e.files[0][1])
    assert _value(argv, "--num-experts") == "60"
    assert _value(argv, "--moe-router-topk") == "4"
    assert _value(argv, "--moe-ffn-hidden-size") == "1408"
    assert _value(argv, "--moe-shared-expert-intermediate-size") == "5632"
    assert _value(argv, "--ffn-hidden-size") == "5632"
    assert "--add-qkv-bias" in argv and "--moe-shared-expert-overlap" not in argv
    # the cited commit's _add_moe_args has no --moe-shared-expert-gate: lost with a warning
    assert [w for w in e.warnings if "shared_expert_gate" in w]
    assert e.problems() == []
    megatron_oracle(e, QWEN15)  # megatron-core's TransformerConfig takes the sizes
    assert parse("megatron", e.files[0][1], QWEN15) == e.plan


def test_megatron_writes_qwen3_moe_without_a_shared_expert() -> None:
    e = export(PLAN, QWEN3, "megatron")
    argv = _argv(e.files[0][1])
    assert (_value(argv, "--num-experts"), _value(argv, "--moe-router-topk")) == ("128", "8")
    assert _value(argv, "--moe-ffn-hidden-size") == "768"
    assert "--moe-shared-expert-intermediate-size" not in argv and "--qk-layernorm" in argv
    assert not [w for w in e.warnings if "expert" in w]
    assert e.problems() == []
    megatron_oracle(e, QWEN3)


def test_mixtral_export_is_unchanged_by_the_expert_width_flags() -> None:
    """No moe_ffn_hidden: Megatron's experts default to --ffn-hidden-size, as hetpar's."""
    argv = _argv(export(PLAN, MIXTRAL, "megatron").files[0][1])
    assert "--moe-ffn-hidden-size" not in argv
    spelled = replace(MIXTRAL, moe_ffn_hidden=MIXTRAL.ffn_hidden)
    assert _value(_argv(export(PLAN, spelled, "megatron").files[0][1]),
                  "--moe-ffn-hidden-size") == "14336"


def test_megatron_expert_option_rules() -> None:
    table = TABLES["megatron"]
    base = {"--tokenizer-type": "NullTokenizer", "--train-iters": 10}
    assert check(table, {**base, "--num-experts": 8, "--moe-ffn-hidden-size": 1408}) == []
    assert check(table, {**base, "--moe-ffn-hidden-size": 1408})  # needs --num-experts
    lone = {**base, "--num-experts": 8, "--moe-shared-expert-overlap": None}
    assert any("moe-shared-expert-intermediate-size" in p for p in check(table, lone))


@pytest.mark.parametrize("version", ["2026-02", "2025-10", "2025-07"])
def test_torchtitan_refuses_qwen_moe_naming_the_fields(version: str) -> None:
    with pytest.raises(ConfigError) as err:
        export(PLAN, QWEN15, "torchtitan", version=version)
    msg = str(err.value)
    assert "\n" not in msg and f"model {QWEN15.name!r}" in msg
    for field in ("n_experts=60", "experts_per_token=4", "moe_ffn_hidden=1408",
                  "shared_expert_ffn_hidden=5632", "shared_expert_gate=true"):
        assert field in msg
    # no torchtitan plan of the model exists: the refusal names the targets that accept this
    # very plan, each checked by exporting it (Megatron: megatron-core's TransformerConfig)
    assert sorted(accepted_elsewhere(msg, PLAN, QWEN15, "torchtitan")) == ["deepspeed",
                                                                           "megatron"]


def test_deepspeed_warns_naming_the_expert_fields() -> None:
    e = export(PLAN, QWEN15, "deepspeed")
    (w,) = [w for w in e.warnings if "mixture of experts" in w]
    assert "moe_ffn_hidden=1408" in w and "shared_expert_ffn_hidden=5632" in w
    assert e.problems() == []


def test_megatron_writes_dense_first_layers_as_a_flag_list() -> None:
    """DeepSeek-V3's 3 dense layers: --moe-layer-freq as Megatron's 0/1 list (arguments.py
    moe_freq_type), one flag per layer; MLA and the sigmoid router are named as lost."""
    dsv3 = catalog.load_model("deepseek-v3")
    plan = catalog.load_plan("tp=8,pp=8,dp=4,gbs=256")
    e = export(plan, dsv3, "megatron")
    flags = json.loads(_value(_argv(e.files[0][1]), "--moe-layer-freq").strip("'"))
    assert flags == [0, 0, 0] + [1] * 58
    assert [w for w in e.warnings if "multi-head latent attention" in w]
    assert [w for w in e.warnings if "router (scores sigmoid" in w]
    assert e.problems() == []
    assert _value(_argv(export(PLAN, MIXTRAL, "megatron").files[0][1]), "--moe-layer-freq") == "1"


@pytest.mark.parametrize(("text", "etp"), [
    ("tp=2,pp=2,dp=4,ep=8,gbs=64,sp=true", "1"),
    ("tp=2,pp=2,dp=4,ep=4,etp=2,gbs=64,sp=true", "2"),
])
def test_megatron_writes_ep_and_etp_and_reads_them_back(text: str, etp: str) -> None:
    plan = catalog.load_plan(text)
    e = export(plan, MIXTRAL, "megatron")
    argv = _argv(e.files[0][1])
    assert _value(argv, "--expert-model-parallel-size") == str(plan.degree("ep"))
    assert _value(argv, "--expert-tensor-parallel-size") == etp  # hetpar's, not tp's default
    assert e.problems() == []
    megatron_oracle(e, MIXTRAL)
    assert parse("megatron", e.files[0][1], MIXTRAL) == e.plan
    assert e.plan.axes == plan.axes


GPT_OSS = catalog.load_model("gpt-oss-120b")  # 128 experts, top-4: a torchtitan registry config
EP8 = "tp=2,dp=8,ep=8,gbs=64,sp=true"


def _read_back(e, model, tmp_path: Path):  # noqa: ANN001, ANN202 (an Export, its model)
    """The plan the written files describe, read as `hetpar export --from` reads them."""
    for name, text in e.files:
        (tmp_path / name).write_text(text)
    main = tmp_path / e.files[0][0]
    return get(e.target).read_file(main, main.read_text(), model)[0]


@pytest.mark.parametrize(("version", "etp_flag"), [("2026-02", "1"), ("2026-08", None)])
def test_torchtitan_writes_ep_for_its_moe_registry_config(
        version: str, etp_flag: str | None, tmp_path: Path) -> None:
    e = export(catalog.load_plan(EP8), GPT_OSS, "torchtitan", version=version)
    argv = _argv(e.files[0][1])
    assert (_value(argv, "--module"), _value(argv, "--config")) == ("gpt_oss", "gpt_oss_120b")
    assert _value(argv, "--parallelism.expert_parallel_degree") == "8"
    assert _value(argv, "--parallelism.expert_tensor_parallel_degree") == etp_flag
    # EP is carved from the FSDP ranks: DDP becomes FSDP (ZeRO-2), with a warning
    assert _value(argv, "--parallelism.data_parallel_shard_degree") == "8"
    assert e.plan.axes == (("ep", 8),) and e.plan.zero == 2
    assert e.problems() == []
    assert _read_back(e, GPT_OSS, tmp_path) == e.plan


def test_torchtitan_etp_per_version(tmp_path: Path) -> None:
    plan = catalog.load_plan("tp=2,dp=8,ep=4,etp=2,gbs=64,sp=true,zero=3")
    e = export(plan, GPT_OSS, "torchtitan", version="2026-02")  # etp = 1 or tp (00d1c0e4)
    assert _value(_argv(e.files[0][1]), "--parallelism.expert_tensor_parallel_degree") == "2"
    assert e.plan.axes == plan.axes and not [w for w in e.warnings if "etp" in w]
    assert _read_back(e, GPT_OSS, tmp_path) == e.plan
    e = export(plan, GPT_OSS, "torchtitan", version="2026-08")  # no etp: experts whole
    (w,) = [w for w in e.warnings if "etp=2" in w]
    assert w.endswith("-> etp=1") and e.plan.axes == (("ep", 4),)
    assert _read_back(e, GPT_OSS, tmp_path / "..") == e.plan
    # EP off, TP on: torchtitan shards the experts over TP, so hetpar's etp=1 becomes tp
    e = export(catalog.load_plan("tp=2,dp=8,gbs=64,sp=true,zero=3"), GPT_OSS, "torchtitan")
    assert e.plan.axes == (("etp", 2),) and [w for w in e.warnings if "-> etp=2" in w]
    assert _value(_argv(e.files[0][1]), "--parallelism.expert_parallel_degree") == "1"
    assert _read_back(e, GPT_OSS, tmp_path) == e.plan


@pytest.mark.parametrize(("target", "text", "near"), [
    # 2026-02 with etp = tp: efsdp = dp_shard x cp / ep, so ep=8 needs 8 FSDP ranks
    ("torchtitan", "tp=2,dp=2,ep=8,etp=2,gbs=64,sp=true,zero=3", "ep=2,etp=2"),
    # DeepSpeed's expert groups divide the data-parallel world only (not tp)
    ("deepspeed", "tp=2,dp=4,ep=8,gbs=64", "ep=4"),
])
def test_ep_that_does_not_fit_is_refused_naming_the_nearest_plan(
        target: str, text: str, near: str) -> None:
    model = GPT_OSS if target == "torchtitan" else MIXTRAL
    version = "2026-02" if target == "torchtitan" else None
    with pytest.raises(ConfigError) as err:
        export(catalog.load_plan(text), model, target, version=version)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"export: ep={text.split('ep=')[1][0]} does not")
    m = re.search(r"nearest plan: (\S+)$", msg)
    assert m and m.group(1).endswith(near), msg
    e = export(catalog.load_plan(m.group(1)), model, target, version=version)
    assert e.problems() == [] and e.plan.degree("ep") == int(near.split("=")[1].split(",")[0])


def test_torchtitan_refuses_an_moe_model_without_a_registry_config() -> None:
    plan = catalog.load_plan(EP8)
    with pytest.raises(ConfigError) as err:
        export(plan, MIXTRAL, "torchtitan")
    msg = str(err.value)
    assert "torchtitan 2026-08's config registry has MoE configs for deepseek-v3, " in msg
    assert sorted(accepted_elsewhere(msg, plan, MIXTRAL, "torchtitan")) == ["deepspeed",
                                                                            "megatron"]


def test_torchtitan_toml_form_refuses_ep_naming_the_nearest_plan() -> None:
    from hetpar.export import torchtitan_toml

    with pytest.raises(ConfigError) as err:
        torchtitan_toml.nearest(catalog.load_plan(EP8), MIXTRAL)
    msg = str(err.value)
    assert msg.startswith("export: ep=8 is not carried by torchtitan's TOML job configuration")
    assert msg.endswith("nearest plan: tp=2,pp=1,dp=8,cp=1,vpp=1,schedule=1f1b,gbs=64,mbs=1,"
                        "zero=0,precision=bf16,recompute=none,sp=true")


@pytest.mark.parametrize(("text", "flag"), [(EP8, False),
                                            ("tp=2,dp=8,ep=4,etp=2,gbs=64", True)])
def test_deepspeed_states_ep_size_in_the_launcher(text: str, flag: bool, tmp_path: Path) -> None:
    plan = catalog.load_plan(text)
    e = export(plan, MIXTRAL, "deepspeed")
    config, launch = e.files[0][1], e.files[1][1]
    keys = deepspeed.flatten(json.loads(config))
    assert not [k for k in keys if "ep" in k.split(".")[-1].split("_")]  # no ds_config key
    words = shlex.split(next(ln for ln in launch.splitlines() if ln.startswith("deepspeed ")))
    assert _value(words, "--ep-size") == str(plan.degree("ep"))
    assert ("--expert-tensor-parallel" in words) is flag
    assert (f"deepspeed.moe.layer.MoE(hidden_size=4096, expert=<its FFN>, num_experts=8, "
            f"ep_size={plan.degree('ep')}, k=2, enable_expert_tensor_parallelism={flag})"
            in launch)
    assert e.problems() == []
    deepspeed_oracle(e, MIXTRAL)  # DeepSpeedConfig accepts the ds_config
    assert e.plan.axes == plan.axes and _read_back(e, MIXTRAL, tmp_path) == e.plan


def test_torchtitan_pipeline_refusal_keeps_ep_in_the_nearest_plan() -> None:
    """DeepSeek-V3's 61 layers split over no pp > 1: the nearest plan (pp=1, dp=16) keeps
    ep=32 (it divides 16 x tp 8) and exports; no TOML version is suggested for an MoE model."""
    dsv3 = catalog.load_model("deepseek-v3")
    plan = catalog.load_plan("tp=8,pp=4,dp=4,ep=32,gbs=256,sp=true,zero=1")
    with pytest.raises(ConfigError) as err:
        export(plan, dsv3, "torchtitan", version="2026-02")
    msg = str(err.value)
    near = re.search(r"nearest plan: (\S+)$", msg)
    assert near and near[1].endswith(",ep=32") and "2025-10" not in msg, msg
    e = export(catalog.load_plan(near[1]), dsv3, "torchtitan", version="2026-02")
    argv = _argv(e.files[0][1])
    assert (_value(argv, "--config"), _value(argv, "--parallelism.expert_parallel_degree")) == (
        "deepseek_v3_671b", "32")
    assert e.problems() == [] and e.plan.precision == "fp8"  # the config applies float8
