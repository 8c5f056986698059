"""Model description: a dense (or mixture-of-experts) decoder-only transformer's shape."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hetpar.errors import ConfigError

MlpKind = Literal["gelu", "swiglu"]
NormKind = Literal["layernorm", "rmsnorm"]
PositionKind = Literal["learned", "rope", "alibi"]


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """Shape of a decoder-only transformer; everything else (params, FLOPs) is derived."""

    name: str
    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    ffn_hidden: int
    """MLP inner width (for a gated MLP, the width of each of the gate and up projections)."""
    vocab: int
    seq_len: int
    """Default (training) sequence length; a job may override it."""
    mlp: MlpKind = "gelu"
    norm: NormKind = "layernorm"
    position: PositionKind = "learned"
    tied_embeddings: bool = False
    bias: bool = True
    """Biases on the attention and MLP linear layers and, unless ``norm_bias`` says otherwise,
    on the LayerNorms (the LM head, router and embedding projections never have one)."""
    norm_bias: bool | None = None
    """Biases on the LayerNorms (None: as ``bias``; OPT without linear biases keeps them).
    RMSNorm has none (Zhang & Sennrich 2019), so ``true`` needs ``norm = "layernorm"``."""
    head_dim: int | None = None
    """Per-head width; defaults to hidden / n_heads."""
    n_experts: int = 1
    """Mixture-of-experts: experts per MoE layer (1 = dense)."""
    experts_per_token: int = 1
    moe_layer_interval: int = 1
    moe_ffn_hidden: int | None = None
    """Inner width of each routed expert (None: ``ffn_hidden``; Qwen-MoE's
    ``moe_intermediate_size``, Megatron's ``--moe-ffn-hidden-size``)."""
    shared_expert_ffn_hidden: int | None = None
    """Inner width of an always-active shared expert in each MoE layer (None: none;
    Qwen1.5-MoE: 5632, Megatron's ``--moe-shared-expert-intermediate-size``)."""
    shared_expert_gate: bool = False
    """A sigmoid gate h -> 1 scaling the shared expert's output (Qwen2-MoE)."""
    qkv_bias: bool | None = None
    """Biases on the Q, K and V projections only (None: as ``bias``; Qwen2: true, bias false)."""
    embed_dim: int | None = None
    """Word-embedding width when narrower than ``hidden`` (OPT-350m's ``word_embed_proj_dim``):
    the model then projects e -> h after the embedding and h -> e before the LM head."""
    max_positions: int | None = None
    """Rows of a learned position table (None: ``seq_len``); OPT keeps 2 rows more."""
    norms_per_layer: int = 2
    """Normalisations per layer (Gemma 2/3 also normalise after attention and MLP: 4)."""
    qk_norm: bool = False
    """A norm over each query and key head (Qwen3, Gemma 3): 2 x head-width gains per layer."""
    final_norm: bool = True
    """A norm before the LM head (post-LayerNorm OPT-350m has none)."""
    source: str = ""
    """Where the shape comes from (paper, model card)."""

    def __post_init__(self) -> None:
        for f in ("n_layers", "hidden", "n_heads", "n_kv_heads", "ffn_hidden", "vocab", "seq_len"):
            v = getattr(self, f)
            if v < 1:
                raise ConfigError(f"model {self.name!r}: {f} must be >= 1, got {v}")
        for f, v in (
            ("moe_layer_interval", self.moe_layer_interval),
            ("head_dim", self.head_dim),
            ("embed_dim", self.embed_dim),
            ("max_positions", self.max_positions),
            ("norms_per_layer", self.norms_per_layer),
            ("moe_ffn_hidden", self.moe_ffn_hidden),
            ("shared_expert_ffn_hidden", self.shared_expert_ffn_hidden),
        ):
            if v is not None and v < 1:
                raise ConfigError(f"model {self.name!r}: {f} must be >= 1, got {v}")
        if self.n_kv_heads > self.n_heads or self.n_heads % self.n_kv_heads:
            raise ConfigError(
                f"model {self.name!r}: n_kv_heads ({self.n_kv_heads}) must divide "
                f"n_heads ({self.n_heads})"
            )
        if self.head_dim is None and self.hidden % self.n_heads:
            raise ConfigError(
                f"model {self.name!r}: hidden ({self.hidden}) not divisible by "
                f"n_heads ({self.n_heads}); set head_dim"
            )
        if self.n_experts < 1 or not 1 <= self.experts_per_token <= self.n_experts:
            raise ConfigError(
                f"model {self.name!r}: experts_per_token ({self.experts_per_token}) must be in "
                f"1..n_experts ({self.n_experts})"
            )

        rows = self.max_positions
        if self.position == "learned" and rows is not None and rows < self.seq_len:
            raise ConfigError(
                f"model {self.name!r}: max_positions ({rows}) must be >= seq_len "
                f"({self.seq_len}): a learned position table needs a row per position"
            )
        if self.norm_bias and self.norm != "layernorm":
            raise ConfigError(
                f"model {self.name!r}: norm_bias = true needs norm = 'layernorm', got "
                f"{self.norm!r} (RMSNorm has no bias)"
            )
        if self.shared_expert_gate and self.shared_expert_ffn_hidden is None:
            raise ConfigError(
                f"model {self.name!r}: shared_expert_gate needs shared_expert_ffn_hidden"
            )

    @property
    def norm_has_bias(self) -> bool:
        """Whether each norm has a bias besides its gain (LayerNorm unless bias-free)."""
        if self.norm != "layernorm":
            return False
        return self.bias if self.norm_bias is None else self.norm_bias

    @property
    def expert_ffn(self) -> int:
        """Inner width of one routed expert."""
        return self.moe_ffn_hidden if self.moe_ffn_hidden is not None else self.ffn_hidden

    @property
    def dim_head(self) -> int:
        """Width of one attention head."""
        return self.head_dim if self.head_dim is not None else self.hidden // self.n_heads
