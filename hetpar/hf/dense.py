"""Dense ``transformers`` families past Llama's shape: parallel attention and MLP, ALiBi,
multi-query attention, partial rotary, QK-norm, multipliers, squared ReLU (each family's
``configuration_*.py`` and ``modeling_*.py`` in transformers 5.25 give keys and defaults)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hetpar.errors import ConfigError
from hetpar.hf.family import GATED, LLAMA_KEYS, Family

_GPT2: dict[str, tuple[str, ...]] = {
    "n_layers": ("n_layer",), "hidden": ("n_embd",), "n_heads": ("n_head",),
    "n_kv_heads": (), "ffn_hidden": ("n_inner",), "vocab": ("vocab_size",),
}
_GELU_LN: dict[str, Any] = {"mlp": "gelu", "norm": "layernorm"}

DENSE_FAMILIES: dict[str, Family] = {
    # Falcon: fused QKV, parallel attention and MLP, bias-free linears beside biased
    # LayerNorms; heads and norms per layer follow new_decoder_architecture (falcon())
    "falcon": Family(
        keys={**LLAMA_KEYS, "n_kv_heads": (), "ffn_hidden": ("ffn_hidden_size",)}, ffn_factor=4,
        fixed={**_GELU_LN, "position": "rope"}, tied_default=True,
        bias_keys=("bias",), norm_bias=True, window_default=2048),
    # GPT-J: one LayerNorm feeds attention and MLP; bias-free attention, biased MLP and LM head
    "gptj": Family(
        keys=_GPT2, ffn_factor=4, window_keys=("n_positions",), tied_default=False,
        fixed={**_GELU_LN, "position": "rope", "bias": True, "attention_bias": False,
               "parallel_attention": True, "norms_per_layer": 1, "lm_head_bias": True}),
    # BLOOM: ALiBi, a LayerNorm after the word embedding, biases everywhere; trained at 2048
    # tokens (BigScience 2022, arXiv:2211.05100 Sec. 3.4), which its config does not state
    "bloom": Family(
        keys={**LLAMA_KEYS, "n_layers": ("n_layer", "num_hidden_layers"),
              "hidden": ("hidden_size", "n_embed"), "n_heads": ("n_head", "num_attention_heads"),
              "n_kv_heads": (), "ffn_hidden": ()}, ffn_factor=4,
        fixed={**_GELU_LN, "position": "alibi", "bias": True, "embedding_norm": True},
        tied_default=True, window_keys=("seq_length",), window_default=2048),
    # StableLM(-2): SwiGLU under biased LayerNorms, Q/K/V biases only, a quarter rotated;
    # qk_layernorm is one bias-free LayerNorm per head (StableLmLayerNormPerHead)
    "stablelm": Family(
        keys=LLAMA_KEYS, fixed={**GATED, "norm": "layernorm", "norm_bias": True,
                            "qk_norm_shared": False}, tied_default=False,
        flags={"qkv_bias": ("use_qkv_bias", False), "qk_norm": ("qk_layernorm", False),
               "parallel_attention": ("use_parallel_residual", False)},
        rotary_key="partial_rotary_factor", rotary_default=0.25),
    # Phi(-1/2): parallel attention and MLP under one LayerNorm, biases everywhere incl. the
    # LM head; its qk_layernorm has biases hetpar's QK-norm does not count
    "phi": Family(
        keys=LLAMA_KEYS, tied_default=False, extra={"qk_layernorm": False},
        fixed={**_GELU_LN, "position": "rope", "bias": True, "parallel_attention": True,
               "norms_per_layer": 1, "lm_head_bias": True},
        rotary_key="partial_rotary_factor", rotary_default=0.5),
    # OLMo 1: LayerNorms without gain or bias (OlmoLayerNorm); attention_bias on Q/K/V/O only
    "olmo": Family(
        keys=LLAMA_KEYS, fixed={**GATED, "norm": "layernorm", "norm_affine": False},
        tied_default=False, flags={"attention_bias": ("attention_bias", False)}),
    # OLMo 2: RMSNorm after attention and MLP (two per layer), QK-norm over the whole Q and K
    # projections (Olmo2Attention.q_norm: RMSNorm(a d), k_norm: RMSNorm(g d))
    "olmo2": Family(
        keys=LLAMA_KEYS, fixed={**GATED, "qk_norm": True, "qk_norm_shared": False},
        tied_default=False, flags={"attention_bias": ("attention_bias", False)}),
    # StarCoder2: GQA, GELU MLP; use_bias reaches the linears only, the nn.LayerNorms keep
    # their bias; every layer attends to sliding_window keys (starcoder2())
    "starcoder2": Family(
        keys=LLAMA_KEYS, fixed={**_GELU_LN, "position": "rope"}, tied_default=True,
        bias_keys=("use_bias",), bias_default=True, norm_bias=True),
    # GPT-BigCode (StarCoder, SantaCoder): GPT-2 with multi-query attention (multi_query)
    "gpt_bigcode": Family(
        keys=_GPT2, ffn_factor=4, window_keys=("n_positions",), tied_default=True,
        fixed={**_GELU_LN, "position": "learned", "bias": True}),
    # Granite: Llama's shape with four scalar multipliers (GraniteConfig)
    "granite": Family(
        keys=LLAMA_KEYS, fixed=GATED, tied_default=False, bias_keys=("attention_bias", "mlp_bias"),
        floats={"embedding_multiplier": ("embedding_multiplier", 1.0),
                "residual_multiplier": ("residual_multiplier", 1.0),
                "attention_multiplier": ("attention_multiplier", 1.0)}),
    # Command-R (cohere): one bias-free LayerNorm feeds attention and MLP, logits scaled;
    # use_qk_norm (Command-R+) is a LayerNorm gain per head and element (CohereLayerNorm)
    "cohere": Family(
        keys=LLAMA_KEYS, tied_default=True,
        fixed={**GATED, "norm": "layernorm", "parallel_attention": True, "norms_per_layer": 1,
               "qk_norm_shared": False},
        flags={"qk_norm": ("use_qk_norm", False), "attention_bias": ("attention_bias", False)},
        floats={"logit_scale": ("logit_scale", 0.0625)}),
    # Nemotron: squared-ReLU MLP (up, down), LayerNorm1P with biases, half the head rotated
    "nemotron": Family(
        keys=LLAMA_KEYS, tied_default=False, head_dim_default=None, extra={"mlp_bias": False},
        fixed={"mlp": "relu2", "norm": "layernorm", "position": "rope", "bias": False,
               "norm_bias": True},
        flags={"attention_bias": ("attention_bias", False)},
        rotary_key="partial_rotary_factor", rotary_default=0.5),
    # MPT: transformers builds ALiBi, bias-free linears and LayerNorms and a 4h MLP whatever
    # the config says (modeling_mpt), so other settings are refused (mpt())
    "mpt": Family(
        keys={"n_layers": ("n_layers",), "hidden": ("d_model",), "n_heads": ("n_heads",),
              "n_kv_heads": (), "ffn_hidden": (), "vocab": ("vocab_size",)}, ffn_factor=4,
        fixed={**_GELU_LN, "position": "alibi", "bias": False}, tied_default=True,
        window_keys=("max_seq_len",), extra={"no_bias": True, "expansion_ratio": 4}),
    # GLM-4 (glm): Q/K/V biases (attention_bias), fused gate-up SwiGLU, half the head rotated
    "glm": Family(
        keys=LLAMA_KEYS, fixed=GATED, tied_default=False, head_dim_default=128,
        flags={"qkv_bias": ("attention_bias", True)},
        rotary_key="partial_rotary_factor", rotary_default=0.5),
    # GLM-4-0414 (glm4): also normalises after attention and after the MLP (4 norms per layer)
    "glm4": Family(
        keys=LLAMA_KEYS, fixed={**GATED, "norms_per_layer": 4}, tied_default=False,
        head_dim_default=128, flags={"qkv_bias": ("attention_bias", True)},
        rotary_key="partial_rotary_factor", rotary_default=0.5),
}

DENSE_ARCHITECTURES = {
    "FalconForCausalLM": "falcon", "GPTJForCausalLM": "gptj", "BloomForCausalLM": "bloom",
    "StableLmForCausalLM": "stablelm", "PhiForCausalLM": "phi", "OlmoForCausalLM": "olmo",
    "Olmo2ForCausalLM": "olmo2", "Starcoder2ForCausalLM": "starcoder2",
    "GPTBigCodeForCausalLM": "gpt_bigcode", "GraniteForCausalLM": "granite",
    "CohereForCausalLM": "cohere", "NemotronForCausalLM": "nemotron",
    "MPTForCausalLM": "mpt", "GlmForCausalLM": "glm", "Glm4ForCausalLM": "glm4",
}


def _switch(data: dict[str, Any], key: str, default: bool, where: str) -> bool:
    value = data.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: {key} must be true or false, got {value!r}")
    return value


def falcon(data: dict[str, Any], ints: dict[str, int], where: str) -> dict[str, Any]:
    """Falcon's heads and norms (modeling_falcon.FalconAttention, FalconDecoderLayer): K/V
    heads num_kv_heads under new_decoder_architecture or without multi_query, else 1; two
    LayerNorms unless parallel_attn with num_ln_in_parallel_attn 1 (its default outside the
    new architecture); ALiBi in place of rotary when alibi."""
    new = _switch(data, "new_decoder_architecture", False, where)
    mqa = _switch(data, "multi_query", True, where)
    parallel = _switch(data, "parallel_attn", True, where)
    a = ints["n_heads"]
    kv = data.get("num_kv_heads") or a
    if not new:  # transformers' fused QKV is h + 2 d (MQA) or 3 h wide outside new_decoder
        kv = 1 if mqa else a
    if isinstance(kv, bool) or not isinstance(kv, int) or kv < 1:
        raise ConfigError(f"{where}: num_kv_heads must be a positive integer, got {kv!r}")
    lns = data.get("num_ln_in_parallel_attn") or (2 if new else 1)
    if lns not in (1, 2):
        raise ConfigError(f"{where}: num_ln_in_parallel_attn must be 1 or 2, got {lns!r}")
    alibi = _switch(data, "alibi", False, where)
    return {"n_kv_heads": kv, "parallel_attention": parallel,
            "norms_per_layer": 2 if not parallel or lns == 2 else 1,
            **({"position": "alibi"} if alibi else {})}


def gptj(data: dict[str, Any], ints: dict[str, int], where: str) -> dict[str, Any]:
    """GPT-J rotates the first rotary_dim (default 64, GPTJConfig) of each head's width."""
    rd = data.get("rotary_dim", 64)
    d = ints["hidden"] // ints["n_heads"]
    if isinstance(rd, bool) or not isinstance(rd, int) or not 1 <= rd <= d:
        raise ConfigError(f"{where}: rotary_dim must be an integer in 1..{d}, got {rd!r}")
    return {"rotary_fraction": rd / d}


