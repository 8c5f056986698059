"""torchtitan 2026-08's own parser accepts hetpar's launch scripts: skipped unless a checkout of
pytorch/torchtitan at b5bcd76c is importable (it is not on the package index; the release there,
0.3.0, is tests/test_export_torchtitan_parser.py's).

To run it, put the checkout on PYTHONPATH with its dependencies (tyro, grain 0.2.18, spmd_types
0.2.3, datasets, torch_checkpointing, tokenizers, safetensors, einops, tensorboard, pillow;
torchao for fp8). ``ConfigManager.parse_args`` loads the registry config, applies the overrides
with tyro and runs Trainer.Config's validators (CUDA graphs with pipelines or expert
parallelism, token-count divisibility of the step).
"""

from __future__ import annotations

import pytest

from hetpar import catalog
from hetpar.export import export, torchtitan_check

if torchtitan_check.installed() in (None, "0.3.0"):
    pytest.skip("no torchtitan checkout at b5bcd76c on the path (not on the package index)",
                allow_module_level=True)

PLANS = ["tp=2,pp=2,vpp=2,dp=2,gbs=64,mbs=2,zero=3,schedule=interleaved,recompute=full",
         "tp=2,dp=4,gbs=64,mbs=2,zero=3,recompute=selective", "dp=8,gbs=64,mbs=1",
         "tp=8,pp=4,dp=2,gbs=512,mbs=1", "tp=4,cp=2,dp=1,gbs=8,mbs=1,zero=3",
         "pp=4,gbs=32,schedule=gpipe,mbs=2,zero=2"]


@pytest.mark.parametrize("model", ["llama3.1-8b", "llama3.1-70b"])
@pytest.mark.parametrize("spec", PLANS)
def test_torchtitan_checkout_parses_the_export(model: str, spec: str) -> None:
    m, plan = catalog.load_model(model), catalog.load_plan(spec)
    e = export(plan, m, "torchtitan", version="2026-08")
    cfg, _ = torchtitan_check.parse(e.files[0][1])
    near = e.plan
    assert cfg.training.num_tokens_per_microbatch_per_dp_rank == near.micro_batch * m.seq_len
    assert cfg.training.num_tokens_per_train_step == near.batch * m.seq_len
    assert cfg.parallelism.pipeline_parallel_degree == near.pp
    assert cfg.parallelism.tensor_parallel_degree == near.tp
    ac = cfg.activation_checkpoint
    assert (type(ac).__qualname__.split(".")[0] if ac is not None else "none") == {
        "full": "FullAC", "selective": "SelectiveAC", "none": "none"}[near.recompute]


@pytest.mark.parametrize(("model", "spec"), [
    ("gpt-oss-20b", "tp=2,dp=4,ep=8,gbs=64,sp=true,zero=3"),
    ("qwen3-30b-a3b", "pp=2,dp=4,ep=4,gbs=64,zero=2"),
])
def test_torchtitan_checkout_parses_the_moe_configs(model: str, spec: str) -> None:
    """With ep > 1 the export turns CUDA graphs off: Trainer.Config refuses them with the
    registry configs' all-to-all token dispatcher."""
    e = export(catalog.load_plan(spec), catalog.load_model(model), "torchtitan", version="2026-08")
    cfg, _ = torchtitan_check.parse(e.files[0][1])
    assert cfg.parallelism.expert_parallel_degree == e.plan.degree("ep") > 1
