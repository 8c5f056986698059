"""The simulator's report: throughput figures, memory per rank, time breakdown, timeline."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hetpar.sim import axis_costs, breakdown
from hetpar.sim.memory import MemoryRow
from hetpar.sim.network import GroupShape, choices

BREAKDOWN_KEYS = tuple(t.key for t in breakdown.BUILTIN)
BOTTLENECK_WORD = {t.key: t.word for t in breakdown.BUILTIN}
"""The built-in terms (``sim/breakdown.py``); a registered ``plan``-scope axis with a cost
adds its own (``AxisCost.key`` and ``word``): ``breakdown_keys`` and ``bottleneck_words``."""


def breakdown_keys() -> tuple[str, ...]:
    """The breakdown's terms: the registry's (``sim.breakdown.keys``)."""
    return breakdown.keys()


def bottleneck_words() -> dict[str, str]:
    """``Report.bottleneck``'s word per term of ``breakdown_keys``."""
    return {t.key: t.word for t in breakdown.terms()}


@dataclass(frozen=True, kw_only=True, slots=True)
class TraceEvent:
    """One interval on one track of the timeline (seconds from the start of the iteration)."""

    track: str
    name: str
    start: float
    end: float
    category: str


@dataclass(frozen=True, kw_only=True, slots=True)
class CollectiveChoice:
    """The algorithm and protocol NCCL's tuner picks for one communicator's collective
    (``hetpar.net.nccl``), at the largest message the iteration sends on it."""

    axis: str
    collective: str
    ranks: int
    bytes: int
    algorithm: str
    protocol: str

    def to_dict(self) -> dict[str, Any]:
        return {"axis": self.axis, "collective": self.collective, "ranks": self.ranks,
                "bytes": self.bytes, "algorithm": self.algorithm, "protocol": self.protocol}


@dataclass(frozen=True, kw_only=True, slots=True)
class CommunicatorUse:
    """One communicator of a simulated plan (``axis``: tp, dp, ...) and, per collective, the
    largest message it carried: ``Report.collectives`` names what NCCL runs for it, on demand
    (the planner, which never asks, pays nothing for it)."""

    axis: str
    shape: GroupShape
    seen: tuple[tuple[str, float], ...]


@dataclass(frozen=True, kw_only=True)
class Report:
    """What one training iteration of a plan costs (see docs/simulator.md for every field)."""

    iteration_time_s: float
    tokens_per_iter: int
    num_gpus: int
    model_flops_per_iter: float
    hardware_flops_per_iter: float
    peak_flops_total: float
    """Sum over the plan's GPUs of their dense peak at the plan's precision."""
    memory: tuple[MemoryRow, ...]
    breakdown: dict[str, float]
    timeline: tuple[TraceEvent, ...] | None = field(default=None, repr=False)
    notes: tuple[str, ...] = ()
    communicators: tuple[CommunicatorUse, ...] | None = field(default=None, repr=False)
    """Recorded only when ``simulate(..., collectives=True)``; None otherwise."""
    pipeline_sends: bool = False
    """The plan sends activations between pipeline stages (NCCL send/recv)."""
    experts: dict[str, Any] | None = None
    """An expert-parallel plan's experts (``hetpar.sim.moe.summary``); None without EP."""

    @property
    def collectives(self) -> tuple[CollectiveChoice, ...]:
        """Per axis, collective and ranks, the algorithm and protocol NCCL's tuner picks at
        the largest message (``hetpar.net.nccl``); pipeline sends are NCCL's p2p on Simple."""
        rows: dict[tuple[str, str, int, str, str], float] = {}
        for use in self.communicators or ():
            for op, nbytes, algorithm, protocol in choices(use.shape, use.seen):
                key = (use.axis, op, use.shape.n, algorithm, protocol)
                rows[key] = max(rows.get(key, 0.0), nbytes)
        out = [CollectiveChoice(axis=a, collective=op, ranks=n, bytes=int(b), algorithm=al,
                                protocol=pr) for (a, op, n, al, pr), b in sorted(rows.items())]
        if self.pipeline_sends and self.communicators is not None:
            out.append(CollectiveChoice(axis="pp", collective="send_recv", ranks=2, bytes=0,
                                        algorithm="p2p", protocol="Simple"))
        return tuple(out)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_iter / self.iteration_time_s

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.tokens_per_s / self.num_gpus

    @property
    def model_tflops_per_gpu(self) -> float:
        return self.model_flops_per_iter / self.iteration_time_s / self.num_gpus / 1e12

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation: model FLOPs/s over the plan's total dense peak."""
        return self.model_flops_per_iter / self.iteration_time_s / self.peak_flops_total

    @property
    def hfu(self) -> float:
        """Hardware FLOPs utilisation: FLOPs incl. recompute over the total dense peak."""
        return self.hardware_flops_per_iter / self.iteration_time_s / self.peak_flops_total

    @property
    def oom(self) -> bool:
        return any(r.oom for r in self.memory)

    @property
    def bottleneck(self) -> str:
        """The largest term of the breakdown as a short word ("memory" when out of memory)."""
        if self.oom:
            return "memory"
        key = max(breakdown_keys(), key=lambda k: self.breakdown.get(k, 0.0))
        return bottleneck_words()[key]

    def shown_keys(self) -> tuple[str, ...]:
        """The breakdown keys this report shows: every one but a plan-scope axis's that its
        plan does not charge (a dense plan's report has no ``ep_comm``)."""
        axis = {k for k, _ in axis_costs.cost_keys()}
        return tuple(k for k in breakdown_keys() if k not in axis or k in self.breakdown)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON-ready); the collectives and the timeline only when asked for."""
        out: dict[str, Any] = {
            "iteration_time_s": self.iteration_time_s,
            "tokens_per_iter": self.tokens_per_iter,
            "tokens_per_s": self.tokens_per_s,
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "num_gpus": self.num_gpus,
            "model_tflops_per_gpu": self.model_tflops_per_gpu,
            "mfu": self.mfu,
            "hfu": self.hfu,
            "oom": self.oom,
            "bottleneck": self.bottleneck,
            "breakdown": {k: self.breakdown.get(k, 0.0) for k in self.shown_keys()},
            "memory": [r.to_dict() for r in self.memory],
            "notes": list(self.notes),
        }
        if self.communicators is not None:
            out["collectives"] = [c.to_dict() for c in self.collectives]
        if self.experts is not None:
            out["experts"] = dict(self.experts)
        if self.timeline is not None:
            out["timeline"] = [
                {"track": e.track, "name": e.name, "start": e.start, "end": e.end,
                 "category": e.category}
                for e in self.timeline
            ]
        return out
