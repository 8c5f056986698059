"""Pairwise order accuracy of predictions and prediction intervals from held-out residuals."""

from __future__ import annotations

import functools
import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence

from hetpar.specs.cluster import ClusterSpec
from hetpar.validation.predict import RowResult

GROUP_COLUMNS = ("source", "n_layers", "hidden", "n_heads", "n_kv_heads", "ffn_hidden",
                 "vocab", "gpu", "num_gpus", "gbs", "seq_len")
"""Runs of the same job: same source, model shape, GPU, GPU count, global batch, sequence."""
MIN_GAP = 0.03
"""Pairs whose measured throughputs differ by less than this share are not ranked."""
COVERAGE = 0.8
"""Intervals span the 10th to 90th percentile of the held-out log errors of their kind."""


PLAN_COLUMNS = ("tp", "pp", "dp", "cp", "vpp", "schedule", "sequence_parallel", "mbs",
                "recompute", "zero", "precision", "framework", "gpus_per_node",
                "scaleout_gbps_per_gpu")
"""The columns that tell two runs of the same job apart (a misordered pair names those that
differ; none: the file does not tell the two runs apart, so no prediction can order them)."""


def ranked_pairs(
    rows: Sequence[Mapping[str, str]], results: Sequence[RowResult]
) -> list[tuple[int, int, bool]]:
    """(index a, index b, in the measured order) for every ranked pair: two predicted runs of
    the same job whose measured throughputs differ by ``MIN_GAP`` or more. A pair predicted
    equal is not in order (until 2026-12-07 it was whenever the first row measured lower)."""
    groups: dict[tuple[str, ...], list[int]] = defaultdict(list)
    for i, (row, res) in enumerate(zip(rows, results, strict=True)):
        if res.predicted is not None:
            groups[tuple(row[c].strip() for c in GROUP_COLUMNS)].append(i)
    out = []
    for ix in groups.values():
        for n, i in enumerate(ix):
            for j in ix[n + 1:]:
                a, b = results[i], results[j]
                lo, hi = sorted((a.measured, b.measured))
                if hi < lo * (1 + MIN_GAP):
                    continue
                assert a.predicted is not None and b.predicted is not None
                right = a.predicted != b.predicted and (
                    (a.measured > b.measured) == (a.predicted > b.predicted))
                out.append((i, j, right))
    return out


def pairwise_order(
    rows: Sequence[Mapping[str, str]], results: Sequence[RowResult]
) -> tuple[int, int]:
    """(pairs put in the measured order, pairs ranked) over the groups of the same job."""
    pairs = ranked_pairs(rows, results)
    return sum(r for _, _, r in pairs), len(pairs)


def misordered_pairs(
    rows: Sequence[Mapping[str, str]], results: Sequence[RowResult]
) -> list[dict[str, object]]:
    """The ranked pairs not in the measured order, for ``validate --json``: the two rows,
    measured and predicted ratios (first / second) and the plan columns that differ."""
    out: list[dict[str, object]] = []
    for i, j, right in ranked_pairs(rows, results):
        if right:
            continue
        a, b = results[i], results[j]
        assert a.predicted is not None and b.predicted is not None
        out.append({
            "rows": [a.row_id, b.row_id], "source": a.source,
            "measured_ratio": a.measured / b.measured,
            "predicted_ratio": a.predicted / b.predicted,
            "differs": [c for c in PLAN_COLUMNS
                        if rows[i].get(c, "").strip() != rows[j].get(c, "").strip()],
        })
    return out


def kind_of(row: Mapping[str, str]) -> str:
    """The kind of run an interval is drawn for: its framework (blank: default)."""
    return row.get("framework", "").strip() or "default"


