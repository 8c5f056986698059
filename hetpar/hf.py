"""Hugging Face ``config.json`` (Llama, Mistral, Qwen2, GPT-2, NeoX, OPT, Mixtral) -> ModelSpec."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hetpar.errors import ConfigError
from hetpar.io import from_dict
from hetpar.specs.model import ModelSpec

_REQUIRED = object()


@dataclass(frozen=True, kw_only=True)
class _Family:
    """How one ``transformers`` architecture names the shape (its documented config keys)."""

    keys: dict[str, tuple[str, ...]]
    """ModelSpec field -> config keys tried in order (older key spellings after newer ones)."""
    fixed: dict[str, Any]
    """ModelSpec fields that the architecture fixes (MLP kind, norm, positions, biases)."""
    tied_default: bool
    """``tie_word_embeddings`` when the config omits it (the architecture's own default)."""
    bias_key: str | None = None
    """Boolean config key that switches the linear biases (None: fixed by the architecture)."""
    bias_default: bool = False
    """The architecture's default for ``bias_key``."""


_LLAMA_KEYS: dict[str, tuple[str, ...]] = {
    "n_layers": ("num_hidden_layers",),
    "hidden": ("hidden_size",),
    "n_heads": ("num_attention_heads",),
    "n_kv_heads": ("num_key_value_heads",),
    "ffn_hidden": ("intermediate_size",),
    "vocab": ("vocab_size",),
    "seq_len": ("max_position_embeddings",),
}
_GATED: dict[str, Any] = {"mlp": "swiglu", "norm": "rmsnorm", "position": "rope", "bias": False}
_MOE_KEYS: dict[str, tuple[str, ...]] = {
    "n_experts": ("num_local_experts",),
    "experts_per_token": ("num_experts_per_tok",),
}

FAMILIES: dict[str, _Family] = {
    "llama": _Family(keys=_LLAMA_KEYS, fixed=_GATED, tied_default=False, bias_key="attention_bias"),
    "mistral": _Family(keys=_LLAMA_KEYS, fixed=_GATED, tied_default=False),
    # Qwen2 has biases on Q, K and V only (~0.002% of params); counted as bias-free here.
    "qwen2": _Family(keys=_LLAMA_KEYS, fixed=_GATED, tied_default=False),
    "mixtral": _Family(keys={**_LLAMA_KEYS, **_MOE_KEYS}, fixed=_GATED, tied_default=False),
    "gpt2": _Family(
        keys={"n_layers": ("n_layer",), "hidden": ("n_embd",), "n_heads": ("n_head",),
              "vocab": ("vocab_size",), "seq_len": ("n_positions", "n_ctx")},
        fixed={"mlp": "gelu", "norm": "layernorm", "position": "learned", "bias": True},
        tied_default=True,
    ),
    "gpt_neox": _Family(
        keys={**_LLAMA_KEYS, "n_kv_heads": ()},
        fixed={"mlp": "gelu", "norm": "layernorm", "position": "rope"},
        tied_default=False,
        bias_key="attention_bias",
        bias_default=True,
    ),
    # OPT's ReLU MLP has two matrices like GELU; OPT-350m's 512-wide embeddings with in/out
    # projections (word_embed_proj_dim) are approximated as hidden-wide.
    "opt": _Family(
        keys={**_LLAMA_KEYS, "n_kv_heads": (), "ffn_hidden": ("ffn_dim",)},
        fixed={"mlp": "gelu", "norm": "layernorm", "position": "learned"},
        tied_default=True,
        bias_key="enable_bias",
        bias_default=True,
    ),
}

ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "MixtralForCausalLM": "mixtral",
    "GPT2LMHeadModel": "gpt2",
    "GPTNeoXForCausalLM": "gpt_neox",
    "OPTForCausalLM": "opt",
}


def supported() -> list[str]:
    """The ``model_type`` values this importer understands."""
    return sorted(FAMILIES)


