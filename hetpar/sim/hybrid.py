"""Hybrid and state-space layers in the layer time: the parts a layer's mean is made of and
the work of the conv and selective-scan kernels."""

from __future__ import annotations

from collections import Counter

from hetpar.formulas.ssm import ssm_core_flops_per_token, ssm_kernel_bytes_per_token
from hetpar.specs.model import ModelSpec
from hetpar.specs.ssm import LayerKind, has_mlp, has_ssm


def layer_parts(model: ModelSpec, moe: bool) -> list[tuple[LayerKind, float]]:
    """(layer kind, weight) pairs whose GEMMs make one layer's mean; the caller
    (sim/chunk.py::layer_cost) mixes a dense and an MoE call by the chunk's MoE layers.

    A transformer layer is one part; a hybrid model's mixers weigh by their share of the
    layers, and its MLP by 1 in the MoE call (an MoE layer has one) and by the share of the
    dense layers that have an MLP in the dense call, so that the two calls mixed give each
    MLP kind its count (Nemotron-H's E and - blocks beside its M and * blocks)."""
    if model.layer_kinds is None:
        return [("attention+mlp", 1.0)]
    n, kinds = model.n_layers, Counter(model.layer_kinds)
    mixers = [(k.removesuffix("+mlp"), c / n) for k, c in kinds.items() if k != "mlp"]
    n_moe = sum(model.moe_layer_flags)
    with_mlp = sum(c for k, c in kinds.items() if has_mlp(k))
    mlp = 1.0 if moe else (with_mlp - n_moe) / (n - n_moe) if n > n_moe else 0.0
    return [*mixers, ("mlp", mlp)]  # type: ignore[list-item]


def ssm_kernel_work(model: ModelSpec, tokens: int, act_bytes: float) -> tuple[float, float, float]:
    """(share of layers with an SSM mixer, forward FLOPs, HBM bytes) of one such layer's conv
    and scan for ``tokens`` tokens (formulas/ssm.py)."""
    s = model.ssm
    assert s is not None, "the caller checks that the model has state-space layers"
    share = sum(map(has_ssm, model.kinds)) / model.n_layers
    return (share, tokens * ssm_core_flops_per_token(s),
            tokens * ssm_kernel_bytes_per_token(s, act_bytes))
