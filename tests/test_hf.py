"""Hugging Face config.json import: published parameter counts and strict errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hetpar import formulas as F
from hetpar.catalog import load_model
from hetpar.errors import ConfigError
from hetpar.hf.convert import DEFAULT_SEQ_LEN, model_from_hf_config
from hetpar.hf.families import supported

FIX = Path(__file__).parent / "fixtures" / "hf"

# Published totals (Hugging Face safetensors metadata / papers), with the reason for any slack.
PUBLISHED = [
    ("llama-3.1-8b", 8_030_261_248, 0.0),
    ("mistral-7b", 7_241_732_096, 0.0),
    ("mixtral-8x7b", 46_702_792_704, 0.0),
    ("gpt2", 124_439_808, 0.0),
    ("gpt-neox-20b", 20_554_567_680, 0.0),  # Black et al. 2022, Table 1
    ("pythia-160m", 162_322_944, 0.0),
    ("qwen2-7b", 7_615_616_512, 0.0),
    ("opt-125m", 125_239_296, 0.0),
    ("opt-350m", 331_196_416, 0.0),
    ("phi-3-mini-4k", 3_821_079_552, 0.0),
    ("gemma-7b", 8_537_680_896, 0.0),
    ("gemma-2-9b", 9_241_705_984, 0.0),
    ("gemma-3-1b", 999_885_952, 0.0),
    ("qwen3-8b", 8_190_735_360, 0.0),
    ("qwen3-0.6b", 596_049_920, 0.0),
    ("llama-3.2-1b", 1_235_814_400, 0.0),
    # the dense families' Hub safetensors totals (tiiuae/falcon-7b, bigscience/bloom-560m and
    # bloom-7b1, stabilityai/stablelm-2-1_6b, microsoft/phi-2, allenai/OLMo-7B-hf, OLMo-1B-hf,
    # OLMo-2-1124-7B, bigcode/starcoder2-3b, bigcode/starcoder, CohereForAI/c4ai-command-r-v01,
    # c4ai-command-r-plus, mosaicml/mpt-7b, THUDM/glm-4-9b-chat-hf)
    ("falcon-7b", 6_921_720_704, 0.0),
    ("bloom-560m", 559_214_592, 0.0),
    ("bloom-7b1", 7_069_016_064, 0.0),
    ("stablelm-2-1.6b", 1_644_515_328, 0.0),
    ("phi-2", 2_779_683_840, 0.0),
    ("olmo-7b", 6_888_095_744, 0.0),
    ("olmo-1b", 1_176_764_416, 0.0),
    ("olmo-2-1124-7b", 7_298_617_344, 0.0),
    ("starcoder2-3b", 3_030_371_328, 0.0),
    ("starcoder", 15_517_456_384, 0.0),
    ("command-r", 34_980_831_232, 0.0),
    ("command-r-plus", 103_810_674_688, 0.0),
    ("mpt-7b", 6_649_286_656, 0.0),
    ("glm-4-9b", 9_399_951_360, 0.0),
    # model cards' rounded totals: Falcon-40B "40B", GPT-J "6B" (6,053,381,344 on its card,
    # counted before transformers' conversion), Granite-3.0-8B "8B", Minitron-4B "4B"
    ("falcon-40b", 41.3e9, 0.01),
    ("gpt-j-6b", 6_053_381_344, 1e-3),
    ("granite-3.0-8b", 8.17e9, 0.01),
    ("minitron-4b", 4.19e9, 0.01),
    ("glm-4-9b-0414", 9.4e9, 0.01),
]


def load(name: str) -> dict[str, object]:
    data = json.loads((FIX / f"{name}.json").read_text())
    assert isinstance(data, dict)
    return data


@pytest.mark.parametrize(("name", "published", "rel"), PUBLISHED)
def test_published_parameter_counts(name: str, published: int, rel: float) -> None:
    m = model_from_hf_config(load(name), name)
    assert m.name == name
    assert F.params(m) == pytest.approx(published, rel=rel, abs=0)


def test_fields_mapped() -> None:
    m = model_from_hf_config(load("llama-3.1-8b"), "l")
    assert (m.n_layers, m.hidden, m.n_heads, m.n_kv_heads, m.ffn_hidden, m.vocab) == (
        32, 4096, 32, 8, 14336, 128256
    )
    assert (m.mlp, m.norm, m.position, m.bias, m.tied_embeddings) == (
        "swiglu", "rmsnorm", "rope", False, False
    )
    # hetpar's stated training length, not the 128K window (nor the 8K pre-extension one)
    assert m.seq_len == DEFAULT_SEQ_LEN == 4096
    assert "default training length" in m.source
    assert model_from_hf_config(load("llama-3.1-8b"), "l", seq_len=4096).seq_len == 4096
    g = model_from_hf_config(load("gpt2"), "g")
    assert (g.ffn_hidden, g.seq_len, g.tied_embeddings, g.position, g.mlp) == (
        3072, 1024, True, "learned", "gelu"
    )
    mx = model_from_hf_config(load("mixtral-8x7b"), "mx")
    assert (mx.n_experts, mx.experts_per_token) == (8, 2)
    assert model_from_hf_config(load("mistral-7b"), "m").seq_len == 4096
    # a learned table caps the default, and a longer length is refused
    assert model_from_hf_config(load("gpt2"), "g").seq_len == 1024
    with pytest.raises(ConfigError, match="seq_len 2048 exceeds the 1024 learned positions"):
        model_from_hf_config(load("gpt2"), "g", seq_len=2048)


def test_opt_and_qwen2_details() -> None:
    o = model_from_hf_config(load("opt-350m"), "o")
    assert (o.embed_dim, o.max_positions, o.final_norm, o.seq_len) == (512, 2050, False, 2048)
    assert load_model("opt-350m").embed_dim == 512  # the catalog preset agrees
    q = model_from_hf_config(load("qwen2-7b"), "q")
    assert (q.bias, q.qkv_bias) == (False, True)


@pytest.mark.parametrize(
    ("name", "key", "value"),
    [("qwen3-8b", "attention_bias", True),
     ("phi-2", "qk_layernorm", True), ("mpt-7b", "no_bias", False),
     ("mpt-7b", "expansion_ratio", 8), ("minitron-4b", "mlp_bias", True),
     ("mpt-7b", "attn_config", {"alibi": False}), ("mpt-7b", "attn_config", {"qk_ln": True})],
)
def test_unrepresentable_switches_refused(name: str, key: str, value: object) -> None:
    named = f"{key}.{next(iter(value))}" if isinstance(value, dict) else key  # attn_config.x
    with pytest.raises(ConfigError, match=f"{named}=.*not representable"):
        model_from_hf_config({**load(name), key: value}, name)


@pytest.mark.parametrize(
    ("name", "total", "active"),
    [("qwen1.5-moe-a2.7b", 14.3e9, 2.7e9), ("qwen3-30b-a3b", 30.5e9, 3.3e9),
     ("olmoe-1b-7b", 6.9e9, 1.3e9), ("phi-3.5-moe", 41.9e9, 6.6e9)],
)
def test_qwen_moe_model_card_counts(name: str, total: float, active: float) -> None:
    """Model cards: Qwen1.5-MoE-A2.7B 14.3B total / 2.7B activated (shared expert counted as
    active); Qwen3-30B-A3B 30.5B / 3.3B; OLMoE-1B-7B 6.9B / 1.3B (Muennighoff et al. 2024);
    Phi-3.5-MoE 41.9B / 6.6B. Exact totals: tests/test_hf_parity.py."""
    m = model_from_hf_config(load(name), name)
    assert F.params(m) == pytest.approx(total, rel=5e-3)
    assert F.active_params(m) == pytest.approx(active, rel=2e-2)


def test_qwen_moe_fields_mapped() -> None:
    q = model_from_hf_config(load("qwen1.5-moe-a2.7b"), "q")
    assert (q.n_experts, q.experts_per_token, q.moe_ffn_hidden, q.shared_expert_ffn_hidden) == (
        60, 4, 1408, 5632)
    assert (q.shared_expert_gate, q.qkv_bias, q.bias, q.qk_norm) == (True, True, False, False)
    q3 = model_from_hf_config(load("qwen3-30b-a3b"), "q3")
    assert (q3.n_experts, q3.moe_ffn_hidden, q3.shared_expert_ffn_hidden, q3.qk_norm) == (
        128, 768, None, True)


@pytest.mark.parametrize(
    ("name", "key", "value"),
    [("qwen1.5-moe-a2.7b", "num_experts", 1),
     ("mixtral-8x7b", "num_local_experts", 1), ("qwen3-30b-a3b", "attention_bias", True),
     ("qwen1.5-moe-a2.7b", "qkv_bias", False), ("deepseek-v3", "moe_layer_freq", 2),
     ("deepseek-v2-lite", "mlp_bias", True), ("gpt-oss-20b", "attention_bias", False),
     ("gpt-oss-20b", "layer_types", ["full_attention"] * 24),
     ("llama-4-scout-text", "attention_bias", True)],
)
def test_unrepresentable_moe_layouts_refused(name: str, key: str, value: object) -> None:
    with pytest.raises(ConfigError, match=f"{key}=.*not representable"):
        model_from_hf_config({**load(name), key: value}, name)


@pytest.mark.parametrize(("model_type", "what"), [("llama4", "text_config"),
                                                  ("gemma3", "vision tower"),
                                                  ("falcon_h1", "hybrid layers"),
                                                  ("bamba", "hybrid layers")])
def test_known_uncountable_architectures_refused(model_type: str, what: str) -> None:
    with pytest.raises(ConfigError, match=f"model_type '{model_type}' is not supported: .*{what}"):
        model_from_hf_config({"model_type": model_type}, "x")


@pytest.mark.parametrize(
    ("name", "changes", "flags"),
    [  # transformers: layer i is sparse when (i + 1) % step == 0 and i not in mlp_only_layers
        ("qwen3-30b-a3b", {"decoder_sparse_step": 2}, [i % 2 == 1 for i in range(48)]),
        ("qwen3-30b-a3b", {"mlp_only_layers": [0, 5]}, [i not in (0, 5) for i in range(48)]),
        ("qwen1.5-moe-a2.7b", {"decoder_sparse_step": 3, "mlp_only_layers": [2]},
         [i % 3 == 2 and i != 2 for i in range(24)]),
        ("deepseek-v3", {}, [i >= 3 for i in range(61)]),
        ("llama-4-maverick-text", {}, [i % 2 == 1 for i in range(48)]),
        ("llama-4-maverick-text", {"moe_layers": [0, 47]}, [i in (0, 47) for i in range(48)]),
    ],
)
def test_moe_layers_follow_the_config(name: str, changes: dict[str, object],
                                      flags: list[bool]) -> None:
    """Which layers are MoE: Qwen's decoder_sparse_step and mlp_only_layers, DeepSeek's
    first_k_dense_replace, Llama 4's interleave_moe_layer_step and moe_layers (counts against
    transformers: tests/test_hf_parity.py)."""
    m = model_from_hf_config({**load(name), **changes}, name)
    assert [F.is_moe_layer(m, i) for i in range(m.n_layers)] == flags


def test_deepseek_fields_mapped() -> None:
    v3 = model_from_hf_config(load("deepseek-v3"), "v3")
    assert (v3.attention, v3.q_lora_rank, v3.kv_lora_rank, v3.qk_rope_head_dim,
            v3.qk_nope_head_dim, v3.v_head_dim) == ("mla", 1536, 512, 64, 128, 128)
    assert (v3.n_experts, v3.experts_per_token, v3.moe_ffn_hidden, v3.shared_expert_ffn_hidden,
            v3.first_dense_layers, v3.router, v3.router_expert_bias) == (
        256, 8, 2048, 2048, 3, "sigmoid", True)
    lite = model_from_hf_config(load("deepseek-v2-lite"), "lite")
    assert (lite.q_lora_rank, lite.shared_expert_ffn_hidden, lite.router) == (
        None, 2 * 1408, "softmax")


def test_gpt_oss_and_llama4_fields_mapped() -> None:
    g = model_from_hf_config(load("gpt-oss-120b"), "g")
    assert (g.bias, g.router_bias, g.attention_sinks, g.sliding_window,
            g.full_attention_interval, g.head_dim) == (True, True, True, 128, 2, 64)
    s = model_from_hf_config(load("llama-4-scout-text"), "s")
    assert (s.ffn_hidden, s.moe_ffn_hidden, s.shared_expert_ffn_hidden, s.n_experts,
            s.experts_per_token, s.router) == (16384, 8192, 8192, 16, 1, "sigmoid")


def test_architectures_used_when_model_type_absent() -> None:
    data = load("mistral-7b")
    del data["model_type"]
    assert model_from_hf_config(data, "m") == model_from_hf_config(load("mistral-7b"), "m")


def test_head_dim_kept_only_when_it_differs() -> None:
    data = {**load("mistral-7b"), "head_dim": 128}
    assert model_from_hf_config(data, "m").head_dim is None
    data["head_dim"] = 96
    m = model_from_hf_config(data, "m")
    assert m.dim_head == 96
    assert F.attention_params(m) == 4096 * (32 * 96 + 2 * 8 * 96) + 32 * 96 * 4096


def test_unknown_architecture_lists_supported() -> None:
    with pytest.raises(ConfigError, match="supported model_type: .*llama.*mixtral"):
        model_from_hf_config({"model_type": "bert", "architectures": ["BertModel"]}, "b")
    assert "gpt_neox" in supported()


@pytest.mark.parametrize("key", ["hidden_size", "num_hidden_layers", "vocab_size"])
def test_missing_field_named(key: str) -> None:
    data = load("llama-3.1-8b")
    del data[key]
    with pytest.raises(ConfigError, match=f"missing key '{key}'"):
        model_from_hf_config(data, "l")


@pytest.mark.parametrize(
    ("key", "value"),
    [("hidden_size", "4096"), ("num_attention_heads", 0), ("vocab_size", True),
     ("tie_word_embeddings", "no"), ("num_key_value_heads", 7), ("intermediate_size", 1.5)],
)
def test_bad_values_rejected(key: str, value: object) -> None:
    data = {**load("llama-3.1-8b"), key: value}
    with pytest.raises(ConfigError, match=key if key != "num_key_value_heads" else "n_kv_heads"):
        model_from_hf_config(data, "l")


def test_load_model_routes_config_json(tmp_path: Path) -> None:
    d = tmp_path / "Mixtral-8x7B"
    d.mkdir()
    (d / "config.json").write_text((FIX / "mixtral-8x7b.json").read_text())
    m = load_model(str(d / "config.json"))
    assert m.name == "Mixtral-8x7B"
    assert F.active_params(m) == pytest.approx(12.9e9, rel=5e-3)


def test_structural_rules_mapped() -> None:
    """Each structural rule reaches its ModelSpec field (counts: tests/test_hf_parity.py)."""
    f7 = model_from_hf_config(load("falcon-7b"), "f")
    assert (f7.parallel_attention, f7.norms_per_layer, f7.n_kv_heads, f7.bias, f7.norm_bias,
            f7.tied_embeddings, f7.seq_len) == (True, 1, 1, False, True, True, 2048)
    f40 = model_from_hf_config(load("falcon-40b"), "f")
    assert (f40.norms_per_layer, f40.n_kv_heads) == (2, 8)
    j = model_from_hf_config(load("gpt-j-6b"), "j")
    assert (j.attention_bias, j.lm_head_bias, j.rotary_fraction, j.norms_per_layer) == (
        False, True, 0.25, 1)
    b = model_from_hf_config(load("bloom-7b1"), "b")
    assert (b.position, b.embedding_norm, b.seq_len) == ("alibi", True, 2048)
    assert model_from_hf_config(load("mpt-7b"), "m").position == "alibi"
    assert model_from_hf_config(load("starcoder"), "s").n_kv_heads == 1
    assert model_from_hf_config(load("stablelm-2-1.6b"), "s").rotary_fraction == 0.25
    assert model_from_hf_config(load("phi-2"), "p").rotary_fraction == 0.4
    assert model_from_hf_config(load("pythia-160m"), "p").rotary_fraction == 0.25
    o2 = model_from_hf_config(load("olmo-2-1124-7b"), "o")
    assert (o2.qk_norm, o2.qk_norm_shared) == (True, False)
    assert model_from_hf_config(load("olmo-7b"), "o").norm_affine is False
    g = model_from_hf_config(load("granite-3.0-8b"), "g")
    assert (g.embedding_multiplier, g.residual_multiplier, g.attention_multiplier,
            g.logit_scale) == (12.0, 0.22, 0.0078125, 1 / 16)
    c = model_from_hf_config(load("command-r"), "c")
    assert (c.parallel_attention, c.norms_per_layer, c.logit_scale, c.norm_has_bias) == (
        True, 1, 0.0625, False)
    n = model_from_hf_config(load("minitron-4b"), "n")
    assert (n.mlp, n.rotary_fraction, n.dim_head) == ("relu2", 0.5, 128)
    assert model_from_hf_config(load("glm-4-9b-0414"), "g").norms_per_layer == 4
    s2 = model_from_hf_config(load("starcoder2-3b"), "s", seq_len=16384)
    assert (s2.sliding_window, F.attended_keys(s2, 16384)) == (4096, 4096.0)


def test_structural_rules_keep_the_flops() -> None:
    """Parallel attention, partial rotary, ALiBi and multipliers hold no weights: a token's
    matmul FLOPs are those of the same shape without them (formulas/flops.py counts GEMMs)."""
    from dataclasses import replace
    c = model_from_hf_config(load("command-r"), "c")
    plain = replace(c, parallel_attention=False, logit_scale=1.0, rotary_fraction=1.0)
    assert F.model_flops_per_token(c, 4096) == F.model_flops_per_token(plain, 4096)
    b = model_from_hf_config(load("bloom-560m"), "b")
    assert F.model_flops_per_token(b, 2048) == F.model_flops_per_token(
        replace(b, position="rope"), 2048)


def test_extending_doc_lists_every_supported_model_type() -> None:
    """docs/extending.md's supported() listing is what supported() returns."""
    import re
    doc = (Path(__file__).parents[1] / "docs" / "extending.md").read_text()
    block = doc[doc.index("print(supported())"):doc.index("cfg = {")]
    listed = re.findall(r"'([a-z0-9_]+)'", block)
    assert listed == supported()
    assert f"# {len(listed)} model_types" in block
