"""State-space and hybrid families (Mamba, Mamba-2, Jamba, Nemotron-H): FLOPs by hand, the
layer kinds the configs set, and the parallel axes hetpar refuses for their SSM layers."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from hetpar import feasibility
from hetpar import formulas as F
from hetpar.errors import ConfigError
from hetpar.hf.convert import model_from_hf_config
from hetpar.specs.ssm import SsmSpec

FIX = Path(__file__).parent / "fixtures" / "hf"


def load(name: str) -> dict[str, object]:
    return json.loads((FIX / f"{name}.json").read_text())


def test_mamba_flops_by_hand() -> None:
    """Mamba-130m: per layer in_proj 768 x 3072, x_proj 1536 x 80, dt_proj 48 x 1536,
    out_proj 1536 x 768; conv 2 x 4 x 1536; scan 7 x 1536 x 16; the head 2 x 768 x 50280."""
    m = model_from_hf_config(load("mamba-130m"), "mamba-130m")
    proj = 768 * 3072 + 1536 * 80 + 48 * 1536 + 1536 * 768
    layer = 2 * proj + 2 * 4 * 1536 + 7 * 1536 * 16
    assert F.model_flops_per_token(m, 2048) == 3 * (24 * layer + 2 * 768 * 50280)
    assert F.attention_core_flops_per_token(m, 2048) == 0  # no layer attends


def test_mamba2_scan_flops_by_hand() -> None:
    """SSD per token: 2 Q (G N + I) + 4 N I plus the conv 2 K (I + 2 G N)."""
    s = SsmSpec(kind="mamba2", inner=8192, heads=128, groups=8, state_size=128, conv_width=4,
                chunk=256)
    conv = 2 * 4 * (8192 + 2 * 8 * 128)
    assert F.ssm.ssm_core_flops_per_token(s) == conv + 2 * 256 * (8 * 128 + 8192) + 4 * 128 * 8192


def test_jamba_layers_and_experts() -> None:
    """Jamba-v0.1: attention on layers 4, 12, 20, 28; MoE on the odd layers."""
    m = model_from_hf_config(load("jamba-v0.1"), "jamba")
    assert [i for i, k in enumerate(m.kinds) if k == "attention+mlp"] == [4, 12, 20, 28]
    assert m.moe_layer_flags == tuple(i % 2 == 1 for i in range(32))
    assert (m.ssm is not None and m.ssm.dt_norms and m.ssm.dt_rank == 256)
    # only the 4 attention layers attend: the mean over 32 layers is an eighth of one
    one = 2.0 * 4096 * (32 * 128 + 32 * 128)
    assert F.attention_core_flops_per_token(m, 4096) == one * 4 / 32


def test_nemotron_h_pattern_sets_the_layers() -> None:
    m = model_from_hf_config(load("nemotron-h-8b"), "nemotron-h")
    assert m.n_layers == 52 and m.kinds.count("attention") == 4
    assert m.kinds.count("ssm") == 24 and m.kinds.count("mlp") == 24
    with pytest.raises(ConfigError, match="block 'E' is not representable"):
        model_from_hf_config({**load("nemotron-h-8b"), "hybrid_override_pattern": "M*E-"}, "x")


@pytest.mark.parametrize("name", ["mamba-130m", "jamba-v0.1", "nemotron-h-8b"])
def test_tp_and_cp_refused_naming_the_axis_and_the_layer_kind(name: str) -> None:
    m = model_from_hf_config(load(name), name)
    v = feasibility.tp_shards(m, 2)
    assert not v.ok and "tp=2" in v.reason and "ssm layers" in v.reason
    v = feasibility.context_split(4096, 2, m)
    assert not v.ok and "cp=2" in v.reason and "ssm layers" in v.reason
    assert feasibility.tp_shards(m, 1).ok and feasibility.context_split(4096, 1, m).ok


def test_layer_kinds_checked() -> None:
    m = model_from_hf_config(load("mamba-130m"), "mamba")
    with pytest.raises(ConfigError, match="layer_kinds must list 24 layers"):
        replace(m, layer_kinds=("ssm",))
    with pytest.raises(ConfigError, match="ssm must be given exactly"):
        replace(m, ssm=None)