def residual_bands(
    rows: Sequence[Mapping[str, str]], held_out: Sequence[RowResult]
) -> dict[str, tuple[float, float]]:
    """Per kind (and "all"): the (low, high) quantiles of log(predicted / measured), each
    kind's pulled toward the pooled band as far as its sources fail to support a term of its
    own.

    The pull is empirical-Bayes shrinkage of a random-effects model (DerSimonian and Laird
    1986) with sources as the units, since a source's rows share its errors: a kind's weight
    is tau^2 / (tau^2 + v / n_k), with n_k its sources, v the variance of the sources' mean
    errors and tau^2 the variance of the kinds' means beyond what v / n_k explains (method of
    moments, >= 0). One source on one side (issue 33's "other" band: Llama 3's three rows)
    weighs little; a framework whose errors differ consistently over many sources keeps its
    own band.
    """
    by: dict[str, list[float]] = defaultdict(list)
    units: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for row, res in zip(rows, held_out, strict=True):
        if res.predicted and res.measured > 0:
            e = math.log(res.predicted / res.measured)
            by[kind_of(row)].append(e)
            by["all"].append(e)
            units[kind_of(row)][row.get("source", "").split(" (")[0]].append(e)
    if not by:
        return {}
    every = {f"{k}|{s}": e for k, by_src in units.items() for s, e in by_src.items()}
    pooled = _predictive_band(every)
    out = {"all": pooled}
    weights = _shrinkage(units)
    for k, v in by.items():
        if k == "all" or len(v) < 2:
            continue
        lo, hi = _predictive_band(units[k])
        w = weights[k]
        out[k] = (pooled[0] + w * (lo - pooled[0]), pooled[1] + w * (hi - pooled[1]))
    return out


def _predictive_band(units: Mapping[str, Sequence[float]]) -> tuple[float, float]:
    """The (low, high) quantiles of a row of a source not among ``units``: its source's
    offset (one of the sources' mean errors, each source alike) plus a deviation within a
    source (each source's deviations from its mean, each source alike): the random-effects
    predictive distribution, whose spread is between-source plus within-source (Higgins,
    Thompson and Spiegelhalter 2009, J. R. Stat. Soc. A 172(1), Sec. 5: a new study), taken
    empirically instead of as normal. Rows pooled alone give a band as narrow as the
    within-source spread where a source's rows share one error."""
    means = [_mean(e) for e in units.values() if e]
    devs = [(x - m, 1.0 / len(e)) for e, m in zip(units.values(), means, strict=True)
            if len(e) > 1 for x in e]
    if not devs:
        return _quantile(means, (1 - COVERAGE) / 2), _quantile(means, (1 + COVERAGE) / 2)
    pairs = sorted((m + d, w) for m in means for d, w in devs)
    total = sum(w for _, w in pairs)
    lo_q, hi_q = (1 - COVERAGE) / 2 * total, (1 + COVERAGE) / 2 * total
    lo = hi = pairs[-1][0]
    acc, found_lo = 0.0, False
    for x, w in pairs:
        acc += w
        if not found_lo and acc >= lo_q:
            lo, found_lo = x, True
        if acc >= hi_q:
            hi = x
            break
    return lo, hi


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def _variance(xs: Sequence[float]) -> float:
    m = _mean(xs)
    return sum((x - m) ** 2 for x in xs) / (len(xs) - 1) if len(xs) > 1 else 0.0


def _shrinkage(units: Mapping[str, Mapping[str, Sequence[float]]]) -> dict[str, float]:
    """Each kind's weight tau^2 / (tau^2 + v / n_k) (see ``residual_bands``)."""
    source_means = {k: [_mean(e) for e in by_src.values()] for k, by_src in units.items()}
    v = _variance([m for ms in source_means.values() for m in ms])
    sampling = {k: v / len(ms) for k, ms in source_means.items()}
    kind_means = [_mean(ms) for ms in source_means.values()]
    if len(kind_means) < 2:
        return dict.fromkeys(units, 0.0)
    tau2 = max(0.0, _variance(kind_means) - _mean(list(sampling.values())))
    return {k: tau2 / (tau2 + s) if tau2 + s > 0 else 0.0 for k, s in sampling.items()}


