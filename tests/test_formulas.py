"""Formulas checked against published counts, the SC'21/Korthikanti closed forms and hand sums."""

from __future__ import annotations

import dataclasses

import pytest

from hetpar import formulas as F
from hetpar.catalog import load_model
from hetpar.errors import ConfigError, Infeasible
from hetpar.specs.model import ModelSpec


def gpt(layers: int, hidden: int, heads: int, vocab: int = 51200, seq: int = 2048) -> ModelSpec:
    """A GPT-3/Megatron shape: GELU MLP of 4h, biases, LayerNorm, learned positions, tied."""
    return ModelSpec(
        name=f"gpt-{layers}-{hidden}", n_layers=layers, hidden=hidden, n_heads=heads,
        n_kv_heads=heads, ffn_hidden=4 * hidden, vocab=vocab, seq_len=seq, tied_embeddings=True,
    )


def llama(
    layers: int, hidden: int, heads: int, kv: int, ffn: int, vocab: int = 128256
) -> ModelSpec:
    return ModelSpec(
        name=f"llama-{layers}", n_layers=layers, hidden=hidden, n_heads=heads, n_kv_heads=kv,
        ffn_hidden=ffn, vocab=vocab, seq_len=8192, mlp="swiglu", norm="rmsnorm",
        position="rope", bias=False,
    )


MIXTRAL = dataclasses.replace(
    llama(32, 4096, 32, 8, 14336, vocab=32000), name="mixtral", n_experts=8, experts_per_token=2
)


@pytest.mark.parametrize(
    ("model", "published"),
    [
        # Meta's Llama 3.1 model card: 8.03B, 70.6B, 405.9B (safetensors parameter totals)
        (llama(32, 4096, 32, 8, 14336), 8.03e9),
        (llama(80, 8192, 64, 8, 28672), 70.6e9),
        (llama(126, 16384, 128, 8, 53248), 405.9e9),
        # GPT-3 175B (Brown et al. 2020, Table 2.1) with V=50257: 174.6e9 as usually quoted
        (gpt(96, 12288, 96, vocab=50257), 174.6e9),
    ],
)
def test_published_parameter_counts(model: ModelSpec, published: float) -> None:
    # published numbers carry 3-4 significant digits
    assert F.params(model) == pytest.approx(published, rel=1e-3)


# Narayanan et al. SC'21 Table 1: (billions of params, heads, hidden, layers); V=51200, s=2048.
SC21 = [
    (1.7, 24, 2304, 24), (3.6, 32, 3072, 30), (7.5, 32, 4096, 36), (18.4, 48, 6144, 40),
    (39.1, 64, 8192, 48), (76.1, 80, 10240, 60), (145.6, 96, 12288, 80),
    (310.1, 128, 16384, 96), (529.6, 128, 20480, 105), (1008.0, 160, 25600, 128),
]


@pytest.mark.parametrize(("billions", "heads", "hidden", "layers"), SC21)
def test_sc21_table_parameter_counts(billions: float, heads: int, hidden: int, layers: int) -> None:
    m = gpt(layers, hidden, heads)
    p = F.params(m)
    # SC'21 eq. 2: P = 12 l h^2 (1 + 13/12h + (V + s)/12lh); ours adds only the final LayerNorm
    n, h = layers, hidden
    closed = 12 * n * h**2 * (1 + 13 / (12 * h) + (51200 + 2048) / (12 * n * h))
    assert p == pytest.approx(closed + 2 * hidden, rel=1e-12)
    # the table prints the count to one decimal of a billion; allow the rounding and 0.1%
    assert abs(p / 1e9 - billions) <= 0.05 + 1e-3 * billions


