"""Pairwise order accuracy of predictions and prediction intervals from held-out residuals."""

from __future__ import annotations

import functools
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence

from hetpar.validation.predict import RowResult

GROUP_COLUMNS = ("source", "n_layers", "hidden", "n_heads", "n_kv_heads", "ffn_hidden",
                 "vocab", "gpu", "num_gpus", "gbs", "seq_len")
"""Runs of the same job: same source, model shape, GPU, GPU count, global batch, sequence."""
MIN_GAP = 0.03
"""Pairs whose measured throughputs differ by less than this share are not ranked."""
COVERAGE = 0.8
"""Intervals span the 10th to 90th percentile of the held-out log errors of their kind."""


def pairwise_order(
    rows: Sequence[Mapping[str, str]], results: Sequence[RowResult]
) -> tuple[int, int]:
    """(pairs put in the measured order, pairs ranked) over the groups of the same job; a
    pair predicted equal is not in order."""
    groups: dict[tuple[str, ...], list[RowResult]] = defaultdict(list)
    for row, res in zip(rows, results, strict=True):
        if res.predicted is not None:
            groups[tuple(row[c].strip() for c in GROUP_COLUMNS)].append(res)
    right = total = 0
    for rs in groups.values():
        for i, a in enumerate(rs):
            for b in rs[i + 1:]:
                lo, hi = sorted((a.measured, b.measured))
                if hi < lo * (1 + MIN_GAP):
                    continue
                assert a.predicted is not None and b.predicted is not None
                total += 1
                # an exact tie in the predictions orders nothing: it counts as wrong, whichever
                # row measured lower (before, it was right whenever the first one did)
                if a.predicted != b.predicted:
                    right += (a.measured > b.measured) == (a.predicted > b.predicted)
    return right, total


def kind_of(row: Mapping[str, str]) -> str:
    """The kind of run an interval is drawn for: its framework (blank: default)."""
    return row.get("framework", "").strip() or "default"


def residual_bands(
    rows: Sequence[Mapping[str, str]], held_out: Sequence[RowResult]
) -> dict[str, tuple[float, float]]:
    """Per kind (and "all"): the (low, high) quantiles of log(predicted / measured)."""
    by: dict[str, list[float]] = defaultdict(list)
    for row, res in zip(rows, held_out, strict=True):
        if res.predicted and res.measured > 0:
            e = math.log(res.predicted / res.measured)
            by[kind_of(row)].append(e)
            by["all"].append(e)
    return {k: (_quantile(v, (1 - COVERAGE) / 2), _quantile(v, (1 + COVERAGE) / 2))
            for k, v in by.items() if len(v) >= 3 or k == "all"}


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


def interval(predicted: float, kind: str,
             bands: Mapping[str, tuple[float, float]]) -> tuple[float, float] | None:
    """The interval for a prediction: a held-out error of its kind would put the truth at
    predicted / exp(error)."""
    band = bands.get(kind) or bands.get("all")
    if band is None:
        return None
    lo, hi = band
    return predicted / math.exp(hi), predicted / math.exp(lo)