def _family_name(data: dict[str, Any]) -> str:
    mt = data.get("model_type")
    if isinstance(mt, str) and mt in FAMILIES:
        return mt
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


def _get(data: dict[str, Any], keys: tuple[str, ...], where: str, default: Any = _REQUIRED) -> Any:
    for k in keys:
        if k in data and data[k] is not None:
            return data[k]
    if default is _REQUIRED:
        raise ConfigError(f"{where}: missing key {keys[0]!r}")
    return default


def _positive_int(value: Any, where: str, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{where}: {key} must be a positive integer, got {value!r}")
    return value


def _bool(value: Any, where: str, key: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: {key} must be true or false, got {value!r}")
    return value


def _training_seq_len(data: dict[str, Any], seq_len: int, learned: bool) -> int:
    # RoPE models extended to long context (Llama 3.1's rope_scaling) record the
    # pre-training context; learned positions must keep the table size for the param count.
    scaling = data.get("rope_scaling")
    if not learned and isinstance(scaling, dict):
        orig = scaling.get("original_max_position_embeddings")
        if isinstance(orig, int) and not isinstance(orig, bool) and 1 <= orig < seq_len:
            return orig
    return seq_len


def _shape(data: dict[str, Any], fam: _Family, where: str) -> dict[str, int]:
    """The integer shape fields, with the defaults ``transformers`` documents."""
    ints: dict[str, int] = {}
    for field, keys in fam.keys.items():
        if not keys:
            continue
        default: Any = _REQUIRED
        if field == "n_kv_heads":  # absent = multi-head attention
            default = ints["n_heads"]
        elif field in ("n_experts", "experts_per_token"):
            default = 1
        ints[field] = _positive_int(_get(data, keys, where, default), where, keys[0])
    ints.setdefault("n_kv_heads", ints["n_heads"])
    if "ffn_hidden" not in ints:  # GPT-2: n_inner, default 4 x n_embd
        inner = _get(data, ("n_inner",), where, 4 * ints["hidden"])
        ints["ffn_hidden"] = _positive_int(inner, where, "n_inner")
    return ints


def model_from_hf_config(data: dict[str, Any], name: str, seq_len: int | None = None) -> ModelSpec:
    """Build a ModelSpec from a Hugging Face ``config.json`` dict.

    The architecture comes from ``model_type`` (or ``architectures``); fields use each
    architecture's documented key names and defaults. ``seq_len`` overrides the default
    training length (``max_position_embeddings``, or the pre-extension length of RoPE
    scaling). Unknown architectures and missing or mistyped keys raise ConfigError.
    """
    if not isinstance(data, dict):
        raise ConfigError(f"hf config {name!r}: expected an object, got {type(data).__name__}")
    fam_name = _family_name(data)
    fam = FAMILIES[fam_name]
    where = f"hf config {name!r} ({fam_name})"
    ints = _shape(data, fam, where)
    fixed = dict(fam.fixed)
    if fam.bias_key is not None:
        bias = _get(data, (fam.bias_key,), where, fam.bias_default)
        fixed["bias"] = _bool(bias, where, fam.bias_key)
    tied = _get(data, ("tie_word_embeddings",), where, fam.tied_default)
    tied = _bool(tied, where, "tie_word_embeddings")
    head_dim = data.get("head_dim")
    if head_dim is not None:
        head_dim = _positive_int(head_dim, where, "head_dim")
        if head_dim * ints["n_heads"] == ints["hidden"]:
            head_dim = None  # the default; keeps the spec minimal
    learned = fixed["position"] == "learned"
    ints["seq_len"] = seq_len or _training_seq_len(data, ints["seq_len"], learned)
    source = data.get("_name_or_path")
    spec = {**ints, **fixed, "name": name, "tied_embeddings": tied, "head_dim": head_dim,
            "source": f"Hugging Face config.json ({source or fam_name})"}
    return from_dict(ModelSpec, spec, where)