@pytest.mark.parametrize(("billions", "heads", "hidden", "layers"), SC21)
def test_sc21_flops_formula_with_full_recompute(
    billions: float, heads: int, hidden: int, layers: int
) -> None:
    m = gpt(layers, hidden, heads)
    s, v, h, n = 2048, 51200, hidden, layers
    # SC'21 eq. 3 per token (divide by B s): 96 l h^2 (1 + s/6h + V/16lh), l = n layers
    sc21 = 96 * n * h**2 * (1 + s / (6 * h) + v / (16 * n * h))
    assert F.hardware_flops_per_token(m, s, "full") == pytest.approx(sc21, rel=1e-12)
    # Korthikanti et al. Sec. 6: model FLOPs 72 l h^2 (1 + s/6h + V/12lh) per token
    korth = 72 * n * h**2 * (1 + s / (6 * h) + v / (12 * n * h))
    assert F.model_flops_per_token(m, s) == pytest.approx(korth, rel=1e-12)


def test_flops_close_to_six_n_plus_attention() -> None:
    # Kaplan et al. 2020: C_forward ~ 2N + 2 l s d_attn; training = 3x, N excluding embeddings
    m = llama(32, 4096, 32, 8, 14336)
    s = 8192
    n_nonembed = F.layers_params(m) + m.vocab * m.hidden  # the LM head is a matmul too
    kaplan = 6 * n_nonembed + 6 * 2 * m.n_layers * s * m.hidden
    # they differ only by norm weights (not matmuls): far below 0.01%
    assert F.model_flops_per_token(m, s) == pytest.approx(kaplan, rel=1e-4)
    assert F.model_flops_per_token(m, s) != kaplan


def test_recompute_ordering_and_selective_delta() -> None:
    m = gpt(24, 2304, 24)
    s = 2048
    none, sel, full = (F.hardware_flops_per_token(m, s, r) for r in F.RECOMPUTE_MODES)
    assert none == F.model_flops_per_token(m, s) == F.flops_per_token(m, s)
    assert none < sel < full
    assert sel - none == pytest.approx(m.n_layers * 4 * s * m.hidden)  # one more QK^T and xV
    assert full - none == pytest.approx(m.n_layers * (24 * m.hidden**2 + 4 * s * m.hidden))


def test_hand_derived_tiny_layer() -> None:
    # h=8, a=2, g=1 (MQA), d=4, f=16, SwiGLU, no bias, RMSNorm
    m = ModelSpec(name="t", n_layers=3, hidden=8, n_heads=2, n_kv_heads=1, ffn_hidden=16,
                  vocab=10, seq_len=5, mlp="swiglu", norm="rmsnorm", position="rope", bias=False)
    attn = 8 * 8 + 8 * 4 + 8 * 4 + 8 * 8  # q, k, v, o
    mlp = 3 * 8 * 16
    assert F.layer_params(m) == attn + mlp + 2 * 8
    assert F.params(m) == 3 * (attn + mlp + 16) + 10 * 8 + 8 + 10 * 8
    fwd = 2 * (attn + mlp) + 4 * 5 * 8  # matmuls + QK^T and xV over 5 keys
    assert F.layer_forward_flops_per_token(m, 5) == fwd
    assert F.model_flops_per_token(m, 5) == 3 * (3 * fwd + 2 * 8 * 10)
    gemms = F.layer_gemms(m, 7, 1)
    assert [(g.name, g.m, g.n, g.k) for g in gemms] == [
        ("qkv", 7, 16, 8), ("attn_out", 7, 8, 8), ("mlp_up", 7, 32, 8), ("mlp_down", 7, 8, 16)
    ]
    assert sum(g.flops for g in gemms) + F.attention_core_flops(m, 7, 5) == 7 * fwd


def test_gelu_with_bias_hand_count() -> None:
    m = ModelSpec(name="g", n_layers=1, hidden=4, n_heads=2, n_kv_heads=2, ffn_hidden=12,
                  vocab=6, seq_len=3)
    attn = 4 * 12 + 12 + 4 * 4 + 4  # fused qkv weight and bias, output weight and bias
    mlp = 2 * 4 * 12 + 12 + 4
    assert F.layer_params(m) == attn + mlp + 2 * 8
    assert F.embedding_params(m) == 6 * 4 + 3 * 4
    assert F.params(m) == F.embedding_params(m) + F.layer_params(m) + 8 + 6 * 4  # untied


