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


# catalog presets written from a Hugging Face config.json that is a fixture here
PRESETS = {"opt-350m": "opt-350m", "llama3.1-8b": "llama-3.1-8b", "mixtral-8x7b": "mixtral-8x7b"}


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
