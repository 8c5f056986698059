"""Cluster event traces: the schema and a strict CSV/JSON loader whose errors name the line."""

from __future__ import annotations

import csv
import io
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetpar.dynamic.events import COLUMNS, KINDS, TARGETS, EventKind, TraceEvent, event, number
from hetpar.errors import ConfigError
from hetpar.io import decode_utf8
from hetpar.io import parse_json as json_document

__all__ = ["COLUMNS", "KINDS", "TARGETS", "EventKind", "Trace", "TraceEvent", "load_trace",
           "parse_csv", "parse_json", "trace_names"]

HEADER_KEYS = {"name", "description", "horizon_s", "cluster", "restart_s",
               "storage_bandwidth_gbyte_s", "source"}
TRACES_DIR = Path(__file__).resolve().parent.parent / "catalog" / "traces"


@dataclass(frozen=True, kw_only=True)
class Trace:
    """Events in time order over ``[0, horizon_s)`` plus the costs of switching plans."""

    name: str
    horizon_s: float
    events: tuple[TraceEvent, ...]
    description: str = ""
    cluster: str = ""
    """The cluster the trace was written for (its group, link and tier names)."""
    restart_s: float = 60.0
    """Time to stop and restart the job around a plan switch (process groups, warm-up)."""
    storage_bandwidth_gbyte_s: float = 20.0
    """Aggregate checkpoint storage bandwidth (GB/s) for a save + load switch."""
    sources: tuple[str, ...] = field(default_factory=tuple)
    path: str = ""


def load_trace(ref: str) -> Trace:
    """A trace by bundled name (``hetpar/catalog/traces``) or path to a .csv or .json file."""
    p = Path(ref)
    if not p.is_file():
        for ext in (".csv", ".json"):
            if (TRACES_DIR / f"{ref}{ext}").is_file():
                p = TRACES_DIR / f"{ref}{ext}"
                break
        else:
            known = ", ".join(trace_names())
            raise ConfigError(f"unknown trace {ref!r}; known: {known} (or a file path)")
    text = decode_utf8(p.read_bytes(), str(p)).removeprefix("\ufeff")  # tolerate a BOM
    where = p.name
    if p.suffix == ".csv":
        return parse_csv(text, where)
    if p.suffix == ".json":
        return parse_json(text, where)
    raise ConfigError(f"{where}: unknown trace file type {p.suffix!r}; allowed: .csv, .json")


def trace_names() -> list[str]:
    """Names of the bundled traces."""
    return sorted(q.stem for q in TRACES_DIR.iterdir() if q.suffix in (".csv", ".json"))


def parse_csv(text: str, where: str) -> Trace:
    """Parse the CSV form: ``# key: value`` header lines, a column row, one event per row."""
    header: dict[str, Any] = {"sources": []}
    rows: list[tuple[int, list[str]]] = []
    columns: list[str] | None = None
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            _header_line(header, line[1:], f"{where}:{lineno}")
            continue
        cells = next(csv.reader(io.StringIO(line)))
        if columns is None:
            columns = [c.strip() for c in cells]
            bad = [c for c in columns if c not in COLUMNS]
            if bad or columns[:3] != list(COLUMNS[:3]):
                raise ConfigError(
                    f"{where}:{lineno}: bad column row {line!r}; columns: t_s,kind,target "
                    f"then any of value,node,nodes"
                )
            continue
        if len(cells) > len(columns):
            n = len(columns)
            raise ConfigError(f"{where}:{lineno}: {len(cells)} cells, the column row has {n} "
                              f"({','.join(columns)}); cell {n + 1} is {cells[n]!r}")
        rows.append((lineno, cells))
    if columns is None:
        raise ConfigError(f"{where}: no column row (t_s,kind,target,value,node,nodes)")
    events = []
    for lineno, cells in rows:
        item = {c: v.strip() for c, v in zip(columns, cells, strict=False) if v.strip()}
        events.append(event(item, f"{where}:{lineno}", lineno))
    return _trace(header, events, where)