def test_moe_counts_and_gemms() -> None:
    # Mistral AI: Mixtral 8x7B has 46.7B parameters, 12.9B active per token
    assert F.params(MIXTRAL) == pytest.approx(46.7e9, rel=1e-3)
    assert F.active_params(MIXTRAL) == pytest.approx(12.9e9, rel=1e-2)
    dense = dataclasses.replace(MIXTRAL, n_experts=1, experts_per_token=1)
    assert F.params(MIXTRAL) - F.params(dense) == 32 * (7 * F.mlp_params(dense) + 4096 * 8)
    gemms = F.layer_gemms(MIXTRAL, 4096, 2, True)
    up = next(g for g in gemms if g.name == "expert_up")
    assert (up.m, up.n, up.k, up.repeat) == (1024, 14336, 4096, 8)
    flops = sum(g.flops for g in gemms) + F.attention_core_flops(MIXTRAL, 4096, 4096, 2)
    per_token = F.layer_forward_flops_per_token(MIXTRAL, 4096, 0)
    router = next(g for g in gemms if g.name == "router")
    # two TP ranks share the layer; the small router GEMM is replicated on both
    assert flops * 2 - router.flops == pytest.approx(4096 * per_token, rel=1e-12)


def test_shared_expert_counts_and_gemms() -> None:
    # Qwen1.5-MoE-A2.7B's MoE layer (config.json): 60 experts of 1408, top-4, a 5632-wide
    # shared expert behind a sigmoid gate h -> 1; hand count of one layer's MLP part
    q = ModelSpec(name="q", n_layers=24, hidden=2048, n_heads=16, n_kv_heads=16,
                  ffn_hidden=5632, vocab=151936, seq_len=4096, mlp="swiglu", norm="rmsnorm",
                  position="rope", bias=False, qkv_bias=True, n_experts=60, experts_per_token=4,
                  moe_ffn_hidden=1408, shared_expert_ffn_hidden=5632, shared_expert_gate=True)
    mlp = 60 * 3 * 2048 * 1408 + 2048 * 60 + 3 * 2048 * 5632 + 2048
    assert F.layer_params(q) - F.attention_params(q) - 2 * 2048 == mlp
    assert F.params(q) - F.active_params(q) == 24 * 56 * 3 * 2048 * 1408
    gemms = F.layer_gemms(q, 4096, 2, True)
    names = [g.name for g in gemms]
    assert names[-3:] == ["shared_up", "shared_down", "shared_gate"]
    up = next(g for g in gemms if g.name == "expert_up")
    assert (up.m, up.n, up.k, up.repeat) == (274, 1408, 2048, 60)  # ceil(4096*4/60), 2*1408/2
    flops = sum(g.flops for g in gemms) + F.attention_core_flops(q, 4096, 4096, 2)
    replicated = sum(g.flops for g in gemms if g.name in ("router", "shared_gate"))
    # balanced routing rounds the 16384 routed tokens up to 274 per expert
    rounding = 2 * (274 * 60 - 4096 * 4) * 3 * 2048 * 704 * 2
    assert flops * 2 - replicated - rounding == pytest.approx(
        4096 * F.layer_forward_flops_per_token(q, 4096, 0), rel=1e-12)


def test_moe_interval_layers() -> None:
    m = dataclasses.replace(MIXTRAL, moe_layer_interval=3, n_layers=10)
    moe = [i for i in range(10) if F.is_moe_layer(m, i)]
    assert moe == [0, 3, 6, 9]
    assert F.layers_params(m) == sum(F.layer_params(m, i) for i in range(10))
    assert F.layers_params(m, 2, 7) == sum(F.layer_params(m, i) for i in range(2, 7))


