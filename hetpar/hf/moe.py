"""Fields of MoE and MLA ``config.json``s beyond the common keys: which layers are MoE, the
router, shared experts, multi-head latent attention (DeepSeek, GPT-OSS, Llama 4, Qwen-MoE)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hetpar.errors import ConfigError

_REQUIRED = object()


def _get(data: dict[str, Any], key: str, where: str, default: Any = _REQUIRED) -> Any:
    value = data.get(key)
    if value is None:
        if default is _REQUIRED:
            raise ConfigError(f"{where}: missing key {key!r}")
        return default
    return value


def _count(data: dict[str, Any], key: str, where: str, default: Any = _REQUIRED,
           low: int = 1) -> int:
    value = _get(data, key, where, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"{where}: {key} must be an integer >= {low}, got {value!r}")
    return value


def _layer_list(data: dict[str, Any], key: str, where: str, n_layers: int) -> list[int]:
    value = _get(data, key, where, [])
    if not isinstance(value, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) and 0 <= i < n_layers for i in value
    ):
        raise ConfigError(f"{where}: {key} must be a list of layer indices in 0..{n_layers - 1}, "
                          f"got {value!r}")
    return value


def _every_kth(step: int, listed: list[int] | None, n_layers: int) -> dict[str, Any]:
    """MoE on layers i with (i + 1) % step == 0 (Qwen-MoE's decoder_sparse_step, Llama 4's
    interleave_moe_layer_step), minus ``listed`` dense layers: hetpar's first_dense_layers
    step - 1 and interval step, or an explicit pattern when layers are listed."""
    if not listed:
        return {"first_dense_layers": step - 1, "moe_layer_interval": step} if step > 1 else {}
    flags = [int((i + 1) % step == 0 and i not in listed) for i in range(n_layers)]
    return {"moe_layer_pattern": tuple(flags)}


def qwen_moe(data: dict[str, Any], ints: dict[str, int], where: str) -> dict[str, Any]:
    """Qwen2/3-MoE: layer i is sparse when i is not in mlp_only_layers and
    (i + 1) % decoder_sparse_step == 0 (modeling_qwen2_moe.Qwen2MoeDecoderLayer); the other
    layers have a dense MLP of intermediate_size."""
    n = ints["n_layers"]
    step = _count(data, "decoder_sparse_step", where, 1)
    return _every_kth(step, _layer_list(data, "mlp_only_layers", where, n), n)


def deepseek(data: dict[str, Any], ints: dict[str, int], where: str) -> dict[str, Any]:
    """DeepSeek-V2/V3: MLA widths, first_k_dense_replace dense layers, n_shared_experts
    shared experts fused into one MLP of n_shared x moe_intermediate_size
    (modeling_deepseek_v3.DeepseekV3MoE), and the router's scoring (V3: sigmoid with the
    auxiliary-loss-free bias, ``topk_method = "noaux_tc"``; V2: softmax)."""
    v3 = data.get("model_type") == "deepseek_v3"
    out: dict[str, Any] = {"attention": "mla"}
    for key in ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
        out[key] = _count(data, key, where, {"kv_lora_rank": 512, "qk_rope_head_dim": 64,
                                             "qk_nope_head_dim": 128, "v_head_dim": 128}[key])
    q_rank = data.get("q_lora_rank", 1536)
    out["q_lora_rank"] = None if q_rank is None else _count(data, "q_lora_rank", where)
    out["first_dense_layers"] = _count(data, "first_k_dense_replace", where, 3 if v3 else 0, 0)
    shared = _count(data, "n_shared_experts", where, 1 if v3 else 2, 0)
    if shared:
        out["shared_expert_ffn_hidden"] = shared * ints["moe_ffn_hidden"]
    scoring = _get(data, "scoring_func", where, "sigmoid" if v3 else "softmax")
    if scoring not in ("softmax", "sigmoid"):
        raise ConfigError(f"{where}: scoring_func={scoring!r} is not allowed; allowed: "
                          "softmax, sigmoid")
    out["router"] = scoring
    out["router_expert_bias"] = _get(data, "topk_method", where,
                                     "noaux_tc" if v3 else "greedy") == "noaux_tc"
    return out


def gpt_oss(data: dict[str, Any], ints: dict[str, int], where: str) -> dict[str, Any]:
    """GPT-OSS: attention sinks, biases on attention, router and experts, and layer_types
    alternating sliding-window (even layers) and full attention (configuration_gpt_oss)."""
    n = ints["n_layers"]
    window = _count(data, "sliding_window", where, 128)
    expected = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]
    types = data.get("layer_types")
    if types is not None and types != expected:
        raise ConfigError(f"{where}: layer_types={types!r} is not representable (hetpar models "
                          "GPT-OSS's alternation: sliding, full, sliding, ...)")
    return {"attention_sinks": True, "router_bias": True, "sliding_window": window,
            "full_attention_interval": 2}


def llama4(data: dict[str, Any], ints: dict[str, int], where: str) -> dict[str, Any]:
    """Llama 4 (text): MoE layers are moe_layers, else every interleave_moe_layer_step-th
    (configuration_llama4.Llama4TextConfig); each has a shared expert as wide as the routed
    ones (modeling_llama4.Llama4TextMoe), dense layers intermediate_size_mlp wide; a sigmoid
    router."""
    n = ints["n_layers"]
    out: dict[str, Any] = {"shared_expert_ffn_hidden": ints["moe_ffn_hidden"],
                           "router": "sigmoid"}
    listed = data.get("moe_layers")
    if listed is not None:
        layers = set(_layer_list(data, "moe_layers", where, n))
        return {**out, "moe_layer_pattern": tuple(int(i in layers) for i in range(n))}
    step = _count(data, "interleave_moe_layer_step", where, 1)
    return {**out, **_every_kth(step, None, n)}


SHAPERS: dict[str, Callable[[dict[str, Any], dict[str, int], str], dict[str, Any]]] = {
    "qwen2_moe": qwen_moe, "qwen3_moe": qwen_moe, "deepseek_v2": deepseek,
    "deepseek_v3": deepseek, "gpt_oss": gpt_oss, "llama4_text": llama4,
}
"""model_type -> the ModelSpec fields its config sets beyond ``Family.keys``."""
