"""Qwen-MoE exports: Megatron-LM writes the expert widths; targets that cannot say them warn
(DeepSpeed: its files carry no model shape) or refuse (torchtitan), naming the fields."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from test_export_oracles import accepted_elsewhere, megatron_oracle

from hetpar import catalog
from hetpar.errors import ConfigError
from hetpar.export import export, parse
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


def test_targets_without_expert_options_refuse_ep() -> None:
    plan = catalog.load_plan("tp=2,pp=2,dp=4,ep=8,gbs=64,sp=true")
    for target in ("deepspeed", "torchtitan"):
        with pytest.raises(ConfigError, match="export: ep=8 is not carried by this target"):
            export(plan, MIXTRAL, target)