def test_tp_divisibility_and_kv_replication() -> None:
    m = llama(32, 4096, 32, 8, 14336)
    assert F.layer_gemms(m, 16, 16)[0].n == 2 * 128 + 2 * 128  # 2 Q heads, 1 replicated KV
    with pytest.raises(Infeasible):
        F.layer_gemms(m, 16, 3)
    with pytest.raises(Infeasible):
        F.layer_gemms(dataclasses.replace(m, n_kv_heads=8, n_heads=24, hidden=3072), 16, 12)


def test_korthikanti_table2_rows() -> None:
    a, h, s, b, t = 96, 12288, 2048, 1, 8
    m = gpt(96, h, a)
    sbh = s * b * h

    def act(**kw: object) -> float:
        return F.activation_bytes_per_layer(m, s, b, **kw)  # type: ignore[arg-type]

    assert act() == pytest.approx(sbh * (34 + 5 * a * s / h))
    assert act(tp=t) == pytest.approx(sbh * (10 + 24 / t + 5 * a * s / (h * t)))
    assert act(tp=t, sp=True) == pytest.approx(sbh / t * (34 + 5 * a * s / h))
    assert act(tp=t, sp=True, recompute="selective") == pytest.approx(34 * sbh / t)
    assert act(tp=t, recompute="selective") == pytest.approx(sbh * (10 + 24 / t))
    assert act(recompute="full") == pytest.approx(2 * sbh)


def test_activation_generalisations() -> None:
    m = llama(32, 4096, 32, 8, 14336)
    s, b = 4096, 2
    tok = s * b
    no_drop = F.activation_bytes_per_layer(m, s, b, recompute="selective", dropout=False)
    # norm ins + qkv in + mlp in (8 h) + Q,K,V,O-in (2(q + 2 kv + q)) + 3 f-wide (SwiGLU)
    assert no_drop == tok * (8 * 4096 + 2 * (4096 + 1024 + 1024 + 4096) + 6 * 14336)
    flash = F.activation_bytes_per_layer(m, s, b, dropout=False, flash_attention=True)
    assert flash == no_drop + 4 * 32 * tok
    cp2 = F.activation_bytes_per_layer(m, s, b, cp=2, dropout=False)
    full = F.activation_bytes_per_layer(m, s, b, dropout=False)
    # CP halves the linear terms and the score rows (keys stay s)
    assert cp2 == pytest.approx(full / 2)
    assert F.head_activation_bytes(m, s, b) == tok * (2 * 4096 * 2 + 4 * 128256)


def test_mla_flops_per_token_by_hand() -> None:
    """DeepSeek-V3 (MLA, 3 dense layers then 58 MoE layers) at s = 4096, each matrix written
    out from the report's shapes (arXiv:2412.19437 Sec. 4.2; DeepSeek-V2 eqs. 9-19)."""
    m = load_model("deepseek-v3")
    h, a, s = 7168, 128, 4096
    attn = (h * 1536 + 1536 * a * (128 + 64)  # W^DQ, W^UQ (+ rotary queries)
            + h * (512 + 64) + 512 * a * (128 + 128)  # W^DKV with W^KR, W^UK and W^UV
            + a * 128 * h)  # W^O
    assert F.attention_matmul_weights(m) == attn == 187_105_280
    dense = attn + 3 * h * 18432
    moe = attn + (8 + 1) * 3 * h * 2048 + h * 256  # top-8 routed + 1 shared expert, router
    core = 2 * s * a * (128 + 64) + 2 * s * a * 128  # QK^T over d_n + d_r, scores x V over d_v
    forward = 3 * (2 * dense + core) + 58 * (2 * moe + core) + 2 * h * 129280
    assert F.model_flops_per_token(m, s) == pytest.approx(3 * forward, rel=1e-12)


