"""Event-driven timeline of an iteration and its Perfetto / Chrome-trace JSON form."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hetpar.io import write_text_atomic
from hetpar.schedules import ChunkTimes, build, execute
from hetpar.sim import lockstep
from hetpar.sim.report import Report, TraceEvent
from hetpar.specs.plan import Plan

if TYPE_CHECKING:
    from hetpar.sim.layout import Layout
    from hetpar.sim.structure import ReplicaResult

KIND_NAME = {"F": "forward", "B": "backward", "W": "weight-grad"}
Event = tuple[str, str, float, float]
"""(name, category, start, end) of one action on a pipeline rank."""


def _ranges(idx: Sequence[int]) -> str:
    """Compact ``0-3,7`` form of sorted integers."""
    runs: list[list[int]] = []
    for i in idx:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)


def track_name(lay: Layout, rank: int) -> str:
    """One track per pipeline rank of a replica structure, naming every GPU it stands for.

    Replicas with the same structure run the same timeline (symmetry), so they share a track;
    the name lists the replicas and the devices of replica ``lay.replicas[0]``.
    """
    ch = lay.chunks[rank]
    devs = sorted(i for _, i in ch.devices)
    return (f"replicas {_ranges(list(lay.replicas))} / pp rank {rank} ({ch.group} GPUs "
            f"{_ranges(devs)} of replica {lay.replicas[0]}, tp={ch.tp}, cp={ch.cp})")


def replica_events(lay: Layout, res: ReplicaResult, plan: Plan) -> tuple[list[TraceEvent], float]:
    """Events of one replica structure: the schedule executed on its chunk times, then each
    rank's gradient sync and optimizer step. Returns the events and their makespan."""
    events: list[TraceEvent] = []
    end = 0.0
    for r, acts in enumerate(_pipeline(lay, res, plan)):
        name = track_name(lay, r)
        for label, kind, s, e in acts:
            events.append(TraceEvent(track=name, name=label, start=s, end=e, category=kind))
        t = acts[-1][3] if acts else 0.0
        sync, opt = res.rank_tails[r]
        if sync > 0:
            events.append(TraceEvent(track=name, name="dp grad sync", start=t, end=t + sync,
                                     category="dp_comm"))
            t += sync
        events.append(TraceEvent(track=name, name="optimizer", start=t, end=t + opt,
                                 category="optimizer"))
        end = max(end, t + opt)
    return events, end


def _pipeline(lay: Layout, res: ReplicaResult, plan: Plan) -> list[list[Event]]:
    """Per pipeline rank, (name, category, start, end) of its actions: the lock-step engine's
    steps when the simulator timed the pipeline that way, else the schedule executed."""
    if res.lockstep is not None:
        out = []
        for r, acts in enumerate(lockstep.run(*res.lockstep, res.num_microbatches)):
            rows = []
            for fw, mb, s, e in acts:
                kind = "F" if fw else "B"
                rows.append((f"{kind}{r}.{mb}", KIND_NAME[kind], s, e) if mb >= 0
                            else ("p2p exchange", "pp_comm", s, e))
            out.append(rows)
        return out
    sched = build(plan.schedule, lay.pp, res.num_microbatches, plan.vpp)
    ct = res.chunk_times
    tl = execute(sched, ChunkTimes(forward=ct.fwd, backward=ct.bwd, weight=ct.wgt))
    return [[(f"{a.kind}{a.chunk}.{a.microbatch}", KIND_NAME[a.kind], s, e) for a, s, e in acts]
            for acts in tl.ranks]


def build_timeline(
    report: Report, lays: Sequence[Layout], results: Sequence[ReplicaResult], plan: Plan,
    iteration_overhead_s: float = 0.003,
) -> tuple[TraceEvent, ...]:
    """Every rank's events for the iteration (identical replicas share tracks)."""
    events: list[TraceEvent] = []
    end = 0.0
    for lay, res in zip(lays, results, strict=True):
        ev, e = replica_events(lay, res, plan)
        events += ev
        end = max(end, e)
    events.append(TraceEvent(track="iteration", name="step overhead", start=end,
                             end=end + iteration_overhead_s, category="overhead"))
    return tuple(events)


def chrome_trace(events: Sequence[TraceEvent]) -> dict[str, Any]:
    """The Chrome trace-event JSON (Perfetto loads it): one thread per track, times in us."""
    tids: dict[str, int] = {}
    out: list[dict[str, Any]] = []
    for e in events:
        if e.track not in tids:
            tids[e.track] = len(tids)
            out.append({"ph": "M", "name": "thread_name", "pid": 0, "tid": tids[e.track],
                        "args": {"name": e.track}})
        out.append({"ph": "X", "name": e.name, "cat": e.category, "pid": 0,
                    "tid": tids[e.track], "ts": e.start * 1e6,
                    "dur": max(e.end - e.start, 0.0) * 1e6})
    out.insert(0, {"ph": "M", "name": "process_name", "pid": 0,
                   "args": {"name": "hetpar simulated iteration"}})
    return {"traceEvents": out, "displayTimeUnit": "ms"}


def write_trace(events: Sequence[TraceEvent], path: str | Path) -> None:
    """Write the trace JSON atomically (a temporary file renamed into place)."""
    write_text_atomic(path, json.dumps(chrome_trace(events)))
