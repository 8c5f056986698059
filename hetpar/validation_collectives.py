"""Predict measured collective bus bandwidths (nccl-tests rows) and compare with the measurement."""

from __future__ import annotations

import csv
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple

from hetpar.catalog import load_cluster
from hetpar.errors import ConfigError
from hetpar.io import check_name, is_number
from hetpar.net import collectives as algo
from hetpar.sim import network as net
from hetpar.sim import terms

COLUMNS = ("row_id", "system", "collective", "gpus", "gpus_per_node", "size_bytes",
           "measured_busbw_gbyte_s", "source")
OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
OPTIONAL = ("algorithm",)
"""An optional last column: the algorithm the row's source ran (NCCL_ALGO), one of
``collectives.ALGORITHMS``; empty: the library's own choice."""


@dataclass(frozen=True)
class CollectiveResult:
    """One row: predicted and measured bus bandwidth (GB/s) and the signed error in percent."""

    row_id: str
    system: str
    collective: str
    size_bytes: int
    predicted_busbw_gbyte_s: float
    measured_busbw_gbyte_s: float
    error_pct: float
    source: str

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' bus bandwidth over algorithm bandwidth (its doc/PERFORMANCE.md)."""
    return terms.ring_traffic(op, n)


def predict(system: str, op: str, gpus: int, per_node: int, size: int, base: Path,
            algorithm: str | None = None, cluster_ref: str | None = None) -> float:
    """Bus bandwidth in GB/s hetpar predicts for one nccl-tests row (``algorithm``: one of
    ``collectives.ALGORITHMS`` forced, as NCCL_ALGO does; default: the cluster's choice;
    ``cluster_ref``: price the row on this cluster instead of its system's)."""
    shape = row_shape(system, gpus, per_node, base, cluster_ref)
    if op == "all_to_all":
        t = algo.all_to_all(shape.levels, size)
    elif algorithm:
        t = algo.ALGORITHMS[algorithm](shape.levels, op, size)
        if not math.isfinite(t):  # as NCCL_ALGO naming an algorithm without this collective
            raise ConfigError(f"algorithm {algorithm!r} does not run {op} on {gpus} GPUs as "
                              f"{per_node} per node (system {system!r}); allowed: another "
                              "algorithm (--algorithm or the row's algorithm cell), or none "
                              "(NCCL's choice)")
    else:
        t = {"all_reduce": net.all_reduce, "all_gather": net.all_gather,
             "reduce_scatter": net.reduce_scatter}[op](shape, size)
    return size / t * bus_factor(op, gpus) / 1e9


