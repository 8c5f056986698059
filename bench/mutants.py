"""The mutations bench/mutation.py applies: each zeroes one cost term by patching hetpar.

Every patched name must exist (``MissingTarget`` names the one that does not: setattr would
add it and the mutation would change nothing), and every replacement counts its calls in
``HITS`` (a mutation nothing calls cannot kill).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

TERMS = ("bubble", "dp_sync", "tp_comm", "recompute", "optimizer", "ep_comm")

NA = {
    ("failures", "optimizer"): "AnalyticCost has no optimizer step (failures/cost.py)",
    ("failures", "ep_comm"): "AnalyticCost prices no expert all-to-all",
    ("failures-sim", "ep_comm"): "SimCost rescales every per-micro-batch term alike; the sim row",
    ("dynamic", "optimizer"): "AnalyticThroughput has no optimizer step (dynamic/cost.py)",
    ("dynamic", "ep_comm"): "AnalyticThroughput prices no expert all-to-all",
    ("search", "tp_comm"): "stage costs are the simulator's (search/simcost.py probes)",
    ("search", "recompute"): "stage costs are the simulator's (search/simcost.py probes)",
    ("search", "ep_comm"): "stage costs are the simulator's (search/simcost.py probes)",
}

HITS: dict[str, int] = {}
"""Calls of each patched target in this process (a mutation nothing calls cannot kill)."""


class MissingTarget(Exception):
    """A name this bench patches no longer exists in the product code."""


def _zero(*_: Any, **__: Any) -> float:
    return 0.0


def _label(obj: Any) -> str:
    """``obj``'s dotted name: a module, a class, or an instance of a class."""
    if isinstance(obj, type):
        return f"{obj.__module__}.{obj.__qualname__}"
    if hasattr(obj, "__spec__") and hasattr(obj, "__name__"):  # a module
        return str(obj.__name__)
    return f"{type(obj).__module__}.{type(obj).__qualname__}()"


def _need(obj: Any, *names: str) -> None:
    """MissingTarget naming each of ``names`` that ``obj`` lacks (setattr would add it)."""
    gone = [f"{_label(obj)}.{n}" for n in names if not hasattr(obj, n)]
    if gone:
        raise MissingTarget(", ".join(gone))


