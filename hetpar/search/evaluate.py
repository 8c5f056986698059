"""Evaluating batches of plans on hetpar.workers' pools (this process, processes or Ray)."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

from hetpar.errors import Infeasible
from hetpar.search.costmodel import CostModel, Evaluation
from hetpar.specs.collectives import NetworkModel
from hetpar.specs.plan import Plan
from hetpar.workers import Pool, Workers, open_pool


@dataclass(frozen=True)
class Failed:
    """A plan the cost model rejected, with the Infeasible kind and reason."""

    kind: str
    reason: str


Outcome = Evaluation | Failed


def evaluate_one(cost: CostModel, plan: Plan) -> Outcome:
    """Evaluate ``plan``; Infeasible becomes ``Failed`` and an OOM report ``Failed('memory')``."""
    try:
        ev = cost.evaluate(plan)
    except Infeasible as e:
        return Failed(e.kind, e.reason)
    if ev.oom:
        return Failed("memory", f"out of memory (peak {ev.peak_memory_fraction:.0%} of capacity)")
    return ev


def evaluate_under(cost: CostModel, item: tuple[Plan, NetworkModel]) -> Outcome:
    """``evaluate_one`` under an alternative network model (a cost model whose ``evaluate``
    takes one: ``prices_networks``)."""
    plan, network = item
    try:
        ev = cost.evaluate(plan, network)  # type: ignore[call-arg]
    except Infeasible as e:
        return Failed(e.kind, e.reason)
    if ev.oom:
        return Failed("memory", f"out of memory (peak {ev.peak_memory_fraction:.0%} of capacity)")
    return ev


class Backend:
    """Evaluates lists of plans on a pool of workers; outcomes in plan order."""

    def __init__(self, cost: CostModel, pool: Pool) -> None:
        self.cost, self.pool = cost, pool

    def map(self, plans: list[Plan]) -> list[Outcome]:
        """The outcome of every plan, as ``evaluate_one`` gives it in this process."""
        return self.pool.map(evaluate_one, plans, self.cost)

    def map_under(self, items: list[tuple[Plan, NetworkModel]]) -> list[Outcome]:
        """The outcome of every (plan, network model), as ``evaluate_under`` gives it."""
        return self.pool.map(evaluate_under, items, self.cost)

    def close(self) -> None:
        self.pool.close()


def make_backend(cost: CostModel, workers: int, ray_address: str | None) -> Backend:
    """The backend for ``--workers N`` / ``--workers ray[:ADDRESS]``; results never depend
    on it."""
    return Backend(cost, open_pool(Workers(processes=workers, ray_address=ray_address)))


class Progress:
    """A one-line progress bar on stderr, drawn only for searches that take a while."""

    def __init__(self, enabled: bool, delay_s: float = 1.0) -> None:
        self.enabled, self.delay = enabled, delay_s
        self.start = time.perf_counter()
        self.drawn = False

    def update(self, done: int, todo: int, best: str) -> None:
        """Redraw: ``done`` plans evaluated, ``todo`` candidates still in the queue."""
        if not self.enabled or time.perf_counter() - self.start < self.delay:
            return
        frac = done / max(1, done + todo)
        bar = "#" * int(30 * frac)
        line = f"\rplanning [{bar:<30}] {done} evaluated, {todo} queued, best {best}"
        sys.stderr.write(line[:120])
        sys.stderr.flush()
        self.drawn = True

    def close(self) -> None:
        if self.drawn:
            sys.stderr.write("\n")
            sys.stderr.flush()
