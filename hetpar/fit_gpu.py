"""The GPU efficiency asymptotes as parameters of the one fit: their priors, ranges and penalty.

Each GPU type with rows gets two coordinates, its matmul and attention f_inf (the large-kernel
fraction of peak of its efficiency tables; the size scale t0 and the STREAM-measured memory
table stay as cited in its file). The prior is the GPU file's own value, from published
microbenchmarks (its ``sources``); the fit pays a Gaussian penalty in log(f / prior), so a GPU
whose few rows come from one publication stays near its prior.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

from hetpar.catalog import load_gpu_prior
from hetpar.catalog.gpu_fit import KERNELS, SIGMA, entry, prior
from hetpar.errors import ConfigError
from hetpar.sim.profile import FittedParams

SOURCE = {k: f"{k} f_inf of the GPU file (its cited microbenchmark), log-normal prior, "
             f"sigma {s}" for k, s in SIGMA.items()}


@dataclass(frozen=True, kw_only=True)
class GpuParameter:
    """One GPU's matmul or attention asymptote: a coordinate of the fit with its prior."""

    name: str
    gpu: str
    kernel: str
    priors: tuple[float, float]
    """The GPU file's (matmul, attention) asymptotes."""
    low: float
    high: float
    weight: float
    """Penalty weight: (rows / sources of this GPU) x loss scale / rows fitted."""
    source: str

    @property
    def prior(self) -> float:
        return self.priors[KERNELS.index(self.kernel)]

    def get(self, p: FittedParams) -> float:
        hit = entry(p.gpu_efficiency, self.gpu)
        return (hit or self.priors)[KERNELS.index(self.kernel)]

    def put(self, p: FittedParams, x: float) -> FittedParams:
        old = entry(p.gpu_efficiency, self.gpu) or self.priors
        m, a = (x if k == self.kernel else v for k, v in zip(KERNELS, old, strict=True))
        rest = tuple(t for t in p.gpu_efficiency if t[0] != self.gpu)
        return dataclasses.replace(p, gpu_efficiency=tuple(sorted((*rest, (self.gpu, m, a)))))

    def penalty(self, p: FittedParams) -> float:
        """Negative log prior in the loss's units: a MAP fit whose rows of one source count
        as one observation (their errors are shared), at the loss's own scale."""
        z = math.log(self.get(p) / self.prior) / SIGMA[self.kernel]
        return self.weight * z * z / 2


def gpu_parameters(rows: Sequence[dict[str, str]], scale: float) -> list[GpuParameter]:
    """Two coordinates per GPU type in ``rows`` (the rows the fit uses); ``scale``: the
    Laplace scale of the log errors at the start."""
    by: dict[str, list[str]] = {}
    for r in rows:
        by.setdefault(r["gpu"].strip(), []).append(r["source"].split(" (")[0].strip())
    out = []
    for name, sources in sorted(by.items()):
        try:
            priors = prior(load_gpu_prior(name))
        except ConfigError:
            continue  # an unknown GPU: its rows are unsupported, nothing to fit
        weight = len(sources) / len(set(sources)) * scale / len(rows)
        for k, f0 in zip(KERNELS, priors, strict=True):
            spread = math.exp(3 * SIGMA[k])
            out.append(GpuParameter(name=f"{name}.{k}", gpu=name, kernel=k, priors=priors,
                                    low=round(f0 / spread, 4),
                                    high=round(min(0.98, f0 * spread), 4),
                                    weight=weight, source=SOURCE[k]))
    return out


def keep_gpus(p: FittedParams, rows: Sequence[dict[str, str]]) -> FittedParams:
    """``p`` without the asymptotes of GPUs that have no row in ``rows`` (back to their
    prior: a fold that holds out a GPU's only source must not keep that source's pull)."""
    names = {r["gpu"].strip() for r in rows}
    return dataclasses.replace(p, gpu_efficiency=tuple(t for t in p.gpu_efficiency
                                                       if t[0] in names))


def row_params(p: FittedParams, gpu: str) -> FittedParams:
    """The part of ``p`` one row on ``gpu`` depends on (the memo key of its prediction)."""
    return dataclasses.replace(p, gpu_efficiency=tuple(t for t in p.gpu_efficiency
                                                       if t[0] == gpu))
