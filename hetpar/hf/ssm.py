"""State-space and hybrid ``transformers`` families: Mamba, Mamba-2, Jamba, Nemotron-H
(configuration_*.py and modeling_*.py of transformers 5.25 give keys and defaults)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from hetpar.errors import ConfigError
from hetpar.hf.family import LLAMA_KEYS, Family

_NO_POSITIONS = 4096
"""Context window of a config that states none (Mamba, Mamba-2: a recurrence has no position
table); hetpar.hf.convert.DEFAULT_SEQ_LEN, the training length it then defaults to."""
_SSM_ONLY: dict[str, tuple[str, ...]] = {
    "n_layers": ("num_hidden_layers",), "hidden": ("hidden_size",),
    "n_heads": ("num_attention_heads",), "n_kv_heads": (), "ffn_hidden": (),
    "vocab": ("vocab_size",),
}
"""Mamba's keys: no attention or MLP, so one nominal head and an MLP width never counted."""
_RMS_NO_POS: dict[str, Any] = {"mlp": "swiglu", "norm": "rmsnorm", "position": "none",
                               "bias": False}

SSM_FAMILIES: dict[str, Family] = {
    # Mamba: RMSNorm then a Mamba mixer per layer (MambaBlock), norm_f, tied by default
    "mamba": Family(keys=_SSM_ONLY, fixed=_RMS_NO_POS, tied_default=True, ffn_factor=2,
                    defaults={"n_heads": 1}, window_default=_NO_POSITIONS),
    # Mamba-2: the same block with the SSD mixer (Mamba2Block), untied by default
    "mamba2": Family(keys=_SSM_ONLY, fixed=_RMS_NO_POS, tied_default=False, ffn_factor=2,
                     defaults={"n_heads": 1}, window_default=_NO_POSITIONS),
    # Jamba: every layer a mixer (attention without positions, or Mamba with dt/B/C norms)
    # then a SwiGLU MLP or MoE (JambaAttentionDecoderLayer, JambaMambaDecoderLayer)
    "jamba": Family(keys={**LLAMA_KEYS, "n_experts": ("num_experts",),
                          "experts_per_token": ("num_experts_per_tok",)},
                    fixed=_RMS_NO_POS, tied_default=False, window_default=262144,
                    defaults={"n_experts": 16, "experts_per_token": 2}, one_expert_dense=True),
    # Nemotron-H: one block per pattern letter (NemotronHBlock): Mamba-2, attention without
    # positions (head_dim 128) or a squared-ReLU MLP, each behind an RMSNorm
    # (num_hidden_layers is optional there: the block pattern's length decides, nemotron_h())
    "nemotron_h": Family(keys=LLAMA_KEYS, tied_default=False, head_dim_default=128,
                         window_default=4096, defaults={"n_layers": 52},
                         fixed={**_RMS_NO_POS, "mlp": "relu2"}, extra={"mlp_bias": False},
                         flags={"attention_bias": ("attention_bias", False)}),
}

SSM_ARCHITECTURES = {"MambaForCausalLM": "mamba", "Mamba2ForCausalLM": "mamba2",
                     "JambaForCausalLM": "jamba", "NemotronHForCausalLM": "nemotron_h"}


def _int(data: dict[str, Any], keys: tuple[str, ...], default: int, where: str) -> int:
    """The first of ``keys`` present (newer name first), else ``default``; positive ints only."""
    v = next((data[k] for k in keys if data.get(k) is not None), default)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ConfigError(f"{where}: {keys[0]} must be a positive integer, got {v!r}")
    return v


def _flag(data: dict[str, Any], keys: tuple[str, ...], default: bool, where: str) -> bool:
    v = next((data[k] for k in keys if data.get(k) is not None), default)
    if not isinstance(v, bool):
        raise ConfigError(f"{where}: {keys[0]} must be true or false, got {v!r}")
    return v


