"""Mixture-of-experts layers in the simulator: Qwen-MoE's expert widths and shared expert,
checked against hand counts from the Hugging Face config (tests/fixtures/hf)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from hetpar import formulas as F
from hetpar.catalog import load_cluster, load_gpu, load_model
from hetpar.failures.cost import AnalyticCost
from hetpar.failures.layout import layout
from hetpar.failures.simcost import SimCost
from hetpar.sim import network as net
from hetpar.sim.chunk import Chunk, Context, layer_cost
from hetpar.sim.layer import elementwise_bytes, layer_time
from hetpar.sim.memory import _fp8_saved_inputs
from hetpar.specs.plan import Plan

HF = Path(__file__).parent / "fixtures" / "hf"
QWEN15 = load_model(str(HF / "qwen1.5-moe-a2.7b.json"))
QWEN3 = load_model(str(HF / "qwen3-30b-a3b.json"))
MIXTRAL = load_model("mixtral-8x7b")

# Qwen1.5-MoE-A2.7B config.json: h 2048, 16 heads (MHA), 24 layers, V 151936, 60 experts of
# moe_intermediate_size 1408, top-4, shared_expert_intermediate_size 5632 behind a sigmoid
# gate h -> 1 (transformers modeling_qwen2_moe.Qwen2MoeSparseMoeBlock), router h -> 60.
H, L, V = 2048, 24, 151936
ATTN = 4 * H * H  # Q, K, V and output projections, bias-free weights
EXPERTS = 4 * 3 * H * 1408  # top-4 SwiGLU experts: gate, up, down
SHARED = 3 * H * 5632 + H  # the shared SwiGLU expert and its gate
ROUTER = H * 60
MOE_LAYER_WEIGHTS = ATTN + EXPERTS + SHARED + ROUTER  # 86,108,160 weights a token passes


def test_qwen15_moe_layer_flops_are_the_hand_count() -> None:
    assert MOE_LAYER_WEIGHTS == 86_108_160
    gpu = load_gpu("H100-SXM5-80GB")
    s = 3840  # 3840 x top-4 / 60 experts = 256 tokens per expert: balanced routing is exact
    lt = layer_time(QWEN15, gpu, "bf16", 1, s, 1, 1, False, moe=True)
    attention_core = 4 * s * s * H  # QK^T and scores x V, 2 s d per head each
    assert lt.fwd_flops == pytest.approx(2 * s * MOE_LAYER_WEIGHTS + attention_core, rel=1e-12)
    # before: the dense 5632-wide MLP (ffn_hidden = intermediate_size) stood in for the experts
    dense = layer_time(QWEN15, gpu, "bf16", 1, s, 1, 1, False)
    assert dense.fwd_flops == pytest.approx(2 * s * (ATTN + 3 * H * 5632) + attention_core)
    assert lt.fwd > dense.fwd


@pytest.mark.parametrize("model", [QWEN15, QWEN3, MIXTRAL], ids=lambda m: m.name)
def test_model_flops_are_6_n_active_plus_attention(model) -> None:
    """Training FLOPs per token = 6 x the matmul weights a token passes (the active ones) +
    12 L s (a d) for attention: Kaplan et al.'s 6N with N the active non-embedding weights
    and the LM head; the simulator's per-layer GEMMs add up to the same."""
    s = model.seq_len
    q, kv = model.n_heads * model.dim_head, model.n_kv_heads * model.dim_head
    mats = 3  # all three are SwiGLU
    per_layer = (model.hidden * (q + 2 * kv) + q * model.hidden
                 + model.experts_per_token * mats * model.hidden * model.expert_ffn
                 + model.hidden * model.n_experts
                 + mats * model.hidden * (model.shared_expert_ffn_hidden or 0)
                 + (model.hidden if model.shared_expert_gate else 0))
    n_matmul = model.n_layers * per_layer + model.vocab * model.hidden
    expected = 6 * n_matmul + 12 * model.n_layers * s * q
    assert F.model_flops_per_token(model, s) == pytest.approx(expected, rel=1e-12)
    # the active parameters beyond those matmul weights: embedding, norms, biases, QK-norm
    assert 0 < F.active_params(model) - n_matmul < 1.01 * model.vocab * model.hidden