def row_shape(system: str, gpus: int, per_node: int, base: Path,
              cluster_ref: str | None = None) -> net.GroupShape:
    """The communicator of one row: ``per_node`` GPUs on each of the first gpus / per_node
    nodes of the system's first node group (``cluster_ref``: of that cluster instead)."""
    ref = base / "systems" / f"{system}.toml"
    if cluster_ref:
        system = cluster_ref
    cluster = load_cluster(str(ref) if ref.is_file() and not cluster_ref else system)
    g = cluster.node_groups[0]
    if gpus % per_node or per_node > g.gpus_per_node or gpus // per_node > g.num_nodes:
        raise ConfigError(f"row needs {gpus} GPUs as {per_node} per node; system {system!r} "
                          f"has {g.num_nodes} nodes of {g.gpus_per_node}")
    devices = [(g.name, node * g.gpus_per_node + i)
               for node in range(gpus // per_node) for i in range(per_node)]
    # a NIC shared by a node's GPUs is split among those the row uses, as `simulate` splits it
    return net.topology(cluster).with_usage(devices).shape(devices)


class Measured(NamedTuple):
    """One parsed row of a collectives CSV."""

    row_id: str
    system: str
    collective: str
    gpus: int
    per_node: int
    size: int
    busbw: float
    source: str
    algorithm: str = ""


def read_rows(path: str | Path) -> list[Measured]:
    """The rows of a collectives CSV, checked cell by cell (ConfigError naming file:line)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: file not found")
    with p.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        if tuple(reader.fieldnames or ()) not in (COLUMNS, COLUMNS + OPTIONAL):
            raise ConfigError(f"{p}: columns must be {', '.join(COLUMNS)} (then optionally "
                              f"{', '.join(OPTIONAL)}); got {', '.join(reader.fieldnames or ())}")
        rows = list(reader)
    out: list[Measured] = []
    seen: dict[str, int] = {}  # row_id -> line: results are reported and joined by it
    for i, r in enumerate(rows, 2):
        where = f"{p}:{i}"
        if None in r or None in r.values():  # DictReader: extra cells under None, missing ones None
            more = "more" if None in r else "fewer"
            raise ConfigError(f"{where}: {more} cells than the {len(COLUMNS)} columns "
                              f"({', '.join(COLUMNS)})")
        rid = (r["row_id"] or "").strip()
        if rid in seen:
            raise ConfigError(f"{where}: row_id {rid!r} also on line {seen[rid]}; row ids must "
                              "be unique")
        seen[rid] = i
        check_name(r["system"] or "", f"{where}: system")
        if r["collective"] not in OPS:
            raise ConfigError(f"{where}: collective {r['collective']!r}; allowed: {', '.join(OPS)}")
        gpus, per = _cell(r, "gpus", int, 2, where), _cell(r, "gpus_per_node", int, 1, where)
        size = _cell(r, "size_bytes", int, 1, where)
        meas = _cell(r, "measured_busbw_gbyte_s", float, 0.0, where)
        ran = r.get("algorithm", "").strip()
        if ran and ran not in algo.ALGORITHMS:
            raise ConfigError(f"{where}: algorithm {ran!r}; allowed: "
                              f"{', '.join(sorted(algo.ALGORITHMS))}, or empty")
        out.append(Measured(r["row_id"], r["system"], r["collective"], gpus, per, size, meas,
                            r["source"], ran))
    return out


def run_file(path: str | Path, algorithm: str | None = None,
             cluster: str | None = None) -> list[CollectiveResult]:
    """Every row of a collectives CSV, predicted (on ``cluster`` instead of each row's system
    when given: points `hetpar probe` measured, priced on another run's fitted file), each
    with the algorithm its ``algorithm`` cell names, unless ``algorithm`` forces one for all."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: file not found")
    if cluster:
        load_cluster(cluster)  # a bad --cluster is named before any row
    out = []
    for m in read_rows(p):
        pred = predict(m.system, m.collective, m.gpus, m.per_node, m.size, p.parent,
                       algorithm or m.algorithm or None, cluster)
        out.append(CollectiveResult(m.row_id, m.system, m.collective, m.size, pred, m.busbw,
                                    100 * (pred - m.busbw) / m.busbw, m.source))
    return out


def _cell(r: dict[str, str], key: str, kind: type[int] | type[float], low: float,
          where: str) -> Any:
    """The cell as ``kind``, finite and at least ``low`` (above it for floats), or a ConfigError."""
    text = r[key].strip()
    what = "an integer" if kind is int else "a number"
    # int() and float() also read "\uff12" and "1_6": the strict parser's syntax first (nan
    # and inf pass on, to be refused below with the allowed range)
    if not is_number(text) and text.lower().lstrip("+-") not in ("nan", "inf", "infinity"):
        raise ConfigError(f"{where}: {key}={text!r} is not {what}")
    try:
        value = kind(text)
    except ValueError:
        raise ConfigError(f"{where}: {key}={text!r} is not {what}") from None
    if not math.isfinite(value) or value < low or (kind is float and value <= low):
        bound = f">= {low:g}" if kind is int else f"> {low:g}"
        raise ConfigError(f"{where}: {key}={text!r} not allowed; allowed: finite, {bound}")
    return value


def mape(results: list[CollectiveResult], lo: int = 0, hi: int | None = None) -> float | None:
    """Mean absolute percentage error of the rows with lo <= size < hi."""
    errs = [abs(r.error_pct) for r in results
            if r.size_bytes >= lo and (hi is None or r.size_bytes < hi)]
    return sum(errs) / len(errs) if errs else None


MIB = 2**20
"""Where nccl-tests' small and large messages part: the two size classes reported apart."""


def by_system(results: list[CollectiveResult]) -> list[dict[str, object]]:
    """Per system, in file order: rows, and MAPE of messages of 1 MiB and up and below."""
    names = list(dict.fromkeys(r.system for r in results))
    out = []
    for name in names:
        rows = [r for r in results if r.system == name]
        out.append({"system": name, "rows": len(rows), "mape_ge_1mib_pct": mape(rows, MIB),
                    "mape_lt_1mib_pct": mape(rows, 0, MIB)})
    return out