def _counted(key: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``, counting its calls in ``HITS[key]``."""
    HITS.setdefault(key, 0)

    def call(*a: Any, **k: Any) -> Any:
        HITS[key] += 1
        return fn(*a, **k)
    return call


def _set(obj: Any, name: str, value: Callable[..., Any], *,
         setter: Callable[[Any, str, Any], None] = setattr) -> None:
    """Replace ``obj.name`` (which must exist) with ``value``, counting its calls."""
    _need(obj, name)
    setter(obj, name, _counted(f"{_label(obj)}.{name}", value))


# --- the simulator -------------------------------------------------------------------------

def _sim(term: str) -> None:
    from hetpar.sim import chunk, moe, structure

    if term == "bubble":  # pipeline = m x the slowest rank's busy time
        def flat(schedule: str, ranks: Any, m: int, vpp: int, *, exact: bool = False) -> float:
            return m * max(r.total for r in ranks)
        _set(structure, "makespan", flat)
    elif term == "dp_sync":
        _set(structure, "_dp_sync", _zero)
        _set(structure, "_tied_sync", _zero)
    elif term == "tp_comm":
        _set(chunk, "_tp_comm", _zero)
    elif term == "recompute":
        _need(chunk, "_layer_cost")
        orig = chunk._layer_cost
        _set(chunk, "_layer_cost", lambda *a: dataclasses.replace(orig(*a), recompute=0.0))
    elif term == "optimizer":
        _set(structure, "_optimizer_time", _zero)
    elif term == "ep_comm":  # the registered EP cost's all-to-all time
        _set(moe.EP_COST, "time", _zero, setter=object.__setattr__)
    else:
        raise ValueError(f"sim has no mutation {term!r}")


# --- the failure study's AnalyticCost -----------------------------------------------------

def _failures(term: str) -> None:
    from hetpar.failures.cost import AnalyticCost as A

    if term == "bubble":  # (m + (p-1)/v) x per-mb -> m x per-mb
        _need(A, "replica_time")
        orig = A.replica_time

        def flat(self: A, tp: int, batch: int, speed: float = 1.0) -> float:
            m = max(1, batch // self.plan.micro_batch)
            return orig(self, tp, batch, speed) * m / (m + (self.lay.pp - 1) / self.lay.vpp)
        _set(A, "replica_time", flat)
    elif term == "dp_sync":
        _set(A, "sync_time", _zero)
    elif term == "tp_comm":
        _set(A, "_tp_comm", _zero)
    elif term == "recompute":  # 4 passes -> 3
        _need(A, "_compute")
        comp = A._compute
        _set(A, "_compute", lambda self, tp, speed: comp(self, tp, speed) * (
            0.75 if self.plan.recompute == "full" else 1.0))
    else:
        raise ValueError(f"failures has no mutation {term!r}")


# --- the failure study's SimCost (the simulator's breakdown, rescaled per term) ----------

def _failures_sim(term: str) -> None:
    from hetpar.failures import simcost

    keys = {"bubble": "bubble", "tp_comm": "tp_comm", "recompute": "recompute",
            "optimizer": "optimizer"}
    if term == "dp_sync":
        _set(simcost.SimCost, "sync_time", _zero)
    elif term in keys:  # the rescaled replica time leaves that term out
        _need(simcost, "rescaled")
        orig = simcost.rescaled
        _set(simcost, "rescaled", lambda b, f: orig({**b, keys[term]: 0.0}, f))
    else:
        raise ValueError(f"failures-sim has no mutation {term!r}")


# --- replay's AnalyticThroughput ----------------------------------------------------------

@contextmanager
def _ring_off(mod: Any) -> Iterator[None]:
    """``mod.terms.ring_all_reduce`` returns 0 inside the block."""
    real = mod.terms
    zero = _counted(f"{mod.__name__}.terms.ring_all_reduce", _zero)

    class Off:
        def __getattr__(self, name: str) -> Any:
            return zero if name == "ring_all_reduce" else getattr(real, name)
    mod.terms = Off()
    try:
        yield
    finally:
        mod.terms = real


def _dynamic(term: str) -> None:
    import hetpar.dynamic.cost as mod
    from hetpar.dynamic.cost import AnalyticThroughput as A

    _need(A, "_stage_s", "_check_memory")  # what the replacements call
    _need(mod, "terms")
    _need(mod.terms, "ring_all_reduce")
    if term == "bubble":  # sum + (m-1) max -> m max: rebuild from the stage times
        def flat(self: A, plan: Any, r: Any, net: Any) -> float:
            pp, n = plan.pp_of(r), len(r.stages)
            times = [0.0] * pp
            for j, s in enumerate(r.stages):
                nxt = r.stages[j + 1] if j + 1 < n else None
                times[j % pp] += self._stage_s(plan, s, nxt, r.micro_batch, net, j == 0,
                                               j == n - 1)
            for rank in range(pp):
                self._check_memory(plan, r, rank, list(r.stages[rank::pp]), net)
            return r.num_microbatches * max(times)
        _set(A, "_pipeline_s", flat)
    elif term == "dp_sync":
        _set(A, "_dp_s", _zero)
    elif term == "tp_comm":  # the ring inside _stage_s is the TP all-reduce
        stage = A._stage_s

        def no_tp(self: A, *a: Any) -> float:
            with _ring_off(mod):
                return stage(self, *a)
        _set(A, "_stage_s", no_tp)
    elif term == "recompute":  # time as without recompute; memory still checks the plan's
        stage = A._stage_s

        def no_rc(self: A, plan: Any, *a: Any) -> float:
            if plan.recompute == "full":
                plan = dataclasses.replace(plan, recompute="none")
            return stage(self, plan, *a)
        _set(A, "_stage_s", no_rc)
    else:
        raise ValueError(f"dynamic has no mutation {term!r}")


# --- the search's bounds ------------------------------------------------------------------

def _search(term: str) -> None:
    from hetpar.search import bounds, simtail

    if term == "bubble":  # the pipeline fill of the rank lines
        _set(bounds.ClassLines, "fill", lambda self, c, k: 0.0)
    elif term == "dp_sync":  # SimTail's all-reduce / reduce-scatter / all-gather
        from hetpar.sim import network as net
        names = ("all_reduce", "reduce_scatter", "all_gather")
        _need(net, *names)
        _need(simtail.SimTail, "per_class")
        per = simtail.SimTail.per_class
        zeros = {n: _counted(f"{net.__name__}.{n}", _zero) for n in names}

        def no_sync(self: Any, *a: Any, **k: Any) -> tuple[float, ...]:
            saved = {n: getattr(net, n) for n in names}
            for n in saved:
                setattr(net, n, zeros[n])
            try:
                return per(self, *a, **k)
            finally:
                for n, f in saved.items():
                    setattr(net, n, f)
        _set(simtail.SimTail, "per_class", no_sync)
    elif term == "optimizer":  # the step at infinite memory efficiency
        _set(simtail, "step_bound", _zero)
    else:
        raise ValueError(f"search has no mutation {term!r}")


MUTATORS: dict[str, Callable[[str], None]] = {
    "sim": _sim, "failures": _failures, "failures-sim": _failures_sim, "dynamic": _dynamic,
    "search": _search}