def test_layer_cost_of_a_chunk_mixing_dense_and_moe_layers_is_their_mean() -> None:
    model = dataclasses.replace(QWEN15, moe_layer_interval=2, n_layers=4)
    topo = net.topology(load_cluster("selene-a100"))
    ctx = Context(model=model, topo=topo, seq=4096, micro_batch=1, precision="bf16",
                  optimizer="adam", recompute="none", sequence_parallel=False, zero=0,
                  schedule="1f1b", vpp=1)
    dev = (("a100", 0),)

    def cost(a: int, b: int):
        return layer_cost(ctx, Chunk(layers=(a, b), group="a100", tp=1, cp=1, devices=dev))

    moe, dense, mixed = cost(0, 1), cost(1, 2), cost(0, 4)  # layers 0 and 2 are MoE
    assert moe.fwd > dense.fwd
    for f in ("fwd", "bwd_input", "bwd_weight", "idle_f", "idle_b"):
        assert getattr(mixed, f) == pytest.approx((getattr(moe, f) + getattr(dense, f)) / 2)


def test_moe_elementwise_and_fp8_bytes_follow_the_active_experts() -> None:
    t, tp = 4096, 2
    active = 4 * 1408 + 5632  # columns a token fills: top-4 experts and the shared expert
    assert F.mlp_width(QWEN15, True) == active
    assert F.mlp_width(QWEN15, False) == 5632
    moe = elementwise_bytes(QWEN15, "bf16", t, tp, False, moe=True)
    dense = elementwise_bytes(QWEN15, "bf16", t, tp, False)
    from hetpar.sim import calibration as cal
    # + the token permutation before and after the experts: 2 x (top-4 + 1) x h per token
    # (no sequence parallelism: every TP rank permutes all t tokens)
    permute = 2 * t * 2 * (4 + 1) * H
    assert moe - dense == pytest.approx(2 * t * cal.MLP_ELEMENTWISE_PASSES * 2 * (active - 5632)
                                        / tp + permute)
    # FP8 keeps a 1-byte copy of the FC2 input: the active experts' columns on this rank
    saved = _fp8_saved_inputs(QWEN15, 4096, 1, tp, False, 1)
    assert saved == pytest.approx(t * (2 * H + H / tp + active / tp))


def test_unset_expert_width_defaults_to_ffn_hidden() -> None:
    """Mixtral sets no moe_ffn_hidden: its experts are ffn_hidden wide (Megatron-Core's
    moe_ffn_hidden_size default), so spelling it out changes nothing."""
    spelled = dataclasses.replace(MIXTRAL, moe_ffn_hidden=MIXTRAL.ffn_hidden)
    gpu = load_gpu("H100-SXM5-80GB")
    a = layer_time(MIXTRAL, gpu, "bf16", 1, 4096, 2, 1, True, moe=True)
    b = layer_time(spelled, gpu, "bf16", 1, 4096, 2, 1, True, moe=True)
    assert a == b
    assert F.model_flops_per_token(MIXTRAL, 4096) == F.model_flops_per_token(spelled, 4096)


def test_failure_cost_counts_the_active_experts() -> None:
    c = load_cluster("selene-a100")
    sub = dataclasses.replace(c, node_groups=(dataclasses.replace(c.node_groups[0],
                                                                  num_nodes=2),),
                              links=(), tiers=())
    plan = Plan(tp=2, pp=2, dp=4, micro_batch=1, global_batch=64, precision="bf16")
    # the dense stand-in the closed form used before: one 5632-wide MLP per layer
    stand_in = dataclasses.replace(QWEN15, n_experts=1, experts_per_token=1,
                                   moe_ffn_hidden=None, shared_expert_ffn_hidden=None,
                                   shared_expert_gate=False)
    moe = AnalyticCost(QWEN15, sub, plan, layout(QWEN15, sub, plan))
    old = AnalyticCost(stand_in, sub, plan, layout(stand_in, sub, plan))
    assert moe.replica_time(2, 16) > 1.2 * old.replica_time(2, 16)
    sim = SimCost(QWEN15, sub, plan, layout(QWEN15, sub, plan)).replica_time(2, 16)
    assert 1 / 3 < moe.replica_time(2, 16) / sim < 3  # tests/test_analytic_vs_sim.py's bound
