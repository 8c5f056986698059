"""Mutation check: zero one cost term of one cost model and see which test fails (issue 34).

Run: PYTHONPATH=$PWD .venv/bin/python bench/mutation.py [--only MODEL:TERM ...] [--exclude FILE ...]
For every (model, term) it runs ``pytest -x -q -p mutation`` on that model's test files with
``HETPAR_MUTATE=<model>:<term>``; this file is also the pytest plugin, whose
``pytest_configure`` monkeypatches the product code before any test runs (the product has no
mutation hook). A term a model does not have is ``n/a`` with the reason. Prints the table
model x term -> killed (first failing test) / SURVIVED / timeout, after a baseline run of
each model's tests without a mutation (they must pass, or a kill means nothing).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TERMS = ("bubble", "dp_sync", "tp_comm", "recompute", "optimizer", "ep_comm")

# The tests each model is held by (cheap files: the whole table runs in ~15 min on 2 cores).
TESTS = {
    "sim": ["tests/test_sim_invariants.py", "tests/test_sim_pipeline.py",
            "tests/test_sim_compute.py", "tests/test_sim_ep.py", "tests/test_mutation_terms.py"],
    "failures": ["tests/test_failures_closed_forms.py", "tests/test_analytic_vs_sim.py"],
    "failures-sim": ["tests/test_failures_closed_forms.py", "tests/test_failures_policies.py",
                     "tests/test_analytic_vs_sim.py", "tests/test_mutation_terms.py"],
    "dynamic": ["tests/test_analytic_vs_sim.py", "tests/test_mutation_terms.py"],
    "search": ["tests/test_search_bounds.py", "tests/test_mutation_terms.py"],
}

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


def _zero(*_: Any, **__: Any) -> float:
    return 0.0


def _set(obj: Any, name: str, value: Any) -> None:
    setattr(obj, name, value)


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
        orig = chunk._layer_cost
        _set(chunk, "_layer_cost", lambda *a: dataclasses.replace(orig(*a), recompute=0.0))
    elif term == "optimizer":
        _set(structure, "_optimizer_time", _zero)
    elif term == "ep_comm":  # the registered EP cost's all-to-all time
        object.__setattr__(moe.EP_COST, "time", _zero)
    else:
        raise ValueError(f"sim has no mutation {term!r}")


# --- the failure study's AnalyticCost -----------------------------------------------------

def _failures(term: str) -> None:
    from hetpar.failures.cost import AnalyticCost as A

    if term == "bubble":  # (m + (p-1)/v) x per-mb -> m x per-mb
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
        orig = simcost.rescaled
        _set(simcost, "rescaled", lambda b, f: orig({**b, keys[term]: 0.0}, f))
    else:
        raise ValueError(f"failures-sim has no mutation {term!r}")


# --- replay's AnalyticThroughput ----------------------------------------------------------

@contextmanager
def _ring_off(mod: Any) -> Iterator[None]:
    """``mod.terms.ring_all_reduce`` returns 0 inside the block."""
    real = mod.terms

    class Off:
        def __getattr__(self, name: str) -> Any:
            return _zero if name == "ring_all_reduce" else getattr(real, name)
    mod.terms = Off()
    try:
        yield
    finally:
        mod.terms = real


def _dynamic(term: str) -> None:
    import hetpar.dynamic.cost as mod
    from hetpar.dynamic.cost import AnalyticThroughput as A

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
        per = simtail.SimTail.per_class

        def no_sync(self: Any, *a: Any, **k: Any) -> tuple[float, ...]:
            saved = {n: getattr(net, n) for n in ("all_reduce", "reduce_scatter", "all_gather")}
            for n in saved:
                setattr(net, n, _zero)
            try:
                return per(self, *a, **k)
            finally:
                for n, f in saved.items():
                    setattr(net, n, f)
        _set(simtail.SimTail, "per_class", no_sync)
    elif term == "optimizer":  # the step at infinite memory efficiency
        _set(simtail, "max", lambda *a, **k: math.inf)
    else:
        raise ValueError(f"search has no mutation {term!r}")


MUTATORS: dict[str, Callable[[str], None]] = {
    "sim": _sim, "failures": _failures, "failures-sim": _failures_sim, "dynamic": _dynamic,
    "search": _search}


def pytest_configure(config: Any) -> None:
    """Apply ``HETPAR_MUTATE`` before the tests import anything that caches."""
    spec = os.environ.get("HETPAR_MUTATE")
    if spec:
        model, term = spec.split(":")
        MUTATORS[model](term)


def run_one(model: str, term: str, limit: float, exclude: tuple[str, ...] = ()
            ) -> tuple[str, float]:
    """Run the model's tests under the mutation (none for ``term`` ''): (verdict, seconds)."""
    env = dict(os.environ, HETPAR_MUTATE=f"{model}:{term}" if term else "",
               PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'bench'}")
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "mutation", "-p", "no:cacheprovider",
           *(t for t in TESTS[model] if t not in exclude)]
    t0 = time.monotonic()
    try:
        out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=limit)
    except subprocess.TimeoutExpired:
        return "timeout", time.monotonic() - t0
    dt = time.monotonic() - t0
    if out.returncode == 0:
        return "SURVIVED", dt
    hit = re.search(r"^FAILED (\S+)", out.stdout, re.M)
    if hit is None:
        return f"error rc={out.returncode}: {out.stdout.strip().splitlines()[-1:]}", dt
    return f"killed by {hit.group(1)}", dt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", default=[], help="MODEL:TERM pairs to run")
    ap.add_argument("--limit", type=float, default=300.0, help="seconds per pair")
    ap.add_argument("--exclude", nargs="*", default=[],
                    help="test files left out (to see what survives without them)")
    args = ap.parse_args()
    pairs = [tuple(p.split(":")) for p in args.only] or [(m, t) for m in MUTATORS for t in TERMS]
    survived = 0
    print("| model | term | result | s |\n|---|---|---|---|")
    for model in dict.fromkeys(m for m, _ in pairs):  # a kill means nothing if they fail anyway
        verdict, dt = run_one(model, "", args.limit, tuple(args.exclude))
        print(f"| {model} | (none) | baseline {'passes' if verdict == 'SURVIVED' else verdict} "
              f"| {dt:.0f} |", flush=True)
        if verdict != "SURVIVED":
            return 2
    for model, term in pairs:
        if (model, term) in NA:
            print(f"| {model} | {term} | n/a: {NA[model, term]} | |", flush=True)
            continue
        verdict, dt = run_one(model, term, args.limit, tuple(args.exclude))
        survived += not verdict.startswith("killed")
        print(f"| {model} | {term} | {verdict} | {dt:.0f} |", flush=True)
    print(f"{survived} not killed")
    return 1 if survived else 0


if __name__ == "__main__":
    raise SystemExit(main())
