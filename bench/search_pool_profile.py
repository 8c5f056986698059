"""What the planner's search hands its worker pool (hetero-1024, Llama-3.1-70B): maps, items.

Runs the search of bench/search_speed.py in one process through a recording pool and
prints the number of maps and plans, the time spent evaluating them against the time of
the whole search, the pickled size and load time of the shared cost model, the tasks that
a pool of --workers workers would run (hetpar.workers.chunk_size), and the time per plan
evaluated with a freshly unpickled cost model each time (what a plain Ray task had) against
one long-lived unpickled copy (a Ray actor, a forked process).

Run: PYTHONPATH=$PWD .venv/bin/python bench/search_pool_profile.py [--workers 2]
"""

import argparse
import pickle
import time
from collections.abc import Callable, Iterator
from typing import Any

import hetpar.search.evaluate as evaluate
from hetpar.catalog import load_cluster, load_job, load_model
from hetpar.search import load_space, search
from hetpar.search.evaluate import evaluate_one
from hetpar.workers import Pool, chunk_size


class Recording(Pool):
    """This process, keeping each map's items and evaluation time, and ``shared`` pickled."""

    def __init__(self) -> None:
        self.maps: list[tuple[list[Any], float]] = []
        self.blob = b""

    def _run(self, fn: Callable[[Any, Any], Any], items: list[Any],
             shared: Any) -> Iterator[Any]:
        if not self.blob:
            self.blob = pickle.dumps(shared)
        t0 = time.perf_counter()
        out = [fn(shared, x) for x in items]
        self.maps.append((items, time.perf_counter() - t0))
        return iter(out)


def _per_plan(blob: bytes, sample: list[Any], warmup: list[Any]) -> tuple[float, float]:
    """Seconds per plan: a fresh unpickled copy for each plan; one copy, warmed up first."""
    fresh = 0.0
    for plan in sample:
        cost = pickle.loads(blob)
        t0 = time.perf_counter()
        evaluate_one(cost, plan)
        fresh += time.perf_counter() - t0
    cost = pickle.loads(blob)
    for plan in warmup:
        evaluate_one(cost, plan)
    t0 = time.perf_counter()
    for plan in sample:
        evaluate_one(cost, plan)
    return fresh / len(sample), (time.perf_counter() - t0) / len(sample)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=2, help="workers to count tasks for")
    args = ap.parse_args()
    pool = Recording()
    evaluate.open_pool = lambda _workers: pool  # the backend of search() is this pool
    model, cluster = load_model("llama3.1-70b"), load_cluster("hetero-1024")
    t0 = time.perf_counter()
    search(model, cluster, load_job("default"), load_space("default"), top=5, workers=1)
    wall = time.perf_counter() - t0
    items = [len(m) for m, _ in pool.maps]
    tasks = sum(-(-n // chunk_size(n, args.workers)) for n in items)
    busy = sum(t for _, t in pool.maps)
    print(f"search {wall:.1f} s in one process; {len(items)} maps, {sum(items)} plans "
          f"({min(items)}-{max(items)} a map), evaluating them {busy:.1f} s")
    t0 = time.perf_counter()
    pickle.loads(pool.blob)
    print(f"shared cost model: {len(pool.blob) / 1e6:.2f} MB pickled, loads in "
          f"{(time.perf_counter() - t0) * 1e3:.0f} ms; {tasks} chunks for {args.workers} workers")
    step = max(1, len(pool.maps) // 6)
    sample = [p for m, _ in pool.maps[::step] for p in m[:4]]
    warmup = [p for m, _ in pool.maps[1::step] for p in m[4:8]]
    fresh, warm = _per_plan(pool.blob, sample, warmup)
    print(f"{len(sample)} plans: {fresh * 1e3:.0f} ms a plan on a fresh copy of the cost model, "
          f"{warm * 1e3:.0f} ms on one long-lived copy")


if __name__ == "__main__":
    main()
