"""Shared helpers for the runtime tests: tiny models, a distributed run, parity checks."""

from __future__ import annotations

from typing import Any

import torch
from loadscale import deadline, limits

from hetpar.runtime.launch import launch
from hetpar.runtime.layout import Layout, build_layout
from hetpar.runtime.trainer import RankResult, gather_full, reference, train_rank
from hetpar.runtime.worker import RunConfig
from hetpar.specs.cluster import ClusterSpec
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import Plan

TINY_GPT = ModelSpec(name="t-gpt", n_layers=4, hidden=32, n_heads=4, n_kv_heads=4,
                     ffn_hidden=64, vocab=64, seq_len=8)
TINY_LLAMA = ModelSpec(name="t-llama", n_layers=4, hidden=32, n_heads=4, n_kv_heads=2,
                       ffn_hidden=48, vocab=64, seq_len=8, mlp="swiglu", norm="rmsnorm",
                       position="rope", bias=False)
# a hang fails within a minute (stretched by the load); rendezvous of 4 processes
CFG = RunConfig(timeout_s=deadline(60))
# importing torch on a loaded 2-core machine can take longer than 10 s


def _rank_fn(rank: int, store: Any, layout: Layout, cfg: RunConfig, steps: int) -> RankResult:
    return train_rank(layout, cfg, steps)


def run_plan(plan: Plan, model: ModelSpec, steps: int = 3, cfg: RunConfig = CFG,
             cluster: ClusterSpec | None = None) -> tuple[Layout, list[RankResult]]:
    """Train ``plan`` on forked ranks (of ``cluster``'s devices, default a local one) and
    return the layout and every rank's result."""
    layout = build_layout(plan, model, cluster)
    return layout, launch(_rank_fn, layout.world_size, layout, cfg, steps, **limits(cfg.timeout_s))


def assert_parity(plan: Plan, model: ModelSpec, steps: int = 3, cfg: RunConfig = CFG,
                  cluster: ClusterSpec | None = None) -> list[float]:
    """Run ``plan`` and the single-process reference; compare losses and every replica's params."""
    layout, res = run_plan(plan, model, steps, cfg, cluster)
    ref_losses, ref_params = reference(model, layout.plan.batch, steps, CFG)
    for r in res:
        assert len(r.losses) == steps
        for a, b in zip(r.losses, ref_losses, strict=True):
            assert abs(a - b) <= 1e-5 * abs(b), (r.rank, r.losses, ref_losses)
    for rep in range(layout.replicas):
        full = gather_full(layout, res, rep)
        assert set(full) == set(ref_params), sorted(set(full) ^ set(ref_params))
        for name, p in full.items():
            err = (p - ref_params[name]).abs().max().item()
            assert err <= 1e-6, (rep, name, err)
    # The run must have moved the parameters, or the comparison proves nothing.
    moved = max((ref_params[n] - p0).abs().max().item() for n, p0 in _initial(model).items())
    assert moved > 1e-3
    return res[0].losses


def _initial(model: ModelSpec) -> dict[str, torch.Tensor]:
    from hetpar.runtime import model as M

    infos = M.param_infos(model, range(model.n_layers), True, True)
    return {n: M.init_param(n, i, CFG.seed, CFG.dtype) for n, i in infos.items()}