def _header_line(header: dict[str, Any], body: str, where: str) -> None:
    if ":" not in body:
        return  # a plain comment
    key, value = (s.strip() for s in body.split(":", 1))
    if key not in HEADER_KEYS:
        return  # comments may contain colons; only known keys are metadata
    if key == "source":
        header["sources"].append(value)
    elif key in ("horizon_s", "restart_s", "storage_bandwidth_gbyte_s"):
        header[key] = number(value, f"{where}: {key}")
    else:
        header[key] = value


def parse_json(text: str, where: str) -> Trace:
    """Parse the JSON form: an object with the header keys and ``events``, a list of objects."""
    data = json_document(text, where)
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: top level must be an object")
    allowed = (HEADER_KEYS - {"source"}) | {"sources", "events"}
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ConfigError(
            f"{where}: unknown key {unknown[0]!r}; allowed: {', '.join(sorted(allowed))}")
    raw = data.get("events")
    if not isinstance(raw, list):
        raise ConfigError(f"{where}: 'events' must be a list of objects")
    lines = _json_event_lines(text, len(raw))
    events = []
    for i, item in enumerate(raw):
        loc = f"{where}:{lines[i]}" if lines else f"{where}: events[{i}]"
        if not isinstance(item, dict):
            raise ConfigError(f"{loc}: an event must be an object, got {item!r}")
        events.append(event(item, loc, lines[i] if lines else i + 1))
    header = {k: v for k, v in data.items() if k != "events"}
    for k in ("horizon_s", "restart_s", "storage_bandwidth_gbyte_s"):
        if k in header:
            header[k] = number(header[k], f"{where}: {k}")
    return _trace(header, events, where)


def _json_event_lines(text: str, n: int) -> list[int]:
    """Line of each element of the top-level ``events`` array (empty if it cannot be found)."""
    found = list(re.finditer(r'"events"\s*:\s*\[', text))
    if len(found) != 1:
        return []
    dec, pos, out = json.JSONDecoder(), found[0].end(), []
    for _ in range(n):
        while text[pos] in " \t\r\n,":
            pos += 1
        out.append(text.count("\n", 0, pos) + 1)
        _, pos = dec.raw_decode(text, pos)
    return out




def _trace(header: dict[str, Any], events: list[TraceEvent], where: str) -> Trace:
    if "horizon_s" not in header:
        raise ConfigError(f"{where}: missing header 'horizon_s' (seconds the trace covers)")
    horizon = float(header["horizon_s"])
    if horizon <= 0:
        raise ConfigError(f"{where}: horizon_s must be > 0, got {horizon}")
    for prev, ev in zip(events, events[1:], strict=False):
        if ev.t_s < prev.t_s:
            raise ConfigError(
                f"{where}:{ev.line}: event at t_s={ev.t_s} is out of order "
                f"(line {prev.line} is at t_s={prev.t_s})"
            )
    for ev in events:
        if ev.t_s >= horizon:
            raise ConfigError(f"{where}:{ev.line}: t_s={ev.t_s} is not before horizon_s={horizon}")
    for k in ("restart_s", "storage_bandwidth_gbyte_s"):
        if k in header and (header[k] < 0 or (k != "restart_s" and header[k] == 0)):
            raise ConfigError(f"{where}: {k} must be positive, got {header[k]}")
    sources = header.get("sources", [])
    if not isinstance(sources, list) or not all(isinstance(s, str) for s in sources):
        raise ConfigError(f"{where}: sources must be a list of strings")
    return Trace(
        name=str(header.get("name") or Path(where).stem),
        horizon_s=horizon,
        events=tuple(events),
        description=str(header.get("description", "")),
        cluster=str(header.get("cluster", "")),
        restart_s=float(header.get("restart_s", 60.0)),
        storage_bandwidth_gbyte_s=float(header.get("storage_bandwidth_gbyte_s", 20.0)),
        sources=tuple(sources),
        path=where,
    )
