"""The ``transformers`` architectures hetpar imports: each family's config keys and fixed shape."""

from __future__ import annotations

from typing import Any

from hetpar.errors import ConfigError
from hetpar.hf.dense import DENSE_ARCHITECTURES, DENSE_FAMILIES
from hetpar.hf.family import GATED, LLAMA_KEYS, Family

__all__ = ["ARCHITECTURES", "FAMILIES", "REFUSED", "Family", "family_name", "supported"]


_MOE_KEYS: dict[str, tuple[str, ...]] = {
    "n_experts": ("num_local_experts",),
    "experts_per_token": ("num_experts_per_tok",),
}
_QWEN_MOE_KEYS: dict[str, tuple[str, ...]] = {
    **LLAMA_KEYS,
    "n_experts": ("num_experts",),
    "experts_per_token": ("num_experts_per_tok",),
    "moe_ffn_hidden": ("moe_intermediate_size",),
}


_DEEPSEEK_KEYS: dict[str, tuple[str, ...]] = {
    **LLAMA_KEYS,
    "n_experts": ("n_routed_experts",),
    "experts_per_token": ("num_experts_per_tok",),
    "moe_ffn_hidden": ("moe_intermediate_size",),
}


def _gemma(**fixed: Any) -> Family:
    """Gemma 1-3: GeGLU (three matrices, like SwiGLU), tied, head_dim 256 by default."""
    return Family(keys=LLAMA_KEYS, fixed={**GATED, **fixed}, tied_default=True,
                   bias_keys=("attention_bias",), head_dim_default=256)