def _dt_rank(data: dict[str, Any], key: str, hidden: int, where: str) -> int:
    """``"auto"`` is ceil(hidden / 16) (MambaConfig, JambaConfig)."""
    v = data.get(key, "auto")
    return math.ceil(hidden / 16) if v == "auto" else _int(data, (key,), 1, where)


def _kv_heads(data: dict[str, Any]) -> dict[str, Any]:
    # Jamba's and Nemotron-H's dataclass default is 8 K/V heads; only an explicit null means
    # one per query head (their __post_init__)
    return {} if "num_key_value_heads" in data else {"n_kv_heads": 8}


def mamba(data: dict[str, Any], ints: dict[str, int], where: str) -> dict[str, Any]:
    """Mamba: d_inner = expand x hidden (MambaConfig.__post_init__)."""
    h = ints["hidden"]
    ssm = {"kind": "mamba", "inner": _int(data, ("expand",), 2, where) * h,
           "state_size": _int(data, ("state_size",), 16, where),
           "conv_width": _int(data, ("conv_kernel",), 4, where),
           "dt_rank": _dt_rank(data, "time_step_rank", h, where),
           "conv_bias": _flag(data, ("use_conv_bias",), True, where),
           "proj_bias": _flag(data, ("use_bias",), False, where)}
    return {"ssm": ssm, "layer_kinds": ["ssm"] * ints["n_layers"]}


def mamba2(data: dict[str, Any], ints: dict[str, int], where: str) -> dict[str, Any]:
    """Mamba-2: d_inner = expand x hidden (Mamba2Mixer), heads and groups as configured."""
    ssm = {"kind": "mamba2", "inner": _int(data, ("expand",), 2, where) * ints["hidden"],
           "heads": _int(data, ("num_heads",), 128, where),
           "groups": _int(data, ("n_groups",), 8, where),
           "state_size": _int(data, ("state_size",), 128, where),
           "conv_width": _int(data, ("conv_kernel",), 4, where),
           "chunk": _int(data, ("chunk_size",), 256, where),
           "conv_bias": _flag(data, ("use_conv_bias",), True, where),
           "proj_bias": _flag(data, ("use_bias",), False, where)}
    return {"ssm": ssm, "layer_kinds": ["ssm"] * ints["n_layers"]}


def jamba(data: dict[str, Any], ints: dict[str, int], where: str) -> dict[str, Any]:
    """Jamba's layer i attends when i % attn_layer_period == attn_layer_offset and is MoE when
    i % expert_layer_period == expert_layer_offset (JambaConfig.layers_block_type,
    layers_num_experts)."""
    h, n = ints["hidden"], ints["n_layers"]
    ap, ao = (_int(data, (k,), d, where) for k, d in (("attn_layer_period", 8),
                                                       ("attn_layer_offset", 4)))
    ep, eo = (_int(data, (k,), d, where) for k, d in (("expert_layer_period", 2),
                                                       ("expert_layer_offset", 1)))
    kinds = ["attention+mlp" if i % ap == ao else "ssm+mlp" for i in range(n)]
    ssm = {"kind": "mamba", "inner": _int(data, ("mamba_expand",), 2, where) * h,
           "state_size": _int(data, ("mamba_d_state",), 16, where),
           "conv_width": _int(data, ("mamba_d_conv",), 4, where),
           "dt_rank": _dt_rank(data, "mamba_dt_rank", h, where), "dt_norms": True,
           "conv_bias": _flag(data, ("mamba_conv_bias",), True, where),
           "proj_bias": _flag(data, ("mamba_proj_bias",), False, where)}
    moe = [int(i % ep == eo) for i in range(n)] if ints["n_experts"] > 1 else None
    out = {"ssm": ssm, "layer_kinds": kinds, "moe_layer_pattern": moe, **_kv_heads(data),
           **({} if moe else {"experts_per_token": 1})}  # one expert: dense MLPs everywhere
    if "ssm+mlp" not in kinds:
        del out["ssm"]
    return out


