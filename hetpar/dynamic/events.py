"""One trace event: the schema and the checks of its cells (which kind takes which cell)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, get_args

from hetpar.errors import ConfigError
from hetpar.io import is_number

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
def number(value: Any, where: str) -> float:
    # CSV cells and headers: the strict parser's syntax (float() also reads "\uff13", "1_6");
    # nan and inf pass on to the finiteness check below
    if isinstance(value, str) and not is_number(value) and \
            value.strip().lower().lstrip("+-") not in ("nan", "inf", "infinity"):
        raise ConfigError(f"{where}: expected a number, got {value!r}")
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: expected a number, got {value!r}") from None
    if isinstance(value, bool) or x != x or x in (float("inf"), float("-inf")):
        raise ConfigError(f"{where}: expected a finite number, got {value!r}")
    return x


def _integer(value: Any, where: str) -> int:
    x = number(value, where)
    if x != int(x):
        raise ConfigError(f"{where}: expected an integer, got {value!r}")
    return int(x)


def event(item: dict[str, Any], where: str, line: int) -> TraceEvent:
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
        t_s=number(item["t_s"], f"{where}: t_s"),
        kind=kind,
        target=target,
        value=number(item["value"], f"{where}: value") if "value" in item else None,
        node=_integer(item["node"], f"{where}: node") if "node" in item else None,
        nodes=_integer(item["nodes"], f"{where}: nodes") if "nodes" in item else None,
        line=line,
    )
    _check_values(ev, where)
    _check_cells(ev, where)
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


def _check_cells(ev: TraceEvent, where: str) -> None:
    """A cell the event does not read would be ignored silently: refused, naming it."""
    reads = {"value": ev.kind in ("bandwidth", "factor", "slowdown"),
             "node": ev.prefix in ("nvlink", "pcie", "nic") or ev.kind == "slowdown",
             "nodes": ev.kind in ("leave", "join")}  # as state.Conditions applies them
    for cell, used in reads.items():
        v = getattr(ev, cell)
        if v is not None and not used:
            takes = ", ".join(c for c, u in reads.items() if u) or "none of value, node, nodes"
            raise ConfigError(f"{where}: {cell}={v:g} does not apply to a {ev.kind} event on "
                              f"{ev.target}; it takes: {takes}")