FAMILIES: dict[str, Family] = {
    "llama": Family(keys=LLAMA_KEYS, fixed=GATED, tied_default=False,
                     bias_keys=("attention_bias", "mlp_bias")),
    "mistral": Family(keys=LLAMA_KEYS, fixed=GATED, tied_default=False),
    # Qwen2: biases on Q, K and V only (modeling_qwen2.Qwen2Attention)
    "qwen2": Family(keys=LLAMA_KEYS, fixed={**GATED, "qkv_bias": True}, tied_default=False),
    # Qwen3: no Q/K/V bias, an RMSNorm over each query and key head, head_dim 128 by default
    "qwen3": Family(keys=LLAMA_KEYS, fixed={**GATED, "qk_norm": True}, tied_default=False,
                     head_dim_default=128, extra={"attention_bias": False}),
    "phi3": Family(keys=LLAMA_KEYS, fixed=GATED, tied_default=False),
    "gemma": _gemma(),
    # Gemma 2 and 3 also normalise after attention and after the MLP (4 norms per layer)
    "gemma2": _gemma(norms_per_layer=4),
    "gemma3_text": _gemma(norms_per_layer=4, qk_norm=True),
    "mixtral": Family(keys={**LLAMA_KEYS, **_MOE_KEYS}, fixed=GATED, tied_default=False,
                       defaults={"n_experts": 8, "experts_per_token": 2}),
    # Qwen2-MoE (Qwen1.5-MoE): Qwen2's Q/K/V biases; each MoE layer has E experts of width
    # moe_intermediate_size plus a shared expert behind a sigmoid gate (modeling_qwen2_moe)
    "qwen2_moe": Family(
        keys={**_QWEN_MOE_KEYS, "shared_expert_ffn_hidden": ("shared_expert_intermediate_size",)},
        fixed={**GATED, "qkv_bias": True, "shared_expert_gate": True}, tied_default=False,
        defaults={"n_experts": 60, "experts_per_token": 4, "moe_ffn_hidden": 1408,
                  "shared_expert_ffn_hidden": 5632},
        extra={"qkv_bias": True}),
    # Qwen3-MoE: Qwen3's attention (QK-norm, no biases), routed experts only
    "qwen3_moe": Family(
        keys=_QWEN_MOE_KEYS, fixed={**GATED, "qk_norm": True}, tied_default=False,
        defaults={"n_experts": 128, "experts_per_token": 8, "moe_ffn_hidden": 768},
        extra={"attention_bias": False}),
    # DeepSeek-V2/V3: multi-head latent attention, first_k_dense_replace dense layers, shared
    # experts (hetpar/hf/moe.py::deepseek); transformers builds MoE on every layer from
    # first_k_dense_replace on, whatever moe_layer_freq says, so only 1 is representable
    "deepseek_v2": Family(
        keys={**_DEEPSEEK_KEYS}, fixed=GATED, tied_default=False,
        defaults={"n_experts": 64, "moe_ffn_hidden": 1407},
        extra={"attention_bias": False, "mlp_bias": False, "moe_layer_freq": 1}),
    "deepseek_v3": Family(
        keys={**_DEEPSEEK_KEYS}, fixed=GATED, tied_default=False,
        defaults={"n_experts": 256, "experts_per_token": 8, "moe_ffn_hidden": 2048},
        extra={"attention_bias": False, "moe_layer_freq": 1}),
    # GPT-OSS: every layer MoE with biased experts and router, biased attention with sinks
    # (modeling_gpt_oss); attention_bias false would leave the experts' biases, so is refused
    "gpt_oss": Family(
        keys={**LLAMA_KEYS, **_MOE_KEYS}, fixed={**GATED, "bias": True}, tied_default=False,
        head_dim_default=64, defaults={"n_experts": 128, "experts_per_token": 4},
        extra={"attention_bias": True}),
    # Llama 4 text: dense layers intermediate_size_mlp wide, experts intermediate_size wide,
    # a weightless QK L2-norm (no parameters: Llama4TextL2Norm)
    "llama4_text": Family(
        keys={**LLAMA_KEYS, **_MOE_KEYS, "ffn_hidden": ("intermediate_size_mlp",),
              "moe_ffn_hidden": ("intermediate_size",)},
        fixed=GATED, tied_default=False, head_dim_default=128,
        defaults={"n_experts": 16, "experts_per_token": 1, "ffn_hidden": 16384,
                  "moe_ffn_hidden": 8192},
        extra={"attention_bias": False}),
    # OLMoE: every layer E experts of intermediate_size, OLMo-2's QK-norm over the whole Q and
    # K projections (modeling_olmoe.OlmoeAttention), no shared expert, an unbiased router
    "olmoe": Family(
        keys={**LLAMA_KEYS, "n_experts": ("num_experts", "num_local_experts"),
              "experts_per_token": ("num_experts_per_tok",)},
        fixed={**GATED, "qk_norm": True, "qk_norm_shared": False}, tied_default=False,
        defaults={"n_experts": 64, "experts_per_token": 8},
        flags={"attention_bias": ("attention_bias", False)}),
    # Phi-3.5-MoE (phimoe): Mixtral's experts under biased LayerNorms, attention_bias on Q, K,
    # V and O, lm_head_bias on the LM head (modeling_phimoe)
    "phimoe": Family(
        keys={**LLAMA_KEYS, **_MOE_KEYS}, tied_default=False,
        fixed={**GATED, "norm": "layernorm", "norm_bias": True},
        defaults={"n_experts": 16, "experts_per_token": 2},
        flags={"attention_bias": ("attention_bias", False),
               "lm_head_bias": ("lm_head_bias", False)}),
    "gpt2": Family(
        keys={"n_layers": ("n_layer",), "hidden": ("n_embd",), "n_heads": ("n_head",),
              "vocab": ("vocab_size",)},
        fixed={"mlp": "gelu", "norm": "layernorm", "position": "learned", "bias": True},
        tied_default=True,
        window_keys=("n_positions", "n_ctx"),
    ),
    # GPT-NeoX: attention_bias switches the attention's biases; its MLP always has them
    "gpt_neox": Family(
        keys={**LLAMA_KEYS, "n_kv_heads": ()},
        fixed={"mlp": "gelu", "norm": "layernorm", "position": "rope"},
        tied_default=False,
        flags={"parallel_attention": ("use_parallel_residual", True),
               "attention_bias": ("attention_bias", True)},
        rotary_key="rotary_pct", rotary_default=0.25,
    ),
    # OPT: ReLU MLP (two matrices, like GELU); a word_embed_proj_dim narrower than hidden
    # adds bias-free in/out projections; post-LN sizes (do_layer_norm_before false) have no
    # final norm; the position table has 2 rows past the window (modeling_opt).
    "opt": Family(
        keys={**LLAMA_KEYS, "n_kv_heads": (), "ffn_hidden": ("ffn_dim",)},
        fixed={"mlp": "gelu", "norm": "layernorm", "position": "learned"},
        tied_default=True,
        bias_keys=("enable_bias",),
        bias_default=True,
        norm_bias=True,  # enable_bias reaches the nn.Linear layers only, not the nn.LayerNorms
        position_offset=2,
        flags={"norm_affine": ("layer_norm_elementwise_affine", True)},
    ),
    **DENSE_FAMILIES,
}

ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Phi3ForCausalLM": "phi3",
    "GemmaForCausalLM": "gemma",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3_text",
    "MixtralForCausalLM": "mixtral",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "DeepseekV2ForCausalLM": "deepseek_v2",
    "DeepseekV3ForCausalLM": "deepseek_v3",
    "GptOssForCausalLM": "gpt_oss",
    "Llama4ForCausalLM": "llama4_text",
    "OlmoeForCausalLM": "olmoe",
    "PhimoeForCausalLM": "phimoe",
    "PhiMoEForCausalLM": "phimoe",  # the Hub config's remote-code class name
    "GPT2LMHeadModel": "gpt2",
    "GPTNeoXForCausalLM": "gpt_neox",
    "OPTForCausalLM": "opt",
    **DENSE_ARCHITECTURES,
}


REFUSED: dict[str, str] = {
    "llama4": "the multimodal model's vision tower is not modelled; load its text_config "
              "(model_type llama4_text)",
    "gemma3": "the multimodal model's vision tower is not modelled; load its text_config "
              "(model_type gemma3_text)",
    **{t: "state-space (Mamba) layers are not modelled: hetpar counts attention and MLP "
          "layers only" for t in ("mamba", "mamba2", "jamba", "nemotron_h", "falcon_h1",
                                  "zamba2", "bamba", "granitemoehybrid")},
}
"""model_type values recognised but refused: what hetpar cannot count exactly."""


def supported() -> list[str]:
    """The ``model_type`` values this importer understands."""
    return sorted(FAMILIES)


def family_name(data: dict[str, Any]) -> str:
    mt = data.get("model_type")
    if isinstance(mt, str) and mt in FAMILIES:
        return mt
    if isinstance(mt, str) and mt in REFUSED:
        raise ConfigError(f"hf config: model_type {mt!r} is not supported: {REFUSED[mt]}")
    archs = data.get("architectures")
    if isinstance(archs, list):
        for a in archs:
            if isinstance(a, str) and a in ARCHITECTURES:
                return ARCHITECTURES[a]
    shown = mt if mt is not None else archs
    raise ConfigError(
        f"hf config: unsupported model_type/architectures {shown!r}; "
        f"supported model_type: {', '.join(supported())}"
    )
