"""Cluster event traces: the schema and a strict CSV/JSON loader whose errors name the line."""

from __future__ import annotations

import csv
import io
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from hetpar.errors import ConfigError
from hetpar.io import parse_json as json_document

EventKind = Literal["bandwidth", "factor", "down", "up", "leave", "join", "slowdown"]
KINDS: tuple[str, ...] = get_args(EventKind)
# What each target prefix names and which event kinds apply to it.
TARGETS: dict[str, tuple[str, ...]] = {
    "tier": ("bandwidth", "factor"),
    "link": ("bandwidth", "factor", "down", "up"),
    "nvlink": ("bandwidth", "factor", "down", "up"),
    "pcie": ("bandwidth", "factor", "down", "up"),
    "nic": ("bandwidth", "factor"),
    "group": ("leave", "join", "slowdown"),
}
COLUMNS = ("t_s", "kind", "target", "value", "node", "nodes")
HEADER_KEYS = {"name", "description", "horizon_s", "cluster", "restart_s",
               "storage_bandwidth_gbyte_s", "source"}
TRACES_DIR = Path(__file__).resolve().parent.parent / "catalog" / "traces"


@dataclass(frozen=True, kw_only=True)
class TraceEvent:
    """One change of the cluster at time ``t_s`` (seconds from the start of the trace).

    ``target`` is ``prefix:name`` (see TARGETS); ``value`` is Gbit/s per GPU for ``bandwidth``,
    a multiplier of the cluster file's bandwidth for ``factor``, and a time multiplier >= 1 for
    ``slowdown``. ``node`` picks one node of a group (default all), ``nodes`` counts nodes
    that leave or join (default all).
    """

    t_s: float
    kind: EventKind
    target: str
    value: float | None = None
    node: int | None = None
    nodes: int | None = None
    line: int = 0
    """Line of the trace file the event came from (for error messages)."""

    @property
    def prefix(self) -> str:
        return self.target.split(":", 1)[0]

    @property
    def name(self) -> str:
        return self.target.split(":", 1)[1]


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
    text = p.read_text(encoding="utf-8-sig", errors="replace")  # tolerate a BOM
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
            raise ConfigError(f"{where}:{lineno}: {len(cells)} cells, header has {len(columns)}")
        rows.append((lineno, cells))
    if columns is None:
        raise ConfigError(f"{where}: no column row (t_s,kind,target,value,node,nodes)")
    events = []
    for lineno, cells in rows:
        item = {c: v.strip() for c, v in zip(columns, cells, strict=False) if v.strip()}
        events.append(_event(item, f"{where}:{lineno}", lineno))
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
        header[key] = _number(value, f"{where}: {key}")
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
        events.append(_event(item, loc, lines[i] if lines else i + 1))
    header = {k: v for k, v in data.items() if k != "events"}
    for k in ("horizon_s", "restart_s", "storage_bandwidth_gbyte_s"):
        if k in header:
            header[k] = _number(header[k], f"{where}: {k}")
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


def _number(value: Any, where: str) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: expected a number, got {value!r}") from None
    if isinstance(value, bool) or x != x or x in (float("inf"), float("-inf")):
        raise ConfigError(f"{where}: expected a finite number, got {value!r}")
    return x


def _integer(value: Any, where: str) -> int:
    x = _number(value, where)
    if x != int(x):
        raise ConfigError(f"{where}: expected an integer, got {value!r}")
    return int(x)


def _event(item: dict[str, Any], where: str, line: int) -> TraceEvent:
    unknown = sorted(set(item) - set(COLUMNS))
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r}; allowed: {', '.join(COLUMNS)}")
    for k in COLUMNS[:3]:
        if k not in item:
            raise ConfigError(f"{where}: missing {k!r}")
    kind, target = item["kind"], item["target"]
    if kind not in KINDS:
        raise ConfigError(f"{where}: kind {kind!r} is not allowed; allowed: {', '.join(KINDS)}")
    if not isinstance(target, str) or ":" not in target or target.split(":")[0] not in TARGETS:
        raise ConfigError(
            f"{where}: target {target!r} must be PREFIX:NAME with PREFIX one of "
            f"{', '.join(TARGETS)}"
        )
    prefix = target.split(":", 1)[0]
    if kind not in TARGETS[prefix]:
        raise ConfigError(
            f"{where}: kind {kind!r} does not apply to {prefix}:...; "
            f"allowed: {', '.join(TARGETS[prefix])}"
        )
    ev = TraceEvent(
        t_s=_number(item["t_s"], f"{where}: t_s"),
        kind=kind,
        target=target,
        value=_number(item["value"], f"{where}: value") if "value" in item else None,
        node=_integer(item["node"], f"{where}: node") if "node" in item else None,
        nodes=_integer(item["nodes"], f"{where}: nodes") if "nodes" in item else None,
        line=line,
    )
    _check_values(ev, where)
    return ev


def _check_values(ev: TraceEvent, where: str) -> None:
    if ev.t_s < 0:
        raise ConfigError(f"{where}: t_s must be >= 0, got {ev.t_s}")
    needs_value = ev.kind in ("bandwidth", "factor", "slowdown")
    if needs_value and ev.value is None:
        raise ConfigError(f"{where}: kind {ev.kind!r} needs a value")
    if ev.kind in ("bandwidth", "factor") and ev.value is not None and ev.value <= 0:
        raise ConfigError(
            f"{where}: {ev.kind} value must be > 0, got {ev.value} (a failed path is kind 'down')"
        )
    if ev.kind == "slowdown" and ev.value is not None and ev.value < 1:
        raise ConfigError(f"{where}: slowdown value must be >= 1 (1 = healthy), got {ev.value}")
    if ev.node is not None and ev.node < 0:
        raise ConfigError(f"{where}: node must be >= 0, got {ev.node}")
    if ev.nodes is not None and ev.nodes < 1:
        raise ConfigError(f"{where}: nodes must be >= 1, got {ev.nodes}")


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
