"""Fit a network kind's latency and efficiency to bundled nccl-tests rows (one procedure).

A link kind's ``net_latency_us`` (L) and ``efficiency`` (e) enter every row's time linearly:
the (algorithm, protocol) NCCL's tuner picks for the row (``collectives.nccl_lines``) costs
``a0 + c x L + d / e`` seconds, where ``a0`` is the rest of its latency, ``c`` the number of
times its inter-node steps pay the fabric's latency, and ``d`` its bytes over the kind's line
rate. ``fit.solve`` (the probe's fit: squared log residuals, L >= 0) finds (L, 1/e); the
choice of each row's line is then redone at the fitted values until it no longer changes.

Only rows of the package's own set (``validation/collectives/nccl-tests.csv``) are fitted; the
catalog file of each kind names the rows its values came from, and ``tests/test_fabric_fit.py``
checks that they are what this fit gives. Run one fit with
``python -m hetpar.net.fabric_fit KIND ROW_ID...``.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from hetpar.errors import ConfigError
from hetpar.net import fit
from hetpar.net.collectives import Level, Line, nccl_lines
from hetpar.net.links import LinkKind
from hetpar.validation_collectives import Measured, bus_factor, read_rows, row_shape

BUNDLED = Path(__file__).resolve().parent.parent / "validation" / "collectives" \
    / "nccl-tests.csv"
"""The package's own collectives set (the only rows any constant is fitted to)."""


@dataclass(frozen=True, kw_only=True)
class FabricFit:
    """A kind's fitted latency and efficiency, and the busbw MAPE over the fitted rows."""

    kind: str
    net_latency_us: float
    efficiency: float
    rows: tuple[str, ...]
    mape_pct: float


def _with(levels: Sequence[Level], kind: str, lat_us: float, eff: float) -> list[Level]:
    """``levels`` with every path of ``kind`` at latency ``lat_us`` and efficiency ``eff``
    (its bandwidth rescaled from the catalog's efficiency)."""
    out = []
    for lv in levels:
        k = lv.path.kind
        if k is not None and k.name == kind:
            k2: LinkKind = replace(k, net_latency_us=lat_us, efficiency=eff)
            lv = Level(lv.size, replace(lv.path, bandwidth=lv.path.bandwidth * eff / k.efficiency,
                                        kind=k2))
        out.append(lv)
    return out


def _line(levels: Sequence[Level], op: str, size: float, version: tuple[int, int] | None,
          pick: tuple[str, str] | None = None) -> Line:
    lines = nccl_lines(levels, op, version)
    if pick:
        return next(ln for ln in lines if (ln.algorithm, ln.protocol) == pick)
    return min(lines, key=lambda ln: ln.time(size))


def terms(m: Measured, kind: str, lat_us: float, eff: float,
          base: Path = BUNDLED.parent) -> tuple[float, float, float]:
    """(a0, c, d) of row ``m`` (systems in ``base``/systems): its seconds are a0 + c x L + d / e
    on the line NCCL picks at (lat_us, eff), L in seconds."""
    shape = row_shape(m.system, m.gpus, m.per_node, base)
    if not any(lv.path.kind and lv.path.kind.name == kind for lv in shape.levels):
        raise ConfigError(f"row {m.row_id}: system {m.system!r} has no {kind!r} level")
    ver, size = shape.library, float(m.size)
    ln = _line(_with(shape.levels, kind, lat_us, eff), m.collective, size, ver)
    pick = (ln.algorithm, ln.protocol)
    at0 = _line(_with(shape.levels, kind, 0.0, eff), m.collective, size, ver, pick)
    at1 = _line(_with(shape.levels, kind, 1.0, eff), m.collective, size, ver, pick)
    half = _line(_with(shape.levels, kind, 0.0, eff / 2), m.collective, size, ver, pick)
    if not math.isclose(half.b, 2 * at0.b, rel_tol=1e-6):
        raise ConfigError(f"row {m.row_id}: its time is not bound by the {kind!r} level, so it "
                          "says nothing of that kind's efficiency; leave it out of the fit")
    bytes_s = at0.run(size) - at0.a  # as NCCL runs it (on fewer channels below Line.full)
    return at0.a, (at1.a - at0.a) / 1e-6, bytes_s * eff


def fit_kind(kind: str, row_ids: Sequence[str], start: tuple[float, float] = (0.0, 0.9),
             path: Path = BUNDLED) -> FabricFit:
    """Fit ``kind``'s (net_latency_us, efficiency) to rows ``row_ids`` of the bundled set."""
    rows = {m.row_id: m for m in read_rows(path)}
    missing = [r for r in row_ids if r not in rows]
    if missing:
        raise ConfigError(f"{path}: no rows {', '.join(missing)}")
    use = [rows[r] for r in row_ids]
    lat_us, eff = start
    for _ in range(8):  # the choice of line moves with the values: redo until it holds
        rows_t = [terms(m, kind, lat_us, eff, path.parent) for m in use]
        seconds = [m.size * bus_factor(m.collective, m.gpus) / (m.busbw * 1e9) for m in use]
        lat, u = fit.solve([(c, d, t) for (_, c, d), t in zip(rows_t, seconds, strict=True)],
                           offsets=[a for a, _, _ in rows_t])
        new = (lat * 1e6, min(1.0, 1 / u))
        if all(math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12) for x, y in zip(new, (lat_us, eff),
                                                                             strict=True)):
            break
        lat_us, eff = new
    errs = []
    for m in use:
        a, c, d = terms(m, kind, lat_us, eff, path.parent)
        pred = m.size * bus_factor(m.collective, m.gpus) / (a + c * lat_us * 1e-6 + d / eff) / 1e9
        errs.append(abs(pred - m.busbw) / m.busbw)
    return FabricFit(kind=kind, net_latency_us=lat_us, efficiency=eff, rows=tuple(row_ids),
                     mape_pct=100 * sum(errs) / len(errs))


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m hetpar.fabric_fit", description=__doc__)
    p.add_argument("kind", help="link kind (hetpar/catalog/links)")
    p.add_argument("rows", nargs="+", help="row ids of the bundled set, or FIRST-LAST")
    a = p.parse_args(argv)
    ids: list[str] = []
    for r in a.rows:
        lo, _, hi = r.partition("-")
        if hi and not (lo.isdigit() and hi.isdigit()):
            p.error(f"rows: {r!r} is not FIRST-LAST")
        ids += [str(i) for i in range(int(lo), int(hi) + 1)] if hi else [r]
    try:
        f = fit_kind(a.kind, ids)
    except ConfigError as e:  # bad input: one line, exit 2, as the CLI's error boundary
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    print(f"{f.kind}: net_latency_us = {f.net_latency_us:.1f}, efficiency = {f.efficiency:.3f} "
          f"({len(f.rows)} rows, busbw MAPE {f.mape_pct:.1f}%)")


if __name__ == "__main__":
    main()
