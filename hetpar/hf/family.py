"""One ``transformers`` architecture as data: which config keys give which ModelSpec fields."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

LLAMA_KEYS: dict[str, tuple[str, ...]] = {
    "n_layers": ("num_hidden_layers",),
    "hidden": ("hidden_size",),
    "n_heads": ("num_attention_heads",),
    "n_kv_heads": ("num_key_value_heads",),
    "ffn_hidden": ("intermediate_size",),
    "vocab": ("vocab_size",),
}
"""The config keys of Llama and the families that copied its names."""
GATED: dict[str, Any] = {"mlp": "swiglu", "norm": "rmsnorm", "position": "rope", "bias": False}
"""Llama's block: SwiGLU MLP, RMSNorm, rotary positions, no biases."""


@dataclass(frozen=True, kw_only=True)
class Family:
    """How one ``transformers`` architecture names the shape (its documented config keys)."""

    keys: dict[str, tuple[str, ...]]
    """ModelSpec field -> config keys tried in order (older key spellings after newer ones)."""
    fixed: dict[str, Any]
    """ModelSpec fields that the architecture fixes (MLP kind, norm, positions, biases)."""
    tied_default: bool
    """``tie_word_embeddings`` when the config omits it (the architecture's own default)."""
    bias_keys: tuple[str, ...] = ()
    """Boolean config keys that switch all linear biases (each must agree; none: fixed)."""
    bias_default: bool = False
    """The architecture's default for ``bias_keys``."""
    norm_bias: bool | None = None
    """Whether the LayerNorms keep a bias whatever ``bias_keys`` say (None: as the biases)."""
    head_dim_default: int | None = None
    """``head_dim`` when the config omits it (None: hidden / heads)."""
    window_keys: tuple[str, ...] = ("max_position_embeddings",)
    """The context window (learned positions: the table's rows)."""
    position_offset: int = 0
    """Extra learned-position rows past the window (OPT: 2, its padding offset)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Config key -> the only value hetpar can represent (others are refused)."""
    defaults: dict[str, int] = field(default_factory=dict)
    """ModelSpec field -> the architecture's default when the config omits its key."""
    flags: dict[str, tuple[str, bool]] = field(default_factory=dict)
    """ModelSpec boolean field -> (config key, the architecture's default): switches such as
    GPT-NeoX's ``use_parallel_residual`` or StableLM's ``use_qkv_bias``."""
    floats: dict[str, tuple[str, float]] = field(default_factory=dict)
    """ModelSpec float field -> (config key, default): Granite's and Command-R's multipliers."""
    rotary_key: str | None = None
    """Config key of the rotated share of each head (``partial_rotary_factor``; also read
    from ``rope_parameters``, where transformers 5 keeps it); None: all of it."""
    rotary_default: float = 1.0
    """The architecture's rotated share when the config omits ``rotary_key``."""
    window_default: int | None = None
    """Context window when the config has none of ``window_keys`` (ALiBi models)."""
    ffn_factor: int | None = None
    """MLP width as a multiple of ``hidden`` when the config omits ``keys["ffn_hidden"]``."""
