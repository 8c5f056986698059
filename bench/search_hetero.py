"""Heterogeneous efficiency of the planner on the bundled mixed clusters.

For each cluster: the best plan's throughput over the sum of the best throughputs each GPU
type reaches alone on its share of the cluster (its own node group, the global batch split
in proportion to its GPU count). On mixed-a100-h100 also the best plan over the best
uniform plan (same TP and PP everywhere, equal layer split, equal batch shares).

Run: .venv/bin/python bench/search_hetero.py [--workers N]
"""

import argparse
import dataclasses
import time

from hetpar.catalog import load_cluster, load_model
from hetpar.errors import Infeasible
from hetpar.search import SearchSpace, load_space, search
from hetpar.specs.cluster import ClusterSpec
from hetpar.specs.job import Job

CASES = [  # cluster, model, job
    ("mixed-a100-h100", "llama3.1-70b", Job(name="b512-s4096", global_batch=512, seq_len=4096)),
    ("v100-a100", "llama3.1-8b", Job(name="fp16", global_batch=512, seq_len=4096, precision="fp16")),
    ("consumer-mix", "llama3.1-8b",
     Job(name="fp16", global_batch=128, seq_len=2048, precision="fp16")),
]


def best(model, cluster, job, space, workers):
    try:
        res = search(model, cluster, job, space, workers=workers, top=1)
    except Infeasible as e:
        return None, str(e)
    return res.ranked[0], res.stats


def alone(cluster: ClusterSpec, group: str, batch: int) -> tuple[ClusterSpec, int]:
    g = cluster.group(group)
    share = round(batch * g.num_gpus / cluster.num_gpus)
    sub = dataclasses.replace(cluster, name=f"{cluster.name}/{group}", node_groups=(g,), links=())
    return sub, share


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    space = load_space("default")
    print(f"{'cluster':16s} {'model':13s} {'best tok/s':>11s} {'sum alone':>11s} {'eff':>6s}  best plan")
    for cname, mname, job in CASES:
        t0 = time.perf_counter()
        cluster, model = load_cluster(cname), load_model(mname)
        top, _ = best(model, cluster, job, space, args.workers)
        parts = []
        for g in cluster.node_groups:
            sub, share = alone(cluster, g.name, job.global_batch)
            r, why = best(model, sub, dataclasses.replace(job, global_batch=share), space, args.workers)
            parts.append((g.name, share, r.evaluation.tokens_per_s if r else 0.0, why))
        total = sum(p[2] for p in parts)
        eff = top.evaluation.tokens_per_s / total if top and total else float("nan")
        print(f"{cname:16s} {mname:13s} {top.evaluation.tokens_per_s:11,.0f} {total:11,.0f} "
              f"{eff:6.3f}  {top.plan.name}  ({time.perf_counter() - t0:.0f} s)")
        for name, share, tps, why in parts:
            note = "" if tps else f"  (no plan: {why})"
            print(f"    alone: {name:8s} batch {share:4d}  {tps:11,.0f} tok/s{note}")
        if cname == "mixed-a100-h100":
            uni = SearchSpace(**{**{f.name: getattr(space, f.name) for f in dataclasses.fields(space)},
                                 "families": ("uniform",)})
            u, _ = best(model, cluster, job, uni, args.workers)
            if u is not None:
                print(f"    best uniform plan {u.evaluation.tokens_per_s:11,.0f} tok/s ({u.plan.name}); "
                      f"best / uniform = {top.evaluation.tokens_per_s / u.evaluation.tokens_per_s:.3f}")


if __name__ == "__main__":
    main()