def held_out_intervals(
    rows: Sequence[dict[str, str]], held_out: Sequence[RowResult],
    source: Callable[[dict[str, str]], str],
) -> list[tuple[float, float] | None]:
    """Each row's interval from bands built without its own source's residuals, so that
    coverage on a source is judged as for a source the intervals have never seen."""
    keys = [source(r) for r in rows]
    bands_of = {k: residual_bands([r for r, j in zip(rows, keys, strict=True) if j != k],
                                  [h for h, j in zip(held_out, keys, strict=True) if j != k])
                for k in dict.fromkeys(keys)}
    gpus_of = {k: {r.get("gpu", "").strip() for r, j in zip(rows, keys, strict=True) if j != k}
               for k in bands_of}
    return [interval(h.predicted, kind_of(r), bands_of[k],
                     widen=0.0 if r.get("gpu", "").strip() in gpus_of[k] else unseen_gpu_widening())
            if h.predicted else None
            for r, h, k in zip(rows, held_out, keys, strict=True)]


def cluster_widening(cluster: ClusterSpec) -> float:
    """``unseen_gpu_widening()`` where a GPU type of ``cluster`` has no fitted asymptote (no
    validation run was on it: its file's prior stands), else 0."""
    from hetpar.catalog import gpu_spec
    from hetpar.catalog.gpu_fit import bundled

    seen = {n for n, _, _ in bundled()}
    unseen = any(gpu_spec(g.gpu).name not in seen for g in cluster.node_groups)
    return unseen_gpu_widening() if unseen else 0.0


def unseen_gpu_widening() -> float:
    """Extra log half-width for a GPU no fitted row ran on: its GEMM asymptote is only its
    prior (hetpar/fit_gpu.py: log-normal, sigma ``catalog.gpu_fit.SIGMA["matmul"]``), whose
    10th-90th percentile spread (+-1.2816 sigma) a compute-bound step time inherits in full."""
    from hetpar.catalog.gpu_fit import SIGMA

    return 1.2816 * SIGMA["matmul"]


def coverage(results: Sequence[RowResult]) -> float | None:
    """Share (%) of the predicted rows whose measured value lies inside their interval."""
    inside = [r.interval[0] <= r.measured <= r.interval[1] for r in results
              if r.interval is not None and r.measured > 0]
    return 100.0 * sum(inside) / len(inside) if inside else None


def source_coverage(results: Sequence[RowResult], low: float = 70.0,
                    high: float = 90.0) -> dict[str, object]:
    """A source's interval coverage with what its row count allows: the rows with an
    interval, how many hold the measured value, the share, whether any share between
    ``low`` and ``high`` % exists for that many rows, and the chance that an exactly
    calibrated 80% interval lands there (binomial, rows independent: an upper bound where a
    source's rows share one error)."""
    inside = [r.interval[0] <= r.measured <= r.interval[1] for r in results
              if r.interval is not None and r.measured > 0]
    n, k = len(inside), sum(inside)
    ks = [j for j in range(n + 1) if low <= 100.0 * j / n <= high] if n else []
    p = math.fsum(math.comb(n, j) * COVERAGE ** j * (1 - COVERAGE) ** (n - j) for j in ks)
    return {"rows": n, "inside": k, "coverage_pct": 100.0 * k / n if n else None,
            "band_reachable": bool(ks), "p_in_band_if_calibrated": p}


@functools.cache
def bundled_bands() -> dict[str, tuple[float, float]]:
    """The bands stored with the bundled fit ([interval] of catalog/fit/simulator.toml)."""
    from hetpar.io import read_document
    from hetpar.sim.profile import FITTED_PATH

    table = read_document(FITTED_PATH).get("interval", {})
    return {k: (float(v[0]), float(v[1])) for k, v in table.items()}


def _quantile(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    pos = q * (len(s) - 1)
    i = int(pos)
    j = min(i + 1, len(s) - 1)
    return s[i] + (s[j] - s[i]) * (pos - i)


def interval(predicted: float, kind: str, bands: Mapping[str, tuple[float, float]],
             widen: float = 0.0) -> tuple[float, float] | None:
    """The interval for a prediction: a held-out error of its kind would put the truth at
    predicted / exp(error); ``widen``: an independent extra log half-width (extrapolation),
    added to the band's in quadrature."""
    band = bands.get(kind) or bands.get("all")
    if band is None:
        return None
    lo, hi = band
    if widen:
        mid, half = (lo + hi) / 2, (hi - lo) / 2
        half = math.hypot(half, widen)
        lo, hi = mid - half, mid + half
    return predicted / math.exp(hi), predicted / math.exp(lo)
