"""torchtitan 2026-08's own parser accepts hetpar's launch scripts (skipped without torchtitan).

torchtitan at b5bcd76c is not on the package index; to run this, put a checkout of that commit
on PYTHONPATH with its dependencies (tyro, grain 0.2.18, spmd_types 0.2.3, datasets,
torch_checkpointing, tokenizers, safetensors, einops, tensorboard, pillow; torchao for fp8).
``ConfigManager.parse_args`` loads the registry config, applies the overrides with tyro and
runs Trainer.Config's validators (CUDA graphs with pipelines, token-count divisibility of the
step): what ``python -m torchtitan.train`` does before it builds anything.
"""

from __future__ import annotations

import shlex

import pytest

from hetpar import catalog
from hetpar.export import export

manager = pytest.importorskip("torchtitan.config.manager", reason="torchtitan not installed")

PLANS = ["tp=2,pp=2,vpp=2,dp=2,gbs=64,mbs=2,zero=3,schedule=interleaved,recompute=full",
         "tp=2,dp=4,gbs=64,mbs=2,zero=3,recompute=selective", "dp=8,gbs=64,mbs=1",
         "tp=8,pp=4,dp=2,gbs=512,mbs=1", "tp=4,cp=2,dp=1,gbs=8,mbs=1,zero=3",
         "pp=4,gbs=32,schedule=gpipe,mbs=2,zero=2"]


def _argv(script: str) -> list[str]:
    body = " ".join(ln.rstrip("\\") for ln in script.splitlines()
                    if not ln.lstrip().startswith("#"))
    words = shlex.split(body)
    return [w for w in words[words.index("torchtitan.train") + 1:] if w != "$@"]


@pytest.mark.parametrize("model", ["llama3.1-8b", "llama3.1-70b"])
@pytest.mark.parametrize("spec", PLANS)
def test_torchtitan_parses_the_export(model: str, spec: str) -> None:
    m, plan = catalog.load_model(model), catalog.load_plan(spec)
    e = export(plan, m, "torchtitan")
    cfg = manager.ConfigManager().parse_args(_argv(e.files[0][1]))
    near = e.plan
    assert cfg.training.num_tokens_per_microbatch_per_dp_rank == near.micro_batch * m.seq_len
    assert cfg.training.num_tokens_per_train_step == near.batch * m.seq_len
    assert cfg.parallelism.pipeline_parallel_degree == near.pp
    assert cfg.parallelism.tensor_parallel_degree == near.tp
    ac = cfg.activation_checkpoint
    assert (type(ac).__qualname__.split(".")[0] if ac is not None else "none") == {
        "full": "FullAC", "selective": "SelectiveAC", "none": "none"}[near.recompute]
