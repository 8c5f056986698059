"""Planner speed: Llama-3.1-70B on the bundled 1,024-GPU three-type cluster (hetero-1024).

Prints the wall time of the full search (default space), plans evaluated per second, how
many candidates each pruning rule removed, and the driver's share of the wall time: the
time the search spends outside its pool's maps (enumeration, bounds, layer splits, building
plans), during which no worker evaluates (issue 36: at most 25% with 2 workers). Target:
under 60 s on 2 cores.

Run: .venv/bin/python bench/search_speed.py [--workers 2|ray|ray:ADDRESS] [--job default]
With --workers ray (a Ray instance on this machine, or ray:ADDRESS for a running cluster) it
also times the search in one process and prints Ray's speed-up over it (same ranked plans);
starting or connecting to Ray is timed apart from the search, and both figures are printed.
"""

import argparse
import os
import time
from typing import Any

import hetpar.search.evaluate as evaluate
from hetpar.catalog import load_cluster, load_job, load_model
from hetpar.search import load_space, search


class TimedPool:
    """A pool that adds the wall time of each of its maps to ``busy``."""

    def __init__(self, pool: Any, busy: list[float]) -> None:
        self.pool, self.busy = pool, busy

    def map(self, *args: Any, **kw: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return self.pool.map(*args, **kw)
        finally:
            self.busy[0] += time.perf_counter() - t0

    def close(self) -> None:
        self.pool.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", default="2", help="N processes, or ray[:ADDRESS]")
    ap.add_argument("--job", default="default")
    ap.add_argument("--space", default="default")
    args = ap.parse_args()
    model, cluster = load_model("llama3.1-70b"), load_cluster("hetero-1024")
    job = load_job(args.job)
    ray_address = None
    if args.workers.startswith("ray"):
        ray_address = args.workers[4:] or "local"
        t0 = time.perf_counter()
        one = search(model, cluster, job, load_space(args.space), workers=1, top=5)
        one_wall = time.perf_counter() - t0
    ray_start = 0.0
    if ray_address:
        import ray  # the search reuses this connection and leaves it open

        t0 = time.perf_counter()
        ray.init(address=ray_address, include_dashboard=False, log_to_driver=False)
        ray_start = time.perf_counter() - t0
    busy = [0.0]
    opened = evaluate.open_pool
    evaluate.open_pool = lambda w: TimedPool(opened(w), busy)  # type: ignore[assignment]
    t0, c0 = time.perf_counter(), time.process_time()
    res = search(model, cluster, job, load_space(args.space), top=5,
                 workers=None if ray_address else int(args.workers), ray_address=ray_address)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    st = res.stats
    print(f"llama3.1-70b on hetero-1024 ({cluster.num_gpus} GPUs), job {job.name} "
          f"(batch {job.global_batch} x {job.seq_len}), space {args.space}, "
          f"{args.workers} workers on {os.cpu_count()} CPUs")
    print(f"full search: {wall:.1f} s wall (target < 60 s), the driver's process {cpu:.1f} s CPU")
    print(f"driver's share: {1 - busy[0] / wall:.0%} of the wall time outside the pool's maps "
          f"({wall - busy[0]:.1f} s; the maps {busy[0]:.1f} s; target <= 25% with 2 workers)")
    if ray_address:
        same = [r.key for r in one.ranked] == [r.key for r in res.ranked]
        print(f"one process: {one_wall:.1f} s; Ray ({ray_address}): {wall:.1f} s; speed-up "
              f"{one_wall / wall:.2f}x on {os.cpu_count()} CPUs; same ranked plans: {same}")
        print(f"Ray start/connect: {ray_start:.1f} s (not in the times above; with it the "
              f"speed-up is {one_wall / (wall + ray_start):.2f}x)")
    print(st.summary())
    print(f"plans evaluated per second: {st.plans_per_s:.1f}; bound violations: "
          f"{st.bound_violations}")
    for i, r in enumerate(res.ranked, 1):
        print(f"  #{i} {r.evaluation.tokens_per_s:12,.0f} tok/s  MFU {r.evaluation.mfu:.1%}  "
              f"{r.plan.name}")


if __name__ == "__main__":
    main()
