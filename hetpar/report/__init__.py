"""Self-contained HTML reports: timeline, memory, time breakdown, ranked plans and curves."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import hetpar
from hetpar.io import write_text_atomic


@dataclass(frozen=True, kw_only=True)
class Curve:
    """A line chart: one or more named (x, y) series."""

    title: str
    x_label: str
    y_label: str
    series: tuple[tuple[str, tuple[float, ...], tuple[float, ...]], ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "x_label": self.x_label,
            "y_label": self.y_label,
            "series": [{"name": n, "x": list(x), "y": list(y)} for n, x, y in self.series],
        }


@dataclass(frozen=True, kw_only=True)
class ReportBundle:
    """Everything one HTML page shows. ``plans[0]`` is the plan the summary describes."""

    title: str
    plans: tuple[dict[str, Any], ...]
    """Each: {"name": str, "report": Report.to_dict()}."""
    trace: dict[str, Any] | None = None
    """A Chrome/Perfetto trace (``traceEvents``) of the first plan, or None."""
    curves: tuple[Curve, ...] = field(default_factory=tuple)
    terms: tuple[dict[str, str], ...] = ()
    """The time breakdown's keys in order, each {"key", "color", "limit"} (the simulator's
    registry, ``sim.breakdown.payload()``): the page draws and colours the breakdown by it."""


def _safe_json(data: Any) -> str:
    # "</" inside a <script> block would end it early; escape it (and keep the page one file).
    return json.dumps(data, separators=(",", ":")).replace("</", "<\\/")


def render_html(bundle: ReportBundle) -> str:
    """The report as one HTML string with its data, script and style inlined."""
    pkg = resources.files("hetpar.report")
    template = (pkg / "template.html").read_text(encoding="utf-8")
    script = (pkg / "report.js").read_text(encoding="utf-8")
    data = {
        "title": bundle.title,
        "plans": list(bundle.plans),
        "trace": bundle.trace,
        "curves": [c.to_dict() for c in bundle.curves],
        "breakdown_keys": list(bundle.terms),
    }
    return (
        template.replace("__VERSION__", hetpar.__version__)
        .replace("__DATA__", _safe_json(data))
        .replace("__SCRIPT__", script)
    )


def write_report(path: str | Path, bundle: ReportBundle) -> None:
    """Render ``bundle`` and write it atomically to ``path``."""
    write_text_atomic(path, render_html(bundle))