def gpt_bigcode(data: dict[str, Any], ints: dict[str, int], where: str) -> dict[str, Any]:
    """GPT-BigCode: one K/V head under multi_query (its default), else one per query head."""
    return {"n_kv_heads": 1 if _switch(data, "multi_query", True, where) else ints["n_heads"]}


def stablelm(data: dict[str, Any], ints: dict[str, int], where: str) -> dict[str, Any]:
    """StableLM's parallel residual drops the post-attention LayerNorm (StableLmDecoderLayer)."""
    parallel = _switch(data, "use_parallel_residual", False, where)
    return {"norms_per_layer": 1} if parallel else {}


def sliding_everywhere(data: dict[str, Any], ints: dict[str, int], where: str) -> dict[str, Any]:
    """StarCoder2 and Phi-3.5-MoE attend to sliding_window keys on every layer (no layer
    attends fully: interval past the last layer); a window as long as the context is none."""
    w = data.get("sliding_window")
    if w is None or w == data.get("max_position_embeddings"):
        return {}
    if isinstance(w, bool) or not isinstance(w, int) or w < 1:
        raise ConfigError(f"{where}: sliding_window must be a positive integer, got {w!r}")
    return {"sliding_window": w, "full_attention_interval": ints["n_layers"] + 1}


def granite(data: dict[str, Any], ints: dict[str, int], where: str) -> dict[str, Any]:
    """Granite divides the logits by logits_scaling (GraniteForCausalLM.forward)."""
    s = data.get("logits_scaling", 1.0)
    if isinstance(s, bool) or not isinstance(s, (int, float)) or s <= 0:
        raise ConfigError(f"{where}: logits_scaling must be a positive number, got {s!r}")
    return {"logit_scale": 1.0 / s}


def mpt(data: dict[str, Any], ints: dict[str, int], where: str) -> dict[str, Any]:
    """MPT's attn_config: transformers builds ALiBi multi-head attention without QK-norm only."""
    attn = data.get("attn_config") or {}
    if not isinstance(attn, dict):
        raise ConfigError(f"{where}: attn_config must be an object, got {attn!r}")
    for key, only in (("alibi", True), ("qk_ln", False), ("attn_type", "multihead_attention")):
        value = attn.get(key, only)
        if value != only:
            raise ConfigError(f"{where}: attn_config.{key}={value!r} is not representable "
                              f"(transformers builds {key}={only!r})")
    return {}


DENSE_SHAPERS: dict[str, Callable[[dict[str, Any], dict[str, int], str], dict[str, Any]]] = {
    "falcon": falcon, "gptj": gptj, "gpt_bigcode": gpt_bigcode, "stablelm": stablelm,
    "starcoder2": sliding_everywhere, "phimoe": sliding_everywhere, "granite": granite,
    "mpt": mpt,
}
"""model_type -> the ModelSpec fields its config sets beyond ``Family``'s declarations."""
