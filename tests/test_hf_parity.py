"""Parameter counts of every architecture hetpar's HF loader accepts, against ``transformers``.

``transformers`` builds each model from the same config.json on the meta device (no weights,
no download) and counts its parameters; hetpar's count must match to the parameter.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hetpar import formulas as F
from hetpar.catalog import load_model
from hetpar.hf.convert import model_from_hf_config
from hetpar.hf.families import FAMILIES

transformers = pytest.importorskip("transformers", reason="oracle extra: pip install -e .[oracle]")
torch = pytest.importorskip("torch", reason="the runtime extra: pip install -e .[runtime]")

FIX = Path(__file__).parent / "fixtures" / "hf"
CONFIGS = sorted(p.stem for p in FIX.glob("*.json"))


def _reference_count(data: dict[str, object]) -> int:
    cfg = transformers.AutoConfig.for_model(**data)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    return sum(p.numel() for p in model.parameters())  # tied weights are one Parameter


def test_every_family_has_a_fixture() -> None:
    covered = {json.loads((FIX / f"{n}.json").read_text())["model_type"] for n in CONFIGS}
    assert covered == set(FAMILIES)


@pytest.mark.parametrize("name", CONFIGS)
def test_parameter_count_matches_transformers(name: str) -> None:
    data = json.loads((FIX / f"{name}.json").read_text())
    assert F.params(model_from_hf_config(data, name)) == _reference_count(data)


# catalog presets written from a Hugging Face config.json that is a fixture here. The MoE
# fixtures carry the shape keys of the published config.json files on the Hugging Face Hub:
# deepseek-ai/DeepSeek-V3, deepseek-ai/DeepSeek-V2-Lite, openai/gpt-oss-20b and -120b (their
# quantization_config left out: transformers would build MXFP4 blocks), Qwen/Qwen3-235B-A22B,
# mistralai/Mixtral-8x22B-v0.1, and the text_config of meta-llama/Llama-4-Scout-17B-16E and
# Llama-4-Maverick-17B-128E (rope and chunked-attention keys, which hold no parameters, left
# out).
PRESETS = {"opt-350m": "opt-350m", "llama3.1-8b": "llama-3.1-8b", "mixtral-8x7b": "mixtral-8x7b",
           "mixtral-8x22b": "mixtral-8x22b", "deepseek-v3": "deepseek-v3",
           "qwen3-30b-a3b": "qwen3-30b-a3b", "qwen3-235b-a22b": "qwen3-235b-a22b",
           "gpt-oss-20b": "gpt-oss-20b", "gpt-oss-120b": "gpt-oss-120b"}


@pytest.mark.parametrize(("preset", "config"), sorted(PRESETS.items()))
def test_catalog_preset_matches_transformers(preset: str, config: str) -> None:
    """The hand-written catalog preset (OPT-350m: 512-wide word embeddings with projections,
    position offset, no final norm) counts what transformers builds from its config.json."""
    data = json.loads((FIX / f"{config}.json").read_text())
    assert F.params(load_model(preset)) == _reference_count(data)


@pytest.mark.parametrize("config", ["opt-125m", "opt-350m"])
def test_switched_off_linear_biases_keep_the_layernorm_biases(config: str) -> None:
    """OPT's enable_bias reaches its nn.Linear layers only: the nn.LayerNorms keep their bias
    (ModelSpec.norm_bias), which hetpar counts as transformers builds them."""
    data = {**json.loads((FIX / f"{config}.json").read_text()), "enable_bias": False}
    spec = model_from_hf_config(data, config)
    assert (spec.bias, spec.norm_bias) == (False, True)
    assert F.params(spec) == _reference_count(data)


@pytest.mark.parametrize(
    ("config", "changes"),
    [("qwen3-30b-a3b", {"decoder_sparse_step": 2, "mlp_only_layers": [1, 6]}),
     ("llama-4-maverick-text", {"moe_layers": [0, 5, 47]}),
     ("deepseek-v2-lite", {"n_shared_experts": 0, "first_k_dense_replace": 4}),
     ("deepseek-v3", {"num_hidden_layers": 5, "q_lora_rank": None})],
)
def test_moe_layouts_match_transformers(config: str, changes: dict[str, object]) -> None:
    """Dense and MoE layers mixed as each config says, MLA without query compression, no
    shared expert: counted as transformers builds them."""
    data = {**json.loads((FIX / f"{config}.json").read_text()), **changes}
    assert F.params(model_from_hf_config(data, config)) == _reference_count(data)
