"""Heterogeneous efficiency of the planner on the bundled mixed clusters.

For each cluster: the best plan's throughput over the sum of the best throughputs each GPU
type reaches alone on its share of the cluster (its own node group, the global batch split
in proportion to its GPU count). On mixed-a100-h100 also the best plan over the best
uniform plan (same TP and PP everywhere, equal layer split, equal batch shares), next to
what the hardware allows by the same yardstick (sum alone over the best uniform plan).
On consumer-mix also the same figure with every Ethernet bandwidth (NICs, switch) scaled:
groups that train alone send nothing between them, while any plan that uses both must pass
activations (pipeline) or gradients (data parallel) over 10/25 GbE, so the figure there
measures that network, not the planner.

Beside each efficiency: the split bound, an upper bound on any plan whose replicas each use
one GPU type (the `split` family), with nothing paid between the types. Such a plan gives S
sequences to one group and B - S to the other, and each half takes at least as long as the
best plan of that group alone for its share (``split_bound``); below 1 it is the batch
granularity (whole sequences per replica) that the sum alone does not see.

Run: .venv/bin/python bench/search_hetero.py [--workers N]
"""

import argparse
import dataclasses
import itertools
import time

from hetpar.catalog import load_cluster, load_model
from hetpar.errors import ConfigError, Infeasible
from hetpar.search import load_space, search
from hetpar.search.costmodel import StageKey
from hetpar.search.simcost import SimCostModel
from hetpar.specs.job import Job

B512 = Job(name="b512-s4096", global_batch=512, seq_len=4096)
FP16 = Job(name="fp16", global_batch=512, seq_len=4096, precision="fp16")  # V100: no bf16
SMALL = Job(name="fp16-small", global_batch=128, seq_len=2048, precision="fp16")
CASES = [("mixed-a100-h100", "llama3.1-70b", B512), ("v100-a100", "llama3.1-8b", FP16),
         ("consumer-mix", "llama3.1-8b", SMALL)]


def best(model, cluster, job, space, workers):
    """(best Ranked or None, stats or the no-plan reason)."""
    try:
        res = search(model, cluster, job, space, workers=workers, top=1)
    except Infeasible as e:
        return None, str(e)
    return res.ranked[0], res.stats


def alone(model, cluster, group, job, space, workers, quiet=False):
    g = cluster.group(group)
    share = round(job.global_batch * g.num_gpus / cluster.num_gpus)
    sub = dataclasses.replace(cluster, name=f"{cluster.name}/{group}", node_groups=(g,), links=())
    r, why = best(model, sub, dataclasses.replace(job, global_batch=share), space, workers)
    if not quiet:
        tps = r.evaluation.tokens_per_s if r else 0.0
        print(f"    alone: {group:8s} batch {share:4d}  {tps:11,.0f} tok/s  "
              f"{r.plan.name if r else why}")
    return r.evaluation.tokens_per_s if r else 0.0


def alone_time(model, cluster, group, job, space, workers, share):
    """Iteration time of the best plan of ``group`` alone for ``share`` sequences."""
    if share == 0:
        return 0.0
    sub = dataclasses.replace(cluster, name=f"{cluster.name}/{group}",
                              node_groups=(cluster.group(group),), links=())
    r, _ = best(model, sub, dataclasses.replace(job, global_batch=share), space, workers)
    return r.evaluation.iteration_time_s if r else float("inf")


def seconds_per_sequence(model, cluster, group, job, space):
    """Least GPU-seconds one sequence costs on ``group`` over the space's stage shapes: tp x
    (layers x layer time + embedding + head) / micro-batch, from the planner's probe costs
    (search/simcost.py). A replica of tp*pp GPUs runs m micro-batches in at least m times its
    slowest rank, which is at least 1/pp of that sum; ZeRO, DP sync, bubbles and sends only add.
    So S sequences on N GPUs of the group take at least S x this / N."""
    cost, out = SimCostModel(model, cluster, job), float("inf")
    for tp, mb, rc, sp in itertools.product(space.tp, space.micro_batch, space.recompute,
                                            space.sequence_parallel):
        try:
            c = cost.stage_cost(StageKey(group=group, tp=tp, micro_batch=mb, recompute=rc,
                                         sequence_parallel=sp))
        except (Infeasible, ConfigError):
            continue
        per = model.n_layers * c.layer_time_s + c.embed_time_s + c.head_time_s
        out = min(out, tp * per / mb)
    return out


