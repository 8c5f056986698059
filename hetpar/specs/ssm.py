"""State-space (Mamba, Mamba-2) mixers and the per-layer kinds of hybrid models."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hetpar.errors import ConfigError

SsmKind = Literal["mamba", "mamba2"]
LayerKind = Literal["attention+mlp", "ssm+mlp", "ssm", "attention", "mlp"]
LAYER_KINDS: tuple[LayerKind, ...] = ("attention+mlp", "ssm+mlp", "ssm", "attention", "mlp")
"""What one layer holds, each part behind its own pre-norm: ``attention+mlp`` is the
transformer layer; ``ssm+mlp`` a Mamba mixer then an MLP (Jamba's Mamba layers); ``ssm``,
``attention`` and ``mlp`` a single part (Mamba's and Nemotron-H's blocks ``M``, ``*``, ``-``,
Megatron-LM's ``hybrid_override_pattern``)."""
TRANSFORMER_LAYER: LayerKind = "attention+mlp"
"""The layer of a model without ``layer_kinds``."""


def has_attention(kind: LayerKind) -> bool:
    """Whether a layer of ``kind`` runs self-attention."""
    return kind.startswith("attention")


def has_ssm(kind: LayerKind) -> bool:
    """Whether a layer of ``kind`` runs a state-space mixer."""
    return kind.startswith("ssm")


def has_mlp(kind: LayerKind) -> bool:
    """Whether a layer of ``kind`` runs an MLP (dense or mixture-of-experts)."""
    return kind.endswith("mlp")


def norms_of(kind: LayerKind, norms_per_layer: int) -> int:
    """Norms of one layer: ``norms_per_layer`` for two parts, one for a single part."""
    return norms_per_layer if "+" in kind else 1


@dataclass(frozen=True, kw_only=True)
class SsmSpec:
    """Shape of a selective state-space mixer (Gu & Dao 2023, arXiv:2312.00752, Alg. 2;
    Mamba-2: Dao & Gu 2024, arXiv:2405.21060, Sec. 7), as transformers 5.25 builds it
    (modeling_mamba.MambaMixer, modeling_mamba2.Mamba2Mixer)."""

    kind: SsmKind
    """``mamba``: per-channel diagonal A (d_inner x N) and a low-rank dt projection;
    ``mamba2``: scalar A per head, B and C shared within groups (SSD)."""
    inner: int
    """Width d_inner of the expanded stream (expand x hidden; Nemotron-H: heads x head_dim)."""
    state_size: int
    """State size N per channel (Mamba: 16, Mamba-2: 128)."""
    conv_width: int
    """Width K of the causal depthwise convolution (4)."""
    heads: int = 1
    """Mamba-2: heads H (each inner / H wide); Mamba: 1."""
    groups: int = 1
    """Mamba-2: groups G sharing one B and one C (like GQA's KV heads); Mamba: 1."""
    dt_rank: int | None = None
    """Mamba: rank of the dt projection (default ceil(hidden / 16)); Mamba-2: none."""
    chunk: int = 256
    """Mamba-2: SSD chunk length Q (transformers' chunk_size: 256; Nemotron-H: 128)."""
    conv_bias: bool = True
    """A bias on the convolution (use_conv_bias)."""
    proj_bias: bool = False
    """Biases on the in and out projections (use_bias, Jamba's mamba_proj_bias)."""
    dt_norms: bool = False
    """Jamba: RMSNorm gains on dt, B and C (JambaMambaMixer.dt_layernorm, b_, c_layernorm)."""

    def __post_init__(self) -> None:
        for f in ("inner", "state_size", "conv_width", "heads", "groups", "chunk"):
            if getattr(self, f) < 1:
                raise ConfigError(f"ssm: {f} must be >= 1, got {getattr(self, f)}")
        if self.kind == "mamba" and (self.dt_rank is None or self.dt_rank < 1):
            raise ConfigError(f"ssm: kind 'mamba' needs dt_rank >= 1, got {self.dt_rank}")
        if self.kind == "mamba2" and (self.dt_rank is not None or self.dt_norms):
            raise ConfigError("ssm: kind 'mamba2' takes no dt_rank or dt_norms (dt is a head "
                              "output of in_proj)")
        if self.inner % self.heads or self.heads % self.groups:
            raise ConfigError(f"ssm: heads ({self.heads}) must divide inner ({self.inner}) and "
                              f"groups ({self.groups}) must divide heads")

    @property
    def conv_channels(self) -> int:
        """Channels of the convolution: x (Mamba), or x, B and C (Mamba-2)."""
        return self.inner + (2 * self.groups * self.state_size if self.kind == "mamba2" else 0)


def check_layers(name: str, n_layers: int, kinds: tuple[LayerKind, ...] | None,
                 ssm: SsmSpec | None, moe_flags: tuple[bool, ...]) -> None:
    """Refuse a layer list of the wrong length, SSM layers without ``ssm`` (or the reverse),
    and mixture-of-experts flags on layers without an MLP."""
    if kinds is None:
        if ssm is not None:
            raise ConfigError(f"model {name!r}: ssm needs layer_kinds (which layers are SSM)")
        return
    if len(kinds) != n_layers:
        raise ConfigError(f"model {name!r}: layer_kinds must list {n_layers} layers (n_layers), "
                          f"got {len(kinds)}")
    if any(has_ssm(k) for k in kinds) != (ssm is not None):
        raise ConfigError(f"model {name!r}: ssm must be given exactly when layer_kinds has an "
                          f"ssm layer (ssm {'given' if ssm else 'missing'})")
    bad = [i for i, (k, moe) in enumerate(zip(kinds, moe_flags, strict=True))
           if moe and not has_mlp(k)]
    if bad:
        raise ConfigError(f"model {name!r}: layer {bad[0]} is {kinds[bad[0]]!r}, which has no MLP "
                          "to be a mixture-of-experts layer")
