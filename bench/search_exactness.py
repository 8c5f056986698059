"""Exactness: the planner's best plan vs the exhaustive optimum of spaces small enough to
enumerate (32-64 GPUs of two types), with seeded synthetic costs and with the simulator.

The exhaustive reference evaluates every structure, knob set, layer split and batch share
of the space; the planner prunes, solves the split by DP and evaluates a few hundred plans.
Target: within 0.5% (ratio >= 0.995).

Run: .venv/bin/python bench/search_exactness.py [--quick]
"""

import argparse
import dataclasses
import time

from hetpar.catalog import load_cluster, load_model
from hetpar.search import SearchSpace, search
from hetpar.search.exhaustive import exhaustive_best
from hetpar.search.simcost import SimCostModel
from hetpar.search.synthetic import SyntheticCostModel
from hetpar.specs.cluster import ClusterSpec, NodeGroup
from hetpar.specs.job import Job
from hetpar.specs.model import ModelSpec

WIDE8 = ModelSpec(name="wide-8l", n_layers=8, hidden=8192, n_heads=64, n_kv_heads=8,
                  ffn_hidden=28672, vocab=128256, seq_len=4096, mlp="swiglu")
SPACE = SearchSpace(tp=(8,), pp=(1, 2, 4), micro_batch=(1, 2), vpp=(1, 2),
                    schedule=("1f1b", "interleaved"), recompute=("none", "full"),
                    zero=(1,), widen_vpp=False,  # the reference covers the declared space,
                    algorithm=("auto",), dp_sync=("auto",))  # which has no forced collectives


def two_types(nodes_a: int, nodes_b: int) -> ClusterSpec:
    return ClusterSpec(name=f"synthetic-{8 * (nodes_a + nodes_b)}", node_groups=(
        NodeGroup(name="a", gpu="type-A", num_nodes=nodes_a, gpus_per_node=8),
        NodeGroup(name="b", gpu="type-B", num_nodes=nodes_b, gpus_per_node=8,
                  nic_bandwidth_gbps=400.0),
    ))


def shrink(name: str, nodes: int) -> ClusterSpec:
    """A bundled cluster cut to ``nodes`` nodes per group (32-64 GPUs)."""
    c = load_cluster(name)
    groups = tuple(dataclasses.replace(g, num_nodes=min(nodes, g.num_nodes)) for g in c.node_groups)
    return dataclasses.replace(c, name=f"{name}[{nodes} nodes/group]", node_groups=groups)


def compare(label, model, cluster, job, space, cost) -> float:
    t0 = time.perf_counter()
    got = search(model, cluster, job, space, cost=cost, workers=1, top=1)
    t1 = time.perf_counter()
    ref = exhaustive_best(model, cluster, job, space, cost)
    t2 = time.perf_counter()
    ratio = got.ranked[0].evaluation.tokens_per_s / ref.tokens_per_s
    print(f"{label:44s} {cluster.num_gpus:4d} {ratio:8.4f} {got.stats.simulated:6d} "
          f"{ref.evaluated:8d} {t1 - t0:7.2f} {t2 - t1:8.2f}  {got.ranked[0].plan.name}")
    return ratio


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer seeds")
    args = ap.parse_args()
    seeds = range(3) if args.quick else range(8)
    print(f"{'case':44s} {'GPUs':>4s} {'ratio':>8s} {'evals':>6s} {'exhaust':>8s} "
          f"{'plan s':>7s} {'exh. s':>8s}  planner's plan")
    ratios = []
    for nodes in ((2, 2), (1, 3), (4, 4)):
        cl = two_types(*nodes)
        batch = 16
        space = SPACE if sum(nodes) == 4 else dataclasses.replace(SPACE, vpp=(1,),
                                                                 schedule=("1f1b",))
        for seed in seeds:
            job = Job(global_batch=batch)
            cost = SyntheticCostModel(WIDE8, cl, job, seed=seed)
            ratios.append(compare(f"synthetic seed {seed} nodes {nodes}", WIDE8, cl, job,
                                  space, cost))
    small = dataclasses.replace(load_model("llama3.1-8b"), n_layers=8)
    sim_cases = [
        ("simulator llama3.1-8b[8 layers]", shrink("mixed-a100-h100", 2),
         Job(global_batch=16, seq_len=4096), SPACE),
        ("simulator llama3.1-8b[8 layers]", shrink("v100-a100", 2),
         Job(global_batch=16, seq_len=4096, precision="fp16"), SPACE),
        ("simulator llama3.1-8b[8 layers]", load_cluster("consumer-mix"),
         Job(global_batch=8, seq_len=2048, precision="fp16"),
         dataclasses.replace(SPACE, tp=(1, 2), pp=(4,), micro_batch=(1,), vpp=(1,),
                             schedule=("1f1b",), recompute=("none",))),
    ]
    for label, cl, job, space in sim_cases:
        ratios.append(compare(label, small, cl, job, space, SimCostModel(small, cl, job)))
    print(f"worst ratio {min(ratios):.4f} over {len(ratios)} cases "
          f"({sum(r >= 0.995 for r in ratios)} within 0.5%)")


if __name__ == "__main__":
    main()
