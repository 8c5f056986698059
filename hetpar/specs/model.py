"""Model description: a dense (or mixture-of-experts) decoder-only transformer's shape."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hetpar.errors import ConfigError
from hetpar.specs.ssm import TRANSFORMER_LAYER, LayerKind, SsmSpec, check_layers

MlpKind = Literal["gelu", "swiglu", "relu2"]
NormKind = Literal["layernorm", "rmsnorm"]
PositionKind = Literal["learned", "rope", "alibi", "none"]
"""``none``: attention without positions (Jamba, Nemotron-H: the Mamba layers order tokens)."""
AttentionKind = Literal["gqa", "mla"]
RouterKind = Literal["softmax", "sigmoid"]
MAX_LAYERS = 1 << 16
"""Most layers a model may state: 500 x the deepest published LLM (Megatron-LM's 1T GPT, 128
layers, Narayanan et al. SC21 Table 1); 1e12 was a MemoryError building per-layer tables."""
MLA_FIELDS = ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
"""Multi-head latent attention's widths that ``attention = "mla"`` requires (q_lora_rank is
optional: DeepSeek-V2-Lite projects queries without compressing them)."""


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
    """``gelu``: two matrices with a pointwise activation (GELU, ReLU); ``swiglu``: gated,
    three matrices; ``relu2``: two matrices with squared ReLU (Nemotron: So et al. 2021,
    Primer; transformers' ``relu2``), counted like ``gelu``."""
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
    """Every k-th layer after the first dense ones is MoE: layer i when i >= first_dense_layers
    and (i - first_dense_layers) % k == 0 (Megatron-Core's integer ``moe_layer_freq``; Llama 4
    Maverick's ``interleave_moe_layer_step`` 2 is first_dense_layers 1, interval 2)."""
    first_dense_layers: int = 0
    """Leading layers with a dense MLP (DeepSeek-V3's ``first_k_dense_replace``: 3)."""
    moe_layer_pattern: tuple[int, ...] | None = None
    """An explicit 0/1 flag per layer (1 = MoE), overriding ``moe_layer_interval`` and
    ``first_dense_layers`` (Megatron-Core's list ``moe_layer_freq``; Qwen-MoE's
    ``mlp_only_layers``)."""
    router: RouterKind = "softmax"
    """Expert scores: softmax (Mixtral, Qwen-MoE, GPT-OSS, DeepSeek-V2) or sigmoid (DeepSeek-V3,
    Llama 4); only the routing, not the counts, depends on it."""
    router_bias: bool = False
    """A learned bias on the router's h -> E linear layer (GPT-OSS), counted as E parameters."""
    router_expert_bias: bool = False
    """DeepSeek-V3's auxiliary-loss-free load balancing: a per-expert bias added to the scores
    for top-k selection only and updated outside the optimizer (Wang et al. 2024; transformers
    keeps it as a buffer), so it is no parameter."""
    expert_load_imbalance: float | None = None
    """Max over mean tokens per EP rank in an MoE layer (>= 1; the slowest rank paces the
    layer). None: by the router (``hetpar.sim.moe.rank_load``: published router statistics);
    1.0 for force-balanced routing (Megatron-Core ``--moe-router-force-load-balancing``)."""
    expert_capacity_factor: float | None = None
    """Tokens an expert takes, as a multiple of the mean, beyond which they are dropped
    (Fedus et al. 2021, Switch Transformer Sec. 2.2), each expert's input padded to it
    (Megatron-Core --moe-pad-expert-input-to-capacity: static sizes, no host sync,
    ``hetpar.sim.moe_sync``); None: dropless. It caps the imbalance."""
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
    attention: AttentionKind = "gqa"
    """``gqa``: Q, K, V projections (MHA and MQA included); ``mla``: DeepSeek-V2's multi-head
    latent attention (DeepSeek-AI 2024, arXiv:2405.04434 Sec. 2.1), whose widths follow."""
    q_lora_rank: int | None = None
    """MLA: rank of the query compression h -> r_q -> a (d_nope + d_rope); None: h -> a d_qk."""
    kv_lora_rank: int | None = None
    """MLA: rank r_kv of the joint key-value compression."""
    qk_rope_head_dim: int | None = None
    """MLA: rotary part of each query/key head (the key's is shared by all heads)."""
    qk_nope_head_dim: int | None = None
    """MLA: non-rotary part of each query/key head."""
    v_head_dim: int | None = None
    """MLA: width of each value head (the output projection reads a x v_head_dim)."""
    attention_sinks: bool = False
    """A learned logit per head that takes part in the softmax (GPT-OSS): n_heads parameters."""
    sliding_window: int | None = None
    """Keys a sliding-window layer attends to (GPT-OSS: 128; None: every layer sees the whole
    sequence). Layer i uses full attention when (i + 1) % full_attention_interval == 0."""
    full_attention_interval: int = 1
    """With ``sliding_window``: every k-th layer attends fully (GPT-OSS alternates: 2)."""
    final_norm: bool = True
    """A norm before the LM head (post-LayerNorm OPT-350m has none)."""
    parallel_attention: bool = False
    """Attention and MLP read the same layer input and their outputs are added (GPT-J,
    Falcon, Phi-2, Command-R, GPT-NeoX's ``use_parallel_residual``: Wang & Komatsuzaki 2021);
    the norms it shares are ``norms_per_layer``; the GEMMs and their FLOPs are unchanged."""
    attention_bias: bool | None = None
    """Biases on the attention's Q, K, V and output projections (None: as ``bias``; GPT-J and
    GPT-NeoX ``attention_bias = false`` keep them on the MLP only); ``qkv_bias`` overrides Q/K/V."""
    norm_affine: bool = True
    """Norms with a learned gain (and bias); false: parameter-free LayerNorm (OLMo 1,
    Groeneveld et al. 2024 Sec. 2.1; OPT's ``layer_norm_elementwise_affine = false``)."""
    embedding_norm: bool = False
    """A norm right after the word embedding (BLOOM's ``word_embeddings_layernorm``)."""
    lm_head_bias: bool = False
    """A bias of V on the LM head (GPT-J, Phi-2)."""
    rotary_fraction: float = 1.0
    """Share of each head's width that rotary embeddings rotate (StableLM-2: 0.25, Phi-2: 0.4,
    GPT-J: rotary_dim 64 of 256; Megatron's ``--rotary-percent``); no parameters or GEMMs."""
    qk_norm_shared: bool = True
    """With ``qk_norm``: one head-wide gain shared by all heads (Qwen3, Gemma 3); false: a gain
    per element of the Q and K projections, a d + g d (OLMo-2's q_norm/k_norm, Command-R+)."""
    embedding_multiplier: float = 1.0
    """Scale of the word embeddings' output (Granite's ``embedding_multiplier``: 12)."""
    residual_multiplier: float = 1.0
    """Scale of each branch before it joins the residual stream (Granite: 0.22)."""
    attention_multiplier: float | None = None
    """Softmax scale of the attention scores (None: 1 / sqrt(head width); Granite: 1/128)."""
    logit_scale: float = 1.0
    """Scale of the logits (Command-R's ``logit_scale`` 0.0625, Granite 1 / ``logits_scaling``).
    The four scalars hold no parameters and change no FLOPs; the runtime refuses them."""
    layer_kinds: tuple[LayerKind, ...] | None = None
    """Per layer, what it holds (``hetpar.specs.ssm.LAYER_KINDS``; None: attention + MLP
    everywhere): hybrid Jamba and Nemotron-H, all-SSM Mamba."""
    ssm: SsmSpec | None = None
    """The state-space mixer of the ``ssm`` layers (required exactly when there are some)."""
    source: str = ""
    """Where the shape comes from (paper, model card)."""

    def __post_init__(self) -> None:
        for f in ("n_layers", "hidden", "n_heads", "n_kv_heads", "ffn_hidden", "vocab", "seq_len"):
            v = getattr(self, f)
            if v < 1:
                raise ConfigError(f"model {self.name!r}: {f} must be >= 1, got {v}")
        if self.n_layers > MAX_LAYERS:
            raise ConfigError(f"model {self.name!r}: n_layers {self.n_layers} not allowed; "
                              f"allowed: 1..{MAX_LAYERS:,}")
        for f, v in (
            ("moe_layer_interval", self.moe_layer_interval),
            ("head_dim", self.head_dim),
            ("embed_dim", self.embed_dim),
            ("max_positions", self.max_positions),
            ("norms_per_layer", self.norms_per_layer),
            ("moe_ffn_hidden", self.moe_ffn_hidden),
            ("shared_expert_ffn_hidden", self.shared_expert_ffn_hidden),
            ("full_attention_interval", self.full_attention_interval),
            ("sliding_window", self.sliding_window),
            ("q_lora_rank", self.q_lora_rank),
            *((f, getattr(self, f)) for f in MLA_FIELDS),
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
        if not 0 < self.rotary_fraction <= 1:
            raise ConfigError(f"model {self.name!r}: rotary_fraction must be in (0, 1], got "
                              f"{self.rotary_fraction}")
        if self.norm_bias and self.norm != "layernorm":
            raise ConfigError(
                f"model {self.name!r}: norm_bias = true needs norm = 'layernorm', got "
                f"{self.norm!r} (RMSNorm has no bias)"
            )
        self._check_moe_layers()
        self._check_mla()
        check_layers(self.name, self.n_layers, self.layer_kinds, self.ssm, self.moe_layer_flags)
        for f, x in (("expert_load_imbalance", self.expert_load_imbalance),
                     ("expert_capacity_factor", self.expert_capacity_factor)):
            if x is not None and not x >= 1.0:  # also refuses nan
                raise ConfigError(f"model {self.name!r}: {f} must be >= 1, got {x}")
        for f, x in (("embedding_multiplier", self.embedding_multiplier),  # scales of the
                     ("residual_multiplier", self.residual_multiplier),    # activations
                     ("attention_multiplier", self.attention_multiplier),
                     ("logit_scale", self.logit_scale)):
            if x is not None and not 0 < x < float("inf"):  # also refuses nan
                raise ConfigError(f"model {self.name!r}: {f} must be > 0 and finite, got {x}")
        if self.shared_expert_gate and self.shared_expert_ffn_hidden is None:
            raise ConfigError(
                f"model {self.name!r}: shared_expert_gate needs shared_expert_ffn_hidden"
            )

    def _check_moe_layers(self) -> None:
        if not 0 <= self.first_dense_layers <= self.n_layers:
            raise ConfigError(f"model {self.name!r}: first_dense_layers must be in "
                              f"0..n_layers ({self.n_layers}), got {self.first_dense_layers}")
        pattern = self.moe_layer_pattern
        if pattern is None:
            return
        if len(pattern) != self.n_layers or set(pattern) - {0, 1}:
            raise ConfigError(f"model {self.name!r}: moe_layer_pattern must be {self.n_layers} "
                              f"flags of 0 or 1 (one per layer), got {len(pattern)} "
                              f"values {sorted(set(pattern))}")
        if self.first_dense_layers or self.moe_layer_interval != 1:
            raise ConfigError(f"model {self.name!r}: moe_layer_pattern replaces "
                              f"first_dense_layers ({self.first_dense_layers}) and "
                              f"moe_layer_interval ({self.moe_layer_interval}); give one form")

    def _check_mla(self) -> None:
        given = [f for f in ("q_lora_rank", *MLA_FIELDS) if getattr(self, f) is not None]
        if self.attention == "gqa":
            if given:
                raise ConfigError(f"model {self.name!r}: {given[0]} needs attention = 'mla'")
            return
        missing = [f for f in MLA_FIELDS if getattr(self, f) is None]
        if missing:
            raise ConfigError(f"model {self.name!r}: attention = 'mla' needs {missing[0]}")
        if self.n_kv_heads != self.n_heads or self.qkv_bias:
            raise ConfigError(f"model {self.name!r}: attention = 'mla' has one key and value "
                              f"head per query head: n_kv_heads ({self.n_kv_heads}) must equal "
                              f"n_heads ({self.n_heads}), qkv_bias unset")

    @property
    def norm_has_bias(self) -> bool:
        """Whether each norm has a bias besides its gain (LayerNorm unless bias-free)."""
        if self.norm != "layernorm" or not self.norm_affine:
            return False
        return self.bias if self.norm_bias is None else self.norm_bias

    @property
    def attention_has_bias(self) -> bool:
        """Whether the attention's output projection (and, unless ``qkv_bias`` says otherwise,
        Q, K and V) has a bias."""
        return self.bias if self.attention_bias is None else self.attention_bias

    @property
    def qkv_has_bias(self) -> bool:
        """Whether the Q, K and V projections have biases."""
        return self.attention_has_bias if self.qkv_bias is None else self.qkv_bias

    @property
    def moe_layer_flags(self) -> tuple[bool, ...]:
        """Per layer, whether it is MoE: ``moe_layer_pattern``, else every
        ``moe_layer_interval``-th layer from ``first_dense_layers`` on (none if dense)."""
        if self.n_experts == 1:
            return (False,) * self.n_layers
        if self.moe_layer_pattern is not None:
            return tuple(bool(f) for f in self.moe_layer_pattern)
        first, k = self.first_dense_layers, self.moe_layer_interval
        return tuple(i >= first and (i - first) % k == 0 for i in range(self.n_layers))

    @property
    def kinds(self) -> tuple[LayerKind, ...]:
        """Per layer, what it holds (``layer_kinds``, else attention + MLP everywhere)."""
        return self.layer_kinds or (TRANSFORMER_LAYER,) * self.n_layers

    @property
    def expert_ffn(self) -> int:
        """Inner width of one routed expert."""
        return self.moe_ffn_hidden if self.moe_ffn_hidden is not None else self.ffn_hidden

    @property
    def dim_head(self) -> int:
        """Width of one attention head."""
        return self.head_dim if self.head_dim is not None else self.hidden // self.n_heads
