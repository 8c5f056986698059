"""Planner speed: Llama-3.1-70B on the bundled 1,024-GPU three-type cluster (hetero-1024).

Prints the wall time of the full search (default space), plans evaluated per second and
how many candidates each pruning rule removed. Target: under 60 s on 2 cores.

Run: .venv/bin/python bench/search_speed.py [--workers 2] [--job default]
"""

import argparse
import os
import time

from hetpar.catalog import load_cluster, load_job, load_model
from hetpar.search import load_space, search


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--job", default="default")
    ap.add_argument("--space", default="default")
    args = ap.parse_args()
    model, cluster = load_model("llama3.1-70b"), load_cluster("hetero-1024")
    job = load_job(args.job)
    t0 = time.perf_counter()
    res = search(model, cluster, job, load_space(args.space), workers=args.workers, top=5)
    wall = time.perf_counter() - t0
    st = res.stats
    print(f"llama3.1-70b on hetero-1024 ({cluster.num_gpus} GPUs), job {job.name} "
          f"(batch {job.global_batch} x {job.seq_len}), space {args.space}, "
          f"{args.workers} workers on {os.cpu_count()} CPUs")
    print(f"full search: {wall:.1f} s wall (target < 60 s)")
    print(st.summary())
    print(f"plans evaluated per second: {st.plans_per_s:.1f}; bound violations: "
          f"{st.bound_violations}")
    for i, r in enumerate(res.ranked, 1):
        print(f"  #{i} {r.evaluation.tokens_per_s:12,.0f} tok/s  MFU {r.evaluation.mfu:.1%}  "
              f"{r.plan.name}")


if __name__ == "__main__":
    main()
