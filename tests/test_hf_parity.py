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
# out). The dense fixtures carry the shape keys of tiiuae/falcon-7b and falcon-40b,
# EleutherAI/gpt-j-6b, bigscience/bloom-560m and bloom-7b1, stabilityai/stablelm-2-1_6b,
# microsoft/phi-2, allenai/OLMo-1B-hf, OLMo-7B-hf and OLMo-2-1124-7B, bigcode/starcoder2-3b
# and starcoder (gpt_bigcode), ibm-granite/granite-3.0-8b-base, CohereForAI/c4ai-command-r-v01
# and c4ai-command-r-plus, nvidia/Minitron-4B-Base (nemotron), mosaicml/mpt-7b,
# THUDM/glm-4-9b-chat-hf (glm), THUDM/GLM-4-9B-0414 (glm4), allenai/OLMoE-1B-7B-0924 (olmoe)
# and microsoft/Phi-3.5-MoE-instruct (phimoe); the state-space fixtures those of
# state-spaces/mamba-130m-hf, mistralai/Mamba-Codestral-7B-v0.1 (mamba2), ai21labs/Jamba-v0.1
# and nvidia/Nemotron-H-8B-Base-8K (nemotron_h); keys that hold no parameters
# (dropout, eps, token ids, rope scaling) kept only where the config has them.
PRESETS = {"opt-350m": "opt-350m", "llama3.1-8b": "llama-3.1-8b", "mixtral-8x7b": "mixtral-8x7b",
           "mixtral-8x22b": "mixtral-8x22b", "deepseek-v3": "deepseek-v3",
           "qwen3-30b-a3b": "qwen3-30b-a3b", "qwen3-235b-a22b": "qwen3-235b-a22b",
           "gpt-oss-20b": "gpt-oss-20b", "gpt-oss-120b": "gpt-oss-120b",
           "jamba-v0.1": "jamba-v0.1", "nemotron-h-8b": "nemotron-h-8b"}


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


@pytest.mark.parametrize(
    ("config", "changes"),
    [("gpt-neox-20b", {"attention_bias": False}),
     ("pythia-160m", {"use_parallel_residual": False}),
     ("opt-125m", {"layer_norm_elementwise_affine": False}),
     ("falcon-7b", {"parallel_attn": False, "multi_query": False}),
     ("falcon-7b", {"alibi": True, "num_ln_in_parallel_attn": 2}),
     ("falcon-40b", {"num_ln_in_parallel_attn": 1, "num_kv_heads": 16}),
     ("gpt-j-6b", {"rotary_dim": 256, "n_inner": 8192}),
     ("starcoder", {"multi_query": False}),
     ("stablelm-2-1.6b", {"qk_layernorm": True, "use_parallel_residual": True,
                          "num_key_value_heads": 8}),
     ("olmo-7b", {"attention_bias": True}),
     ("olmo-2-1124-7b", {"num_key_value_heads": 8}),
     ("command-r", {"use_qk_norm": True, "attention_bias": True, "num_key_value_heads": 8}),
     ("minitron-4b", {"attention_bias": True}),
     ("glm-4-9b", {"attention_bias": False}),
     ("granite-3.0-8b", {"attention_bias": True, "mlp_bias": True}),
     ("starcoder2-3b", {"use_bias": False}),
     ("llama-3.1-8b", {"mlp_bias": True}), ("llama-3.2-1b", {"attention_bias": True})],
)
def test_structural_switches_match_transformers(config: str, changes: dict[str, object]) -> None:
    """Each family's switches (parallel residual, per-part biases, affine-free norms,
    multi-query, QK-norm widths, norms per layer): counted as transformers builds them."""
    data = {**json.loads((FIX / f"{config}.json").read_text()), **changes}
    assert F.params(model_from_hf_config(data, config)) == _reference_count(data)
