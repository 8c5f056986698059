"""Per-layer compute times against hand derivations with flat efficiency tables."""

import dataclasses

import pytest

from hetpar import formulas
from hetpar.catalog import load_gpu
from hetpar.sim import calibration as cal
from hetpar.sim.layer import elementwise_bytes, flash_attention, head_time, layer_time
from hetpar.specs.gpu import EfficiencyTable
from hetpar.specs.model import ModelSpec

FLAT = EfficiencyTable(size=(1.0, 1e30), fraction=(0.5, 0.5))


def _gpu():
    g = load_gpu("A100-SXM4-80GB")
    return dataclasses.replace(g, matmul_efficiency=FLAT, attention_efficiency=FLAT,
                               memory_efficiency=FLAT)


def _gpt(position="rope") -> ModelSpec:
    return ModelSpec(name="gpt", n_layers=4, hidden=1024, n_heads=16, n_kv_heads=16,
                     ffn_hidden=4096, vocab=50000, seq_len=2048, position=position)


def test_gpt_layer_matches_24_t_h2_plus_attention():
    gpu, m = _gpu(), _gpt()
    b, s, h = 2, 2048, 1024
    t = b * s
    lt = layer_time(m, gpu, "bf16", b, s, 1, 1, False)
    peak = 312e12 * 0.5
    gemm = 24 * t * h * h / peak  # QKV 6th^2, proj 2th^2, MLP 16th^2 (Narayanan et al. 2021)
    attn = 4 * t * s * h / peak
    elem = elementwise_bytes(m, "bf16", t, 1, False) / (2039e9 * 0.5)
    assert lt.fwd == pytest.approx(gemm + attn + elem, rel=1e-9)
    assert lt.bwd_weight == pytest.approx(gemm, rel=1e-9)
    assert lt.bwd_input == pytest.approx(gemm + 2 * attn + 2 * elem, rel=1e-9)
    # backward = 2 x forward FLOPs
    assert lt.bwd_input + lt.bwd_weight == pytest.approx(2 * lt.fwd, rel=1e-9)


def test_tensor_parallel_splits_gemms_and_sequence_parallel_splits_norms():
    gpu, m = _gpu(), _gpt()
    one = layer_time(m, gpu, "bf16", 1, 2048, 1, 1, False)
    four = layer_time(m, gpu, "bf16", 1, 2048, 4, 1, False)
    four_sp = layer_time(m, gpu, "bf16", 1, 2048, 4, 1, True)
    assert four.bwd_weight == pytest.approx(one.bwd_weight / 4, rel=1e-9)
    assert four_sp.fwd < four.fwd
    t = 2048
    saved = cal.REPLICATED_PASSES * 1024 * 2 * t * (1 - 1 / 4) / (2039e9 * 0.5)
    assert four.fwd - four_sp.fwd == pytest.approx(saved, rel=1e-9)


def test_unfused_attention_pays_for_the_score_matrix():
    gpu = _gpu()
    fused, unfused = _gpt("rope"), _gpt("learned")
    assert flash_attention(fused, "bf16") and not flash_attention(unfused, "bf16")
    assert not flash_attention(fused, "fp32")
    a = layer_time(fused, gpu, "bf16", 1, 2048, 1, 1, False)
    b = layer_time(unfused, gpu, "bf16", 1, 2048, 1, 1, False)
    scores = cal.SOFTMAX_PASSES * 16 * 2048 * 2048 * 2 / (2039e9 * 0.5)
    assert b.attn_fwd - a.attn_fwd == pytest.approx(scores, rel=1e-9)
    assert b.selective == b.attn_fwd  # Korthikanti: recompute the attention core


def test_precision_picks_the_peak():
    gpu, m = _gpu(), _gpt()
    bf16 = layer_time(m, gpu, "bf16", 4, 2048, 1, 1, False)
    fp32 = layer_time(m, gpu, "fp32", 4, 2048, 1, 1, False)
    # fp32 GEMMs run on TF32 tensor cores: 156 vs 312 TFLOP/s on A100
    assert fp32.bwd_weight == pytest.approx(2 * bf16.bwd_weight, rel=1e-9)
    h100 = dataclasses.replace(load_gpu("H100-SXM5-80GB"), matmul_efficiency=FLAT,
                               attention_efficiency=FLAT, memory_efficiency=FLAT)
    b = layer_time(m, h100, "bf16", 4, 2048, 1, 1, False)
    f8 = layer_time(m, h100, "fp8", 4, 2048, 1, 1, False)
    assert f8.bwd_weight == pytest.approx(b.bwd_weight / 2, rel=1e-4)  # FP8 GEMMs
    assert f8.attn_fwd == pytest.approx(b.attn_fwd, rel=1e-9)  # attention stays BF16
    with pytest.raises(Exception, match="fp8"):
        layer_time(m, gpu, "fp8", 4, 2048, 1, 1, False)  # Ampere has no FP8


def test_lm_head_time():
    gpu, m = _gpu(), _gpt()
    fwd, bwd = head_time(m, gpu, "bf16", 4096, 2)
    gemm = formulas.head_gemm(m, 4096, 2).flops / (312e12 * 0.5)
    loss = 3 * 4.0 * 4096 * 50000 / 2 / (2039e9 * 0.5)
    assert fwd == pytest.approx(gemm + loss, rel=1e-9)
    assert bwd == pytest.approx(2 * gemm + loss, rel=1e-9)


def test_real_tables_make_small_gemms_less_efficient():
    gpu = load_gpu("A100-SXM4-80GB")
    assert gpu.matmul_efficiency(1e8) < gpu.matmul_efficiency(1e10) < gpu.matmul_efficiency(1e12)


def test_ring_attention_exchange_is_hidden_behind_attention_compute():
    from hetpar.catalog import load_cluster
    from hetpar.sim import network as net
    from hetpar.sim.chunk import Chunk, Context, layer_cost

    model = ModelSpec(name="long", n_layers=2, hidden=4096, n_heads=32, n_kv_heads=8,
                      ffn_hidden=14336, vocab=1000, seq_len=131072, position="rope",
                      mlp="swiglu")
    topo = net.topology(load_cluster("selene-a100"))

    def ctx(seq):
        return Context(model=model, topo=topo, seq=seq, micro_batch=1, precision="bf16",
                       optimizer="adam", recompute="none", sequence_parallel=False, zero=0,
                       schedule="1f1b", vpp=1)

    across = Chunk(layers=(0, 2), group="a100", tp=1, cp=2, devices=(("a100", 0), ("a100", 8)))
    for seq in (512, 4096, 131072):
        lc = layer_cost(ctx(seq), across)
        shape = topo.shape(across.devices)
        kv = seq // 2 * 2 * 8 * 128 * 2  # this rank's K and V shard, bf16
        step = net.p2p(shape.outer, kv)
        attn = layer_time(model, topo.gpu("a100"), "bf16", 1, seq, 1, 2, False).attn_fwd
        assert lc.cp_f == pytest.approx(max(0.0, step - attn), abs=1e-12)
    # at 128K tokens attention (quadratic) hides the (linear) KV exchange completely
    assert layer_cost(ctx(131072), across).cp_f == 0.0
    assert layer_cost(ctx(512), across).cp_f > 0.0
