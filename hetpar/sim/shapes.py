"""Where a communicator's ranks sit on the network (``GroupShape``) and what its collectives
and point-to-point sends cost there (NCCL's lines, or the cluster policy's own algorithms)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from hetpar.net import collectives as algo
from hetpar.net import policies
from hetpar.net.collectives import Level, Path
from hetpar.net.tuner import TREE_CORRECTION_SIZES
from hetpar.sim.netmodel import forced_lines

Device = tuple[str, int]
"""(node group name, device index inside the group)."""


_Fast = tuple[list[tuple[float, float]], list[tuple[float, float, tuple[float, ...]]],
              list[tuple[float, float, int, float]]]


@dataclass(frozen=True, slots=True)
class GroupShape:
    """How a communicator's ``n`` ranks sit on the network.

    ``k`` ranks share each inner domain (scale-up domain, or node when it is larger); ``outer``
    joins the ``n / k`` domains (None when all ranks are in one domain). ``levels`` is the full
    hierarchy innermost first (default: the two levels above); ``alternatives`` are hierarchies
    over parallel paths (a split may use them together); ``inners`` the inner path of each
    node group when the ranks span several (type-first reduce-scatter).
    """

    n: int
    k: int
    inner: Path
    outer: Path | None
    levels: tuple[Level, ...] = ()
    alternatives: tuple[tuple[Level, ...], ...] = ()
    inners: tuple[Path, ...] = ()
    policy: str = "nccl"
    devices: tuple[Device, ...] = field(default=(), compare=False, hash=False, repr=False)
    """The ranks' devices (what ``Topology.busy`` reads to find the links they keep busy)."""
    library: tuple[int, int] | None = None
    """The cluster's NCCL version (major, minor); None: the current one."""
    lines: dict[str, list[algo.Line]] = field(
        default_factory=dict, compare=False, hash=False, repr=False)
    memo: dict[tuple[str, float], float] = field(
        default_factory=dict, compare=False, hash=False, repr=False)
    fast: dict[str, _Fast] = field(default_factory=dict, compare=False, hash=False, repr=False)
    """``lines`` split for the hot path: (a, b) without a size correction, (a, b, table) with,
    and per line (those without, then those with) (a, bytes below which it runs on fewer
    channels, channels, bytes per channel): ``Line.run``."""
    seen: dict[str, float] = field(default_factory=dict, compare=False, hash=False, repr=False)
    """While ``record`` has armed it: per collective, the largest message priced on this shape
    (``choices`` names what NCCL runs for it); empty, nothing is recorded (the planner)."""
    force: tuple[str, str] = ("auto", "auto")
    """(algorithm, protocol) a plan forces (``NCCL_ALGO`` / ``NCCL_PROTO``): only NCCL's lines
    of that algorithm / protocol are priced where the collective has one (the tree: all-reduce)."""
    per_gpu: bool = False
    """A network model's flat per-GPU ring prices NCCL's lines (``netmodel.per_gpu``)."""
    exclusive: bool = False
    """The policy's own algorithms replace NCCL's flat call (a plan's ``dp_sync =
    "hierarchical"``) instead of competing with it."""

    def __post_init__(self) -> None:
        if not self.levels:
            lv = [Level(self.k, self.inner)]
            if self.outer is not None:
                lv.append(Level(self.n // self.k, self.outer))
            object.__setattr__(self, "levels", tuple(lv))

    @property
    def scope(self) -> str:
        return self.outer.scope if self.outer else self.inner.scope


LOCAL = GroupShape(n=1, k=1, inner=Path("local", math.inf, 0.0), outer=None)


def all_reduce(shape: GroupShape, nbytes: float) -> float:
    """Seconds for an all-reduce of ``nbytes`` per rank (see hetpar.net.collectives)."""
    return _cost(shape, "all_reduce", nbytes)


def reduce_scatter(shape: GroupShape, nbytes: float) -> float:
    """Seconds for a reduce-scatter of ``nbytes`` (the full, unsharded size) per rank."""
    return _cost(shape, "reduce_scatter", nbytes)


def all_gather(shape: GroupShape, nbytes: float) -> float:
    """Seconds for an all-gather; ``nbytes`` is the gathered size (same bytes as reduce-scatter)."""
    return _cost(shape, "all_gather", nbytes)


def all_to_all(shape: GroupShape, nbytes: float) -> float:
    """Seconds for an all-to-all of ``nbytes`` per rank (``hetpar.net.collectives.all_to_all``:
    NCCL's concurrent sends, each rank's (n-1)/n share crossing the levels above it)."""
    if shape.n <= 1 or nbytes <= 0:
        return 0.0
    seen = shape.seen
    if seen and nbytes > seen.get("all_to_all", 0.0):
        seen["all_to_all"] = nbytes
    return algo.all_to_all(shape.levels, nbytes)


def collective(op: str) -> Callable[[GroupShape, float], float]:
    """The cost function of collective ``op`` (``specs.axes.Op``): seconds of (shape, bytes)."""
    return {"all_reduce": all_reduce, "all_gather": all_gather,
            "reduce_scatter": reduce_scatter, "all_to_all": all_to_all}[op]


def _cost(shape: GroupShape, op: str, nbytes: float) -> float:
    if shape.n <= 1 or nbytes <= 0:
        return 0.0
    seen = shape.seen
    if seen and nbytes > seen.get(op, 0.0):  # armed by ``record``
        seen[op] = nbytes
    fast = shape.fast.get(op)
    if fast is None:  # NCCL's choices are lines a + b x bytes: computed once per shape
        lines = shape.lines[op] = forced_lines(shape, op)
        order = sorted(lines, key=lambda ln: ln.corr is not None)  # as the two lists below
        fast = shape.fast[op] = ([(ln.a, ln.b) for ln in lines if ln.corr is None],
                                 [(ln.a, ln.b, ln.corr) for ln in lines if ln.corr is not None],
                                 [(ln.a, ln.channels * ln.unit, ln.channels, ln.unit)
                                  for ln in order])
    plain, corrected, meta = fast
    xs = [a + b * nbytes for a, b in plain]
    t = min(xs, default=math.inf)
    win = xs.index(t) if xs else -1
    for j, (a, b, c) in enumerate(corrected):  # NCCL's tree correction by size (net/tuner.py)
        x = a + b * nbytes
        if x < t:  # a correction (<= 1 x the bandwidth) only slows a line: else it loses
            i = (int(nbytes) >> 6).bit_length() - 1
            x = a + b * nbytes / c[i] if 0 <= i < TREE_CORRECTION_SIZES else x
            if x < t:
                t, win = x, len(plain) + j
    if win >= 0 and nbytes < meta[win][1]:  # the tuner's pick runs on fewer channels
        a, _, channels, unit = meta[win]  # (Line.run)
        t += (t - a) * (channels / max(1, int(nbytes // unit)) - 1.0)
    if shape.policy != "nccl":
        key = (op, nbytes)
        hit = shape.memo.get(key)
        if hit is None:
            if len(shape.memo) > 4096:
                shape.memo.clear()
            # hetpar's own algorithms that the policy tries (net/policies.py registry)
            own = policies.best(shape, shape.policy, op, nbytes)
            hit = shape.memo[key] = own if shape.exclusive and own < math.inf else min(t, own)
        t = hit
    return t


_ARMED = "armed"
"""The key that arms ``GroupShape.seen`` (a non-empty dict records)."""


def record(shape: GroupShape) -> None:
    """Start recording the largest message of each collective priced on ``shape``."""
    shape.seen.clear()
    shape.seen[_ARMED] = 0.0


def recorded(shape: GroupShape) -> tuple[tuple[str, float], ...]:
    """What ``shape`` recorded since ``record`` (collective, largest bytes)."""
    return tuple((op, b) for op, b in shape.seen.items() if op != _ARMED)


def choices(shape: GroupShape, seen: Sequence[tuple[str, float]]
            ) -> list[tuple[str, float, str, str]]:
    """(collective, bytes, algorithm, protocol) for each (collective, largest bytes) of
    ``seen`` (a snapshot of ``shape.seen``): what NCCL's tuner picks for that message, or the
    cluster's policy where one of hetpar's algorithms is cheaper (an all-to-all is NCCL's
    grouped point-to-point sends, on Simple)."""
    out = []
    for op, nbytes in sorted(seen):
        if op == "all_to_all":
            out.append((op, nbytes, "p2p", "Simple"))
            continue
        lines = shape.lines.get(op) or forced_lines(shape, op)
        times = [ln.time(nbytes) for ln in lines]
        i = times.index(min(times))
        best = lines[i]
        own = shape.memo.get((op, nbytes), math.inf)
        if own < best.run(nbytes) * (1 - 1e-9) or (shape.exclusive and own < math.inf):
            out.append((op, nbytes, shape.policy, "-"))
            continue
        out.append((op, nbytes, best.algorithm, best.protocol))
    return out


def p2p(path: Path, nbytes: float) -> float:
    """Seconds to send ``nbytes`` from one GPU to another over ``path``."""
    if nbytes <= 0 or path.bandwidth == math.inf:
        return 0.0
    return path.latency + nbytes / path.bandwidth
