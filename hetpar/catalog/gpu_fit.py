"""Fitted GPU efficiency asymptotes: a GPU file's matmul/attention tables at a fitted f_inf."""

from __future__ import annotations

import dataclasses
from functools import lru_cache
from pathlib import Path
from typing import Any

from hetpar.errors import ConfigError
from hetpar.io import read_document
from hetpar.specs.gpu import EfficiencyTable, GPUSpec

FIT_PATH = Path(__file__).resolve().parent / "fit" / "simulator.toml"
KERNELS = ("matmul", "attention")
"""The kernel families whose asymptote is fitted; the memory table's (STREAM-measured) is not."""
SIGMA = {"matmul": 0.15, "attention": 0.20}
"""Prior spread of log f_inf. matmul: the published large-GEMM fractions in the GPU files span
0.65-0.87 of the dense peak (cuBLAS BF16 4096^3-8192^3 on A100: 0.77-0.87; cuBLASLt FP8 on
H100: 0.65-0.70), about +-0.15 in log around their middle. attention: FlashAttention-2 reaches
0.50-0.73 of A100 peak (Dao 2023, arXiv:2307.08691) and 0.29-0.43 of H100 peak across kernels
(pytorch/benchmark PR 2296), about +-0.2 in log."""
GpuEfficiency = tuple[tuple[str, float, float], ...]
"""(GPU name, matmul f_inf, attention f_inf) per fitted GPU, sorted by name."""


def rescaled(table: EfficiencyTable, f_inf: float) -> EfficiencyTable:
    """``table`` with asymptote ``f_inf`` and the same fixed per-kernel cost t0.

    The tables have the shape time = t0 + size / (f_inf * rate) (docs/catalog.md), i.e.
    1 / f(size) = rate * t0 / size + 1 / f_inf: moving the asymptote adds the same
    1 / f_inf' - 1 / f_inf to every point's reciprocal, so the size scale is kept.
    """
    shift = 1.0 / f_inf - 1.0 / table.fraction[-1]
    return EfficiencyTable(size=table.size,
                           fraction=tuple(round(1.0 / (1.0 / f + shift), 6)
                                          for f in table.fraction))


def prior(gpu: GPUSpec) -> tuple[float, float]:
    """The GPU file's own (matmul, attention) asymptotes: the fit's prior."""
    return gpu.matmul_efficiency.fraction[-1], gpu.attention_efficiency.fraction[-1]


@lru_cache(maxsize=512)
def with_efficiency(gpu: GPUSpec, matmul: float, attention: float) -> GPUSpec:
    """``gpu`` with its matmul and attention asymptotes at the given values (one object per
    value, so the simulator's per-GPU caches keep hitting)."""
    if (matmul, attention) == prior(gpu):
        return gpu
    return dataclasses.replace(
        gpu, matmul_efficiency=rescaled(gpu.matmul_efficiency, matmul),
        attention_efficiency=rescaled(gpu.attention_efficiency, attention))


def entry(fitted: GpuEfficiency, name: str) -> tuple[float, float] | None:
    """The fitted (matmul, attention) asymptotes of GPU ``name``, or None (its prior)."""
    for n, m, a in fitted:
        if n == name:
            return m, a
    return None


def parse(table: dict[str, Any], where: str) -> GpuEfficiency:
    """The [gpu_efficiency] table of a fit file: ``"NAME" = {matmul = F, attention = F}``."""
    out = []
    for name, v in sorted(table.items()):
        if not isinstance(v, dict) or set(v) != set(KERNELS):
            raise ConfigError(f"{where}: gpu_efficiency.{name} must have exactly the keys "
                              f"{', '.join(KERNELS)}; got {v!r}")
        m, a = (v[k] for k in KERNELS)
        if not all(isinstance(x, int | float) and 0 < x <= 1 for x in (m, a)):
            raise ConfigError(f"{where}: gpu_efficiency.{name}: matmul={m!r}, attention={a!r} "
                              "must be in (0, 1]")
        out.append((name, float(m), float(a)))
    return tuple(out)


@lru_cache(maxsize=1)
def bundled() -> GpuEfficiency:
    """The GPU asymptotes of the bundled fit (catalog/fit/simulator.toml)."""
    return parse(read_document(FIT_PATH).get("gpu_efficiency", {}), FIT_PATH.name)


def fitted_gpu(gpu: GPUSpec, fitted: GpuEfficiency) -> GPUSpec:
    """``gpu`` (its file's tables: the prior) at the asymptotes ``fitted`` gives it, if any."""
    hit = entry(fitted, gpu.name)
    return gpu if hit is None else with_efficiency(gpu, *hit)