_NEMOTRON_H = {"M": "ssm", "*": "attention", "-": "mlp", "E": "mlp", "linear_attention": "ssm",
               "mamba": "ssm", "full_attention": "attention", "attention": "attention",
               "mlp": "mlp", "moe": "mlp"}
"""Nemotron-H's block letters and names -> hetpar's layer kinds (E / moe: an MoE MLP)."""


def nemotron_h(data: dict[str, Any], ints: dict[str, int], where: str) -> dict[str, Any]:
    """Nemotron-H's blocks from hybrid_override_pattern (M Mamba-2, * attention, - MLP) or
    the list layers_block_type / layer_types; its length is the layer count, whatever
    num_hidden_layers says (NemotronHConfig.num_hidden_layers). MoE blocks (E) are
    ``_nemotron_h_moe``'s."""
    raw = data.get("hybrid_override_pattern")
    pattern = list(raw) if isinstance(raw, str) else data.get("layers_block_type") or \
        data.get("layer_types")
    if not isinstance(pattern, list) or not pattern:
        raise ConfigError(f"{where}: missing key 'hybrid_override_pattern' (the block per layer)")
    bad = [p for p in pattern if p not in _NEMOTRON_H]
    if bad:
        raise ConfigError(f"{where}: block {bad[0]!r} is not representable (hetpar builds "
                          "M, *, -, E blocks: Mamba-2, attention, MLP, MoE)")
    kinds = [_NEMOTRON_H[p] for p in pattern]
    ssm = {"kind": "mamba2",
           "inner": _int(data, ("mamba_num_heads",), 128, where)
           * _int(data, ("mamba_head_dim",), 64, where),
           "heads": _int(data, ("mamba_num_heads",), 128, where),
           "groups": _int(data, ("n_groups", "mamba_n_groups"), 8, where),
           "state_size": _int(data, ("ssm_state_size",), 128, where),
           "conv_width": _int(data, ("conv_kernel", "mamba_d_conv"), 4, where),
           "chunk": _int(data, ("chunk_size", "mamba_chunk_size"), 128, where),
           "conv_bias": _flag(data, ("use_conv_bias", "mamba_conv_bias"), True, where),
           "proj_bias": _flag(data, ("use_bias",), False, where)}
    moe = [int(p in ("E", "moe")) for p in pattern]
    return {"n_layers": len(kinds), "layer_kinds": kinds, **_kv_heads(data),
            **({"ssm": ssm} if "ssm" in kinds else {}), **_nemotron_h_moe(data, moe, where)}


def _nemotron_h_moe(data: dict[str, Any], moe: list[int], where: str) -> dict[str, Any]:
    """Nemotron-H's MoE blocks (modeling_nemotron_h.NemotronHMoE): n_routed_experts squared-ReLU
    experts moe_intermediate_size wide, a bias-free h -> E sigmoid router whose
    e_score_correction_bias is a buffer (no parameter), and a shared squared-ReLU MLP
    moe_shared_expert_intermediate_size wide; no MoE block: a dense model."""
    if not any(moe):
        return {"n_experts": 1, "experts_per_token": 1}
    if data.get("moe_latent_size") is not None:
        raise ConfigError(f"{where}: moe_latent_size={data['moe_latent_size']!r} is not "
                          "representable (hetpar models moe_latent_size=None)")
    return {"n_experts": _int(data, ("n_routed_experts",), 8, where),
            "experts_per_token": _int(data, ("num_experts_per_tok",), 2, where),
            "moe_ffn_hidden": _int(data, ("moe_intermediate_size",), 7688, where),
            "shared_expert_ffn_hidden": _int(data, ("moe_shared_expert_intermediate_size",),
                                             7688, where),
            "moe_layer_pattern": moe, "router": "sigmoid", "router_expert_bias": True}


SSM_SHAPERS: dict[str, Callable[[dict[str, Any], dict[str, int], str], dict[str, Any]]] = {
    "mamba": mamba, "mamba2": mamba2, "jamba": jamba, "nemotron_h": nemotron_h,
}
"""model_type -> the layer kinds and the ``ssm`` mixer its config sets."""