def split_bound(model, cluster, job, space, workers):
    """(tokens/s, S): the most any split plan of a two-group cluster can reach, and the
    share S of the first group that reaches it. S runs over every share the per-sequence
    floors (``seconds_per_sequence``) do not already rule out against the best found."""
    ga, gb = (g.name for g in cluster.node_groups)
    batch = job.global_batch
    fa, fb = (seconds_per_sequence(model, cluster, g.name, job, space) / g.num_gpus
              for g in cluster.node_groups)
    s0 = round(batch * fb / (fa + fb))  # where the floors balance: the best splits are near
    order = sorted(range(batch + 1), key=lambda s: (abs(s - s0), s))
    top, at = float("inf"), s0
    for s in order:
        if s * fa >= top or (batch - s) * fb >= top:
            continue  # either half alone is already slower than the best split found
        t = alone_time(model, cluster, ga, job, space, workers, s)
        if t < top:  # the other half only matters when this one could still win
            t = max(t, alone_time(model, cluster, gb, job, space, workers, batch - s))
        if t < top:
            top, at = t, s
    return batch * job.seq_len / top, at


def scale_ethernet(cluster, f: float):
    """The cluster with every NIC share and tier bandwidth times ``f``."""
    groups = tuple(dataclasses.replace(g, nic_bandwidth_gbps=g.nic_bandwidth_gbps * f)
                   for g in cluster.node_groups)
    tiers = tuple(dataclasses.replace(t, bandwidth_gbps=t.bandwidth_gbps * f)
                  for t in cluster.tiers)
    return dataclasses.replace(cluster, name=f"{cluster.name} (Ethernet x{f:g})",
                               node_groups=groups, tiers=tiers)


def efficiency(model, cluster, job, space, workers, quiet=False):
    """(best Ranked, stats, sum of the groups' best alone)."""
    top, stats = best(model, cluster, job, space, workers)
    assert top is not None, stats
    total = sum(alone(model, cluster, g.name, job, space, workers, quiet)
                for g in cluster.node_groups)
    return top, stats, total


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    space = load_space("default")
    for cname, mname, job in CASES:
        t0 = time.perf_counter()
        cluster, model = load_cluster(cname), load_model(mname)
        print(f"{cname} ({cluster.num_gpus} GPUs), {mname}, batch {job.global_batch} x "
              f"{job.seq_len}:")
        top, stats, total = efficiency(model, cluster, job, space, args.workers)
        tps = top.evaluation.tokens_per_s
        print(f"  best {tps:,.0f} tok/s  {top.plan.name}")
        print(f"  heterogeneous efficiency = best / sum alone = {tps / total:.3f}  "
              f"(bound violations {stats.bound_violations}, {time.perf_counter() - t0:.0f} s)")
        if len(cluster.node_groups) == 2:
            ub, s = split_bound(model, cluster, job, space, args.workers)
            print(f"  split bound {ub:,.0f} tok/s = {ub / total:.3f} of sum alone "
                  f"({s} + {job.global_batch - s} sequences; any plan of one-type replicas, "
                  f"nothing paid between types)")
        if cname == "mixed-a100-h100":
            uni = dataclasses.replace(space, families=("uniform",))
            u, _ = best(model, cluster, job, uni, args.workers)
            assert u is not None
            ut = u.evaluation.tokens_per_s
            print(f"  best uniform plan {ut:,.0f} tok/s ({u.plan.name})")
            print(f"  best / best uniform = {tps / ut:.3f}; hardware yardstick "
                  f"(sum alone / best uniform) = {total / ut:.3f}")
        if cname == "consumer-mix":
            for f in (2.0, 4.0):
                t2, _, s2 = efficiency(model, scale_ethernet(cluster, f), job, space,
                                       args.workers, quiet=True)
                print(f"  with Ethernet x{f:g}: efficiency {t2.evaluation.tokens_per_s / s2:.3f}"
                      f"  (best {t2.evaluation.tokens_per_s:,.0f}, sum alone {s2:,.0f} tok/s)")


if __name__ == "__main__":
    main()
