"""Inside a torchrun job: which workers a failure took, and the degraded plan the rest run.

torchrun's elastic agent restarts every worker after one dies (``--max-restarts``), the dead
one included: on a real fault its GPU would be gone, so hetpar treats the slot as lost, as the
forked launcher does. Each worker of a round leaves a mark in the agent's store when it stops
for a reason other than its own death (it lost a peer, or the agent sent SIGTERM to stop it);
the next round reads the marks, so the ranks without one are the dead, and the survivors
continue on the plan ``elastic.degrade`` derives (``plan.on_failure``: NTP shrink or drop),
from the last verified checkpoint. The lost slots sit the round out and exit 0.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hetpar.runtime.manifest import Resume

LEFT = "hetpar/left/round{round}/rank{rank}"
"""Store key a worker of round ``round`` sets when it stops alive (lost peer or SIGTERM)."""
FAILED_AT = "hetpar/failed_at/round{round}"
"""When the first survivor of round ``round`` stopped (for the next round's ``recovered:``)."""

_state: dict[str, Any] = {"store": None, "round": None, "rank": None}


def under_torchelastic() -> bool:
    """Whether this process is a worker that torchrun's elastic agent started."""
    return "TORCHELASTIC_RESTART_COUNT" in os.environ


def watch_sigterm() -> None:
    """Route SIGTERM to one thread that marks this worker as alive, then exits 143.

    Call before any other thread exists: the blocked mask is inherited by every thread made
    later (gloo's, torch's), so only ``sigwait`` here receives the agent's SIGTERM, even while
    the main thread waits inside a collective (a Python-level handler would not run then).
    """
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})

    def wait() -> None:
        signal.sigwait({signal.SIGTERM})
        mark_alive()
        os._exit(128 + signal.SIGTERM)

    threading.Thread(target=wait, name="hetpar-sigterm", daemon=True).start()


def register(store: Any, round_: int, rank: int) -> None:
    """Where ``mark_alive`` writes for this worker (the agent's store outlives the round)."""
    _state.update(store=store, round=round_, rank=rank)


def mark_alive() -> None:
    """Record that this worker stopped alive, and when the round's failure was first seen;
    nothing if the store is gone (rank 0 hosted it) or unset."""
    store, round_ = _state["store"], _state["round"]
    if store is None or round_ is None:
        return
    try:
        first = FAILED_AT.format(round=round_)
        if not store.check([first]):
            store.set(first, repr(time.time()))
        store.set(LEFT.format(round=round_, rank=_state["rank"]), "1")
    except RuntimeError:  # DistStoreError: the store's host is gone
        pass


@dataclass(frozen=True, kw_only=True)
class Lineage:
    """What earlier rounds' failures left: the layout to run and this worker's place in it."""

    layout: Any
    """The runtime ``Layout`` the survivors run now (the plan's own when nothing failed)."""
    ranks: dict[int, int]
    """torchrun rank -> rank in ``layout`` for the workers that still take part."""
    failures: tuple[tuple[int, tuple[int, ...]], ...] = ()
    """(round, torchrun ranks lost in it) for every round that lost workers."""
    degraded: tuple[Any, ...] = ()
    """The degraded plan after each failure, in order."""


def lineage(layout: Any, store: Any, round_: int, world: int) -> Lineage:
    """Replay the failures of rounds 0..round_-1 from the store's marks.

    A round's participant without a mark died in it. A round with no dead (every worker
    stopped alive: an agent restart for another reason) keeps the layout.
    """
    from hetpar.runtime.elastic import degrade
    from hetpar.runtime.layout import build_layout, local_cluster

    ranks = {k: k for k in range(world)}
    failures: list[tuple[int, tuple[int, ...]]] = []
    plans: list[Any] = []
    for past in range(round_):
        dead = tuple(k for k in sorted(ranks)
                     if not store.check([LEFT.format(round=past, rank=k)]))
        if not dead:
            continue
        deg = degrade(layout, {ranks[k] for k in dead}, need_donor=False)
        layout = build_layout(deg.plan, layout.model, local_cluster(len(deg.new_rank)))
        ranks = {k: deg.new_rank[c] for k, c in ranks.items() if c in deg.new_rank}
        failures.append((past, dead))
        plans.append(deg.plan)
    return Lineage(layout=layout, ranks=ranks, failures=tuple(failures), degraded=tuple(plans))


def recovery_lines(lin: Lineage, checkpoint: str | None, r: Resume | None,
                   write: bool) -> list[str]:
    """One line per failure the lineage replayed; with ``write`` (rank 0) each degraded plan
    is written beside the checkpoint."""
    lines = []
    where = f"{r.path} step {r.step}" if r else "step 0"
    for n, ((round_, dead), plan) in enumerate(zip(lin.failures, lin.degraded, strict=True), 1):
        tps = "+".join(str(rep.stages[0].tp) for rep in plan.replicas)
        ranks = sum(len(s.devices or ()) for rep in plan.replicas for s in rep.stages)
        # An earlier round's failure is replayed here; where that round resumed is in its
        # own log (this round's checkpoint is newer).
        at = where if n == len(lin.failures) else f"the checkpoint of round {round_ + 1}"
        line = (f"torchrun rank(s) {', '.join(map(str, dead))} lost in round {round_}; "
                f"on_failure={plan.on_failure}: continuing on {ranks} rank(s), "
                f"{len(plan.replicas)} replica(s) at tp {tps}, resuming from {at}")
        if checkpoint:
            from hetpar.failures.ntp_plan import write_plan

            path = Path(checkpoint) / f"plan-after-failure-{n}.toml"
            if write:
                write_plan(plan, path)
            line += f"; degraded plan written to {path}"
        lines.append(line)
    return lines
