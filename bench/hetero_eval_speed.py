"""Evaluation time of the hetero-1024 search's plans with and without the placement memo.

Runs the search of bench/search_speed.py (Llama-3.1-70B on hetero-1024, default space) in
one process through a recording pool, then evaluates every plan it evaluated, in the same
order, on fresh copies of the cost model, in two rounds of two passes: placed afresh each
time (``layout.layouts(memo=False)``), and as the search does (explicit plans placed once
per stage structure, ``hetpar/sim/placed.py``). Prints CPU ms per plan by family (``mixed``,
``split``), whether every outcome is identical, and the search's time outside plan evaluation
(the driver: enumeration, bounds, refinement) as a share of its wall time in one process.

Run: PYTHONPATH=$PWD .venv/bin/python bench/hetero_eval_speed.py
"""

import functools
import gc
import pickle
import time
from collections import defaultdict
from typing import Any

from search_pool_profile import Recording  # bench/: run as a script, its folder is on the path

import hetpar.search.evaluate as evaluate
from hetpar.catalog import load_cluster, load_job, load_model
from hetpar.search import load_space, search
from hetpar.search.evaluate import evaluate_one
from hetpar.sim import core, layout


def _timed(blob: bytes, plans: list[Any]) -> tuple[list[Any], dict[str, list[float]]]:
    """Outcomes, and CPU seconds per plan by family, on one fresh copy of the cost model."""
    cost = pickle.loads(blob)
    out, times = [], defaultdict(list)
    for plan in plans:
        t0 = time.process_time()
        out.append(evaluate_one(cost, plan))
        times[plan.name.split(":")[0]].append(time.process_time() - t0)
    return out, times


def main() -> None:
    pool = Recording()
    evaluate.open_pool = lambda _workers: pool  # the backend of search() is this pool
    model, cluster = load_model("llama3.1-70b"), load_cluster("hetero-1024")
    t0, c0 = time.perf_counter(), time.process_time()
    search(model, cluster, load_job("default"), load_space("default"), top=5, workers=1)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    busy = sum(t for _, t in pool.maps)
    plans = [p for m, _ in pool.maps for p in m]
    print(f"search in one process: {wall:.1f} s wall, {cpu:.1f} s CPU; evaluating its "
          f"{len(plans)} plans {busy:.1f} s; the driver's share of the wall time "
          f"{1 - busy / wall:.0%}")
    del pool.maps[:]  # keep the plans only
    rounds = []
    # two rounds, each pass after a collection: run once, right after the search, the memo's
    # pass measured slower than in a fresh process (one trial, 2026-12-07)
    for _ in range(2):
        gc.collect()
        saved = core.layouts
        core.layouts = functools.partial(layout.layouts, memo=False)  # type: ignore[assignment]
        try:
            ref, t_ref = _timed(pool.blob, plans)
        finally:
            core.layouts = saved
        gc.collect()
        fast, t_fast = _timed(pool.blob, plans)
        rounds.append((t_ref, t_fast, fast == ref))
    for n, (t_ref, t_fast, same) in enumerate(rounds, 1):
        for fam in sorted(t_fast):
            a, b = t_ref[fam], t_fast[fam]
            print(f"round {n}, {fam}: {len(a)} plans, {sum(a) / len(a) * 1e3:.1f} ms a plan "
                  f"placed afresh, {sum(b) / len(b) * 1e3:.1f} ms with the placement memo")
        print(f"round {n}, all: {sum(map(sum, t_ref.values())):.1f} s CPU placed afresh, "
              f"{sum(map(sum, t_fast.values())):.1f} s with the memo; identical outcomes: {same}")


if __name__ == "__main__":
    main()
