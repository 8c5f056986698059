"""torchtitan 0.3.0's own parser (the release on PyPI, which the Makefile installs) reads
hetpar's ``--framework-version 0.3.0`` launch scripts and refuses the other forms in its own
words; ``hetpar export --check`` runs it. Skipped without torchtitan.

``ConfigManager.parse_args`` loads the registry config, applies the overrides with tyro and runs
Trainer.Config's validators (pipeline microbatches, CUDA graphs with pipelines): what
``python -m torchtitan.train`` does before it builds anything. The 16 plan kinds go through it in
tests/test_export_oracles.py; here the batch arithmetic at other sizes, the MoE configs, the
refusals and the command line.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from hetpar import catalog
from hetpar.cli.main import main
from hetpar.export import export, get, torchtitan_check

if torchtitan_check.installed() != "0.3.0":
    pytest.skip("torchtitan 0.3.0 is not installed (make installs it)", allow_module_level=True)

PLANS = ["tp=2,pp=2,vpp=2,dp=2,gbs=64,mbs=2,zero=3,schedule=interleaved,recompute=full",
         "tp=2,dp=4,gbs=64,mbs=2,zero=3,recompute=selective", "dp=8,gbs=64,mbs=1",
         "tp=8,pp=4,dp=2,gbs=512,mbs=1", "tp=4,cp=2,dp=1,gbs=8,mbs=1,zero=3",
         "pp=4,gbs=32,schedule=gpipe,mbs=2,zero=2"]


@pytest.mark.parametrize("model", ["llama3.1-8b", "llama3.1-70b"])
@pytest.mark.parametrize("spec", PLANS)
def test_torchtitan_parses_the_export(model: str, spec: str) -> None:
    m, plan = catalog.load_model(model), catalog.load_plan(spec)
    e = export(plan, m, "torchtitan", version="0.3.0")
    cfg, _ = torchtitan_check.parse(e.files[0][1])
    near = e.plan
    assert (cfg.training.global_batch_size, cfg.training.seq_len) == (near.batch, m.seq_len)
    assert cfg.training.local_batch_size * near.dp == near.batch if near.pp > 1 else \
        cfg.training.local_batch_size == near.micro_batch
    assert cfg.parallelism.pipeline_parallel_degree == near.pp
    assert cfg.parallelism.tensor_parallel_degree == near.tp
    assert cfg.parallelism.pipeline_parallel_schedule == {
        "1f1b": "1F1B", "interleaved": "Interleaved1F1B", "gpipe": "GPipe"}[near.schedule]
    ac = cfg.activation_checkpoint
    assert (type(ac).__qualname__.split(".")[0] if ac is not None else "none") == {
        "full": "FullAC", "selective": "SelectiveAC", "none": "none"}[near.recompute]


@pytest.mark.parametrize(("model", "spec"), [
    ("gpt-oss-20b", "tp=2,dp=4,ep=8,gbs=64,sp=true,zero=3"),
    ("qwen3-30b-a3b", "pp=2,dp=4,ep=4,gbs=64,zero=2"),
])
def test_torchtitan_parses_the_moe_configs(model: str, spec: str) -> None:
    e = export(catalog.load_plan(spec), catalog.load_model(model), "torchtitan", version="0.3.0")
    cfg, _ = torchtitan_check.parse(e.files[0][1])
    assert cfg.parallelism.expert_parallel_degree == e.plan.degree("ep") > 1


@pytest.mark.parametrize("version", ["2026-02", "2026-08"])
def test_the_other_registry_forms_are_refused_in_torchtitans_words(version: str) -> None:
    """0.3.0 has neither 2026-02's --activation_checkpoint.mode nor 2026-08's token counts: the
    reason it is a version of its own."""
    e = export(catalog.load_plan("tp=2,pp=2,dp=2,gbs=64"), catalog.load_model("llama3.1-8b"),
               "torchtitan", version=version)
    with pytest.raises(ValueError, match="Unrecognized options") as err:
        torchtitan_check.parse(e.files[0][1])
    gone = "--activation_checkpoint.mode" if version == "2026-02" else \
        "--training.num_tokens_per_microbatch_per_dp_rank"
    assert gone in str(err.value) and "\n" not in str(err.value)


def test_check_refuses_in_torchtitans_words_and_accepts_the_export() -> None:
    e = export(catalog.load_plan("tp=2,pp=2,dp=2,gbs=64"), catalog.load_model("llama3.1-8b"),
               "torchtitan", version="0.3.0")
    ok = get("torchtitan").check_export(e)
    assert ok.accepted is True and ok.message.startswith(
        "accepted by torchtitan 0.3.0 ConfigManager.parse_args"), ok.message
    text = e.files[0][1].replace("    --training.disable_cuda_graphs \\\n", "")
    bad = dataclasses.replace(e, files=((e.files[0][0], text),))
    c = get("torchtitan").check_export(bad)
    assert c.accepted is False and "\n" not in c.message, c.message
    assert c.message.startswith("torchtitan 0.3.0 ConfigManager.parse_args refused it: ")
    assert "CUDA graphs do not support pipeline parallelism" in c.message


def test_cli_check_names_the_version_it_checked_against(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", "--plan", "tp=2,pp=2,dp=2,gbs=64", "--model", "llama3.1-8b", "--to",
                 "torchtitan", "--framework-version", "0.3.0", "--check", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["check"]["accepted"] is True and "torchtitan 0.3.0" in out["check"]["message"]
    assert main(["export", "--plan", "tp=2,pp=2,dp=2,gbs=64", "--model", "llama3.1-8b", "--to",
                 "torchtitan", "--check", "--json"]) == 0  # the default, 2026-08
    msg = json.loads(capsys.readouterr().out)["check"]["message"]
    assert msg.startswith("not checked: the installed torchtitan 0.3.0 reads its own form, not "
                          "2026-08's"), msg
