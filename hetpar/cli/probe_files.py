"""What `hetpar probe` writes: the fitted cluster file, the raw points CSV, the bandwidth trace."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hetpar.dynamic.events import COLUMNS as TRACE_COLUMNS
from hetpar.io import dump_toml, write_text_atomic
from hetpar.net.fit import KIND, LevelFit, Point, bus_bandwidth, coefficients
from hetpar.validation_collectives import COLUMNS as POINT_COLUMNS
from hetpar.validation_collectives import OPS as POINT_OPS

GROUP = "probe"
"""The node group's name in the cluster file (trace targets name it: nvlink:probe, nic:probe)."""


def gbps(bytes_s: float) -> float:
    """Bytes/s as the cluster schema's Gbit/s (the measured kind's efficiency is 1)."""
    return bytes_s * 8 / 1e9


def cluster_doc(name: str, gpu: str, nodes: int, per_node: int,
                fits: dict[str, LevelFit], description: str,
                sources: Sequence[str]) -> dict[str, Any]:
    """The cluster document: one node group whose measured levels carry the fitted values.

    Across nodes the fit is of one rank per node, i.e. the whole node's path, so it is written
    as a NIC shared by the node's ranks (``nic_shared``: a plan using one rank per node gets it
    all, a full node a 1/per_node share each, as the simulator splits a shared NIC)."""
    group: dict[str, Any] = {"name": GROUP, "gpu": gpu, "num_nodes": nodes,
                             "gpus_per_node": per_node}
    if "scale-up" in fits:
        f = fits["scale-up"]
        group.update(scaleup_kind=KIND, scaleup_bandwidth_gbps=_sig(gbps(f.bandwidth_bytes_s)),
                     scaleup_latency_us=_sig(f.latency_s * 1e6))
    if "network" in fits:
        f = fits["network"]
        group.update(nic_kind=KIND, nic_shared=True,
                     nic_bandwidth_gbps=_sig(gbps(f.bandwidth_bytes_s) / per_node),
                     nic_latency_us=_sig(f.latency_s * 1e6))
    return {"name": name, "description": description, "sources": list(sources),
            "node_groups": [group]}


def _sig(x: float) -> float:
    """Six significant digits: more than any measurement here carries."""
    return float(f"{x:.6g}")


def fit_lines(fits: dict[str, LevelFit],
              per_op: dict[str, dict[str, LevelFit | None]]) -> list[str]:
    """The comment block's lines on each level: the written fit, its spread, each op alone."""
    out = []
    for level in ("scale-up", "network"):
        f = fits.get(level)
        if f is None:
            out.append(f"{level}: not measured ("
                       + ("one node" if level == "network" else "one rank per node") + ")")
            continue
        lo, hi = f.latency_range_s
        blo, bhi = f.bandwidth_range_bytes_s
        out.append(f"{level}: latency_us {f.latency_s * 1e6:.4g} (each repetition alone "
                   f"{lo * 1e6:.4g}-{hi * 1e6:.4g}), bandwidth_gbps "
                   f"{gbps(f.bandwidth_bytes_s):.4g} ({gbps(blo):.4g}-{gbps(bhi):.4g}); "
                   f"fitted on {', '.join(f.ops)}: {f.points} points, residual "
                   f"{f.residual_mape_pct:.1f}%, {f.repetitions} repetitions fitted alone")
        for op, g in per_op.get(level, {}).items():
            if g is None:
                out.append(f"  {op} alone: no bandwidth (its times do not grow with size)")
                continue
            out.append(f"  {op} alone: latency_us {g.latency_s * 1e6:.4g}, bandwidth_gbps "
                       f"{gbps(g.bandwidth_bytes_s):.4g}, residual {g.residual_mape_pct:.1f}%")
    return out


def cluster_text(doc: dict[str, Any], comments: Sequence[str]) -> str:
    """The TOML text: the comment block (the spread, which the schema has no field for) first."""
    head = "".join(f"# {line}\n" for line in comments)
    return head + dump_toml(doc)


def points_text(points: Sequence[Point], system: str, nodes: int, source: str) -> str:
    """The collectives as `hetpar validate-collectives` rows (sends have no row there)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(POINT_COLUMNS)
    rows = sorted((p for p in points if p.op in POINT_OPS),
                  key=lambda p: (p.level, p.op, p.size_bytes))
    for i, p in enumerate(rows, 1):
        per_node = p.ranks if p.level == "scale-up" else 1
        w.writerow([i, system, p.op, p.ranks, per_node, p.size_bytes,
                    f"{bus_bandwidth(p) / 1e9:.6g}",
                    f"{source}; {p.statistic} of {len(p.seconds)} repetitions"])
    return buf.getvalue()


def trace_text(samples: Sequence[Any], fits: dict[str, LevelFit], per_node: int,
               cluster: str, duration_s: float, description: str) -> str:
    """A `hetpar replay` trace: each sample's bandwidth as a ``bandwidth`` event in Gbit/s per
    GPU, the unit of the cluster file's field (``nvlink:probe`` per node for a node's ranks,
    ``nic:probe`` across nodes). A sample's bandwidth is its time less the fitted latency
    steps, over the fit's bytes per bandwidth (the same line the fit solved)."""
    buf = io.StringIO()
    for key, value in (("name", Path(cluster).stem + "-bandwidth" if cluster else "probe"),
                       ("description", description), ("cluster", cluster),
                       ("horizon_s", f"{duration_s:g}")):
        if value:
            buf.write(f"# {key}: {value}\n")
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(TRACE_COLUMNS)
    for s in samples:
        fit = fits[s.level]
        c, d = coefficients("all_reduce", s.ranks)
        moving = s.seconds - c * fit.latency_s
        if moving <= 0:
            continue  # faster than the fitted latency alone: no bandwidth in this sample
        bw = gbps(d * s.size_bytes / moving)
        if s.level == "network":
            w.writerow([f"{s.t_s:g}", "bandwidth", f"nic:{GROUP}", f"{bw / per_node:.6g}", "", ""])
        else:
            w.writerow([f"{s.t_s:g}", "bandwidth", f"nvlink:{GROUP}", f"{bw:.6g}", s.node, ""])
    return buf.getvalue()


def write(path: str | None, text: str) -> None:
    if path:
        write_text_atomic(path, text)

