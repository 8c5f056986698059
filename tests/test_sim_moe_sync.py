"""The CPU's launch windows of a layer: the dropless MoE dispatcher's host sync
(sim/moe_sync.py) and whole-layer CUDA graphs (FrameworkProfile.cuda_graphs)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hetpar.catalog import load_cluster, load_model
from hetpar.errors import ConfigError
from hetpar.sim import network as net
from hetpar.sim.chunk import Chunk, Context, layer_cost
from hetpar.sim.moe_sync import forward_idle, host_sync
from hetpar.sim.profile import resolve
from hetpar.validation.rows import model_of, read_runs

QWEN3 = load_model(str(Path(__file__).parent / "fixtures" / "hf" / "qwen3-30b-a3b.json"))
MOE_RUNS = Path(__file__).parents[1] / "hetpar" / "catalog" / "validation" / "moe-runs.csv"
MCORE = resolve("megatron-core")


def _cost(model, profile, experts=(8, 1, 1.0)):
    topo = net.topology(load_cluster("selene-a100"))
    ctx = Context(model=model, topo=topo, seq=4096, micro_batch=1, precision="bf16",
                  optimizer="adam", recompute="none", sequence_parallel=False, zero=0,
                  schedule="1f1b", vpp=1, profile=profile, experts=experts)
    dev = (("a100", 0),)
    return layer_cost(ctx, Chunk(layers=(0, 1), group="a100", tp=1, cp=1, devices=dev))


def test_a_dropless_layer_pays_the_sync_a_padded_one_does_not() -> None:
    """Same experts and load, dropless vs drop-and-pad (capacity factor 1.0 at load 1.0): the
    sync only lengthens the dropless forward, by at least the first launch after it; the
    backward (splits already on the host) is the same. GPU-bound here (fast dispatch), so
    without the sync the forward idle would be the kernel gaps alone."""
    fast = dataclasses.replace(MCORE, kernel_dispatch_s=1e-6)
    dropless = dataclasses.replace(QWEN3, expert_load_imbalance=1.0)
    padded = dataclasses.replace(dropless, expert_capacity_factor=1.0)
    assert host_sync(dropless) and not host_sync(padded)
    a, b = _cost(dropless, fast), _cost(padded, fast)
    assert a.fwd == b.fwd and a.idle_b == b.idle_b
    assert a.idle_f >= b.idle_f + fast.kernel_dispatch_s * (1 - 1e-9)


def test_a_dense_model_never_syncs() -> None:
    assert not host_sync(dataclasses.replace(QWEN3, n_experts=1, experts_per_token=1))


@given(d=st.floats(0, 1e-2), g=st.floats(0, 1e-2), share=st.floats(0, 1))
def test_the_sync_never_shortens_the_forward(d: float, g: float, share: float) -> None:
    """Cutting one launch window in two never leaves the GPU less idle than one window:
    forward_idle >= max(0, dispatch - gpu) and >= one launch."""
    idle = forward_idle(MCORE, d, g, share * g)
    assert idle >= max(0.0, d - g) - 1e-15
    assert idle >= MCORE.kernel_dispatch_s


def test_a_rows_capacity_factor_reaches_the_model() -> None:
    """``capacity_factor`` 1.0 on the token-dropping rows (Megatron-Bridge apply_moe_token_drop);
    blank: dropless; on a dense row it is refused like the other MoE columns."""
    rows = {r["row_id"]: r for r in read_runs(MOE_RUNS)}
    assert model_of(rows["3017"]).expert_capacity_factor == 1.0
    assert model_of(rows["3010"]).expert_capacity_factor is None
    dense = {**rows["3017"], **dict.fromkeys(("num_experts", "top_k", "expert_hidden",
                                              "shared_experts", "moe_layer_freq",
                                              "first_dense_layers"), "")}
    with pytest.raises(ConfigError, match="capacity_factor='1.0' needs num_experts"):
        model_of(dense)


def test_cuda_graphs_drop_the_dispatch_floor_but_not_of_a_dropless_moe_layer() -> None:
    """A CPU-bound layer (slow dispatch): graphed, its forward idles only the kernel gaps; a
    dropless MoE layer cannot be captured whole and keeps its launches; a padded one is
    graphed like a dense layer."""
    slow = dataclasses.replace(MCORE, kernel_dispatch_s=1e-3)
    graphed = dataclasses.replace(slow, cuda_graphs=True)
    dropless = dataclasses.replace(QWEN3, expert_load_imbalance=1.0)
    padded = dataclasses.replace(dropless, expert_capacity_factor=1.0)
    assert _cost(dropless, graphed) == _cost(dropless, slow)
    eager, captured = _cost(padded, slow), _cost(padded, graphed)
    assert captured.idle_f < eager.idle_f and captured.idle_b < eager.idle_b
    gaps = _cost(padded, dataclasses.replace(graphed, kernel_gap_s=0.0))
    assert gaps.idle_f == 0.0 and gaps.idle_b == 0.0  # nothing left but the gaps


def test_a_rows_cuda_graphs_reach_its_profile() -> None:
    from hetpar.validation.predict import predict_row, row_profile

    rows = {r["row_id"]: r for r in read_runs(MOE_RUNS)}
    assert row_profile(rows["3017"]).cuda_graphs
    assert not row_profile(rows["3021"]).cuda_graphs
    assert not row_profile({**rows["3017"], "cuda_graphs": ""}).cuda_graphs  # framework's
    res = predict_row({**rows["3017"], "cuda_graphs": "yes"})
    assert res.status == "unsupported" and "cuda_graphs='yes' not allowed" in res.reason