def test_sliding_window_layers_attend_to_the_window() -> None:
    """gpt-oss: even layers attend to 128 keys, odd layers to all s (configuration_gpt_oss
    layer_types); QK^T and scores x V cost 2 keys a d each per token."""
    m = load_model("gpt-oss-120b")
    q = 64 * 64
    assert F.attention_core_flops_per_token(m, 4096, 0) == 2 * 128 * 2 * q
    assert F.attention_core_flops_per_token(m, 4096, 1) == 2 * 4096 * 2 * q
    mean = (18 * 4096 + 18 * 128) / 36
    assert F.attention_core_flops_per_token(m, 4096) == pytest.approx(4 * mean * q)
    assert F.attention_core_flops_per_token(m, 64) == 4 * 64 * q  # window >= s: all keys


def test_moe_layer_placement_forms() -> None:
    """first_dense_layers + interval (DeepSeek-V3, Llama 4 Maverick) and an explicit pattern
    (Megatron's list moe_layer_freq) choose the MoE layers; mixing forms is refused."""
    base = load_model("mixtral-8x7b")
    m = dataclasses.replace(base, first_dense_layers=3, moe_layer_interval=2)
    assert [i for i in range(32) if F.is_moe_layer(m, i)] == list(range(3, 32, 2))
    assert F.moe_layers_in(m, 0, 8) == 3 and F.first_moe_layer(m) == 3
    flags = tuple(int(i in (1, 30)) for i in range(32))
    p = dataclasses.replace(base, moe_layer_pattern=flags)
    assert F.moe_layers_in(p, 0, 32) == 2 and F.moe_layers_in(p, 2, 30) == 0
    assert F.params(p) == F.params(base) - 30 * (F.layer_params(base) - F.layer_params(
        dataclasses.replace(base, n_experts=1, experts_per_token=1)))
    with pytest.raises(ConfigError, match="moe_layer_pattern replaces"):
        dataclasses.replace(base, moe_layer_pattern=flags, first_dense_layers=1)
    with pytest.raises(ConfigError, match="32 flags of 0 or 1"):
        dataclasses.replace(base, moe_layer_pattern=(1, 2))


def test_mla_fields_are_checked() -> None:
    base = load_model("deepseek-v3")
    with pytest.raises(ConfigError, match="needs kv_lora_rank"):
        dataclasses.replace(base, kv_lora_rank=None)
    with pytest.raises(ConfigError, match="q_lora_rank needs attention = 'mla'"):
        dataclasses.replace(load_model("llama3.1-8b"), q_lora_rank=64)
    with pytest.raises(ConfigError, match="n_kv_heads .* must equal"):
        dataclasses.replace(base, n_kv_heads=8)


@pytest.mark.parametrize("name", ["deepseek-v3", "gpt-oss-120b", "qwen3-235b-a22b"])
def test_layer_gemms_add_up_to_the_flops(name: str) -> None:
    """At tp = 1 the GEMMs of a dense and an MoE layer are the layer's matmul FLOPs (flops.py)
    less the attention core, for MLA's five projections as for fused QKV; under TP only MLA's
    down projections stay whole (megatron-core's MLA layer spec)."""
    m = load_model(name)
    tokens, s = 4096, 4096
    for i in (0, m.n_layers - 1):
        moe = F.is_moe_layer(m, i)
        # routed GEMMs are tokens x k / E rows per expert, E of them: exact here, as
        # tokens x k divides by E for these shapes
        gemms = sum(g.flops for g in F.layer_gemms(m, tokens, 1, moe))
        core = tokens * F.attention_core_flops_per_token(m, s, i)
        assert gemms == pytest.approx(F.layer_forward_flops(m, s, tokens, i) - core, rel=1e-12)
    if m.attention == "mla":
        by_name = {g.name: g for g in F.layer_gemms(m, tokens, 8, False)}
        assert by_name["kv_down"].n == 512 + 64 and by_name["q_down"].n == 1536
        assert by_name["kv_up"].n == 128 // 8 * (128 + 128) and by_name["attn_out"].k == 16 * 128
