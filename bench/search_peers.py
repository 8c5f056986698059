"""Peer planners' plans vs hetpar's search on the Sailor benchmark (OPT-350M, GCP A100 + V100).

The setting and the plans each published planner chose are listed in
../shared/peers/README.md (from the Sailor artifact, SOSP'25): OPT-350M, 1024 x 2048 tokens
per iteration, fp32 + Adam, 4-GPU VMs of A100-40GB and V100-16GB in one zone. Every peer plan
is written here as an explicit hetpar plan on the bundled cluster ``gcp-a100-v100`` (cut to
each pool) and scored by hetpar's simulator, next to the plan hetpar's own search finds on
the same cluster and simulator. Each peer plan gets the best of its variants, so the
comparison is against the most favourable reading of it:
- batch shares equal (as the peers assign them) or balanced to the replicas' speeds;
- where the peer gives no layer ranges, an equal split or one proportional to stage speed;
- devices laid out stage-major (DP peers side by side) or replica-major.
Peers' notation: 26 "layers" with the embedding as layer 0 and the head as 25; peer layer
i (1..24) is hetpar layer i - 1. Shapes hetpar plans cannot express are approximated and
marked ``~`` (Metis' stages with more DP replicas than the others become the same GPUs as
TP of the pipelines' stage); FlashFlex's plans (23-101 separate pipelines) are not listed in
enough detail to rebuild and are left out.

Run: .venv/bin/python bench/search_peers.py [--pools 32+96,128] [--space hetero]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import time

from hetpar.catalog import load_cluster, load_gpu, load_model
from hetpar.errors import Infeasible
from hetpar.search import load_space, search
from hetpar.search.explain import reorder
from hetpar.search.robust import interval, p_beats
from hetpar.search.split import batch_shares
from hetpar.sim import simulate
from hetpar.specs.cluster import ClusterSpec
from hetpar.specs.job import Job
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import Plan
from hetpar.specs.stage import Replica, Stage, split_layers

JOB = Job(name="sailor-opt350m", global_batch=1024, seq_len=2048, precision="fp32",
          optimizer="adam")
A, V = "a100", "v100"
# (count, [(group, tp, peer layer range or None), ...]) per class of identical pipelines.
Stg = tuple[str, int, tuple[int, int] | None]
Cls = tuple[int, list[Stg]]
H = (0, 12), (13, 25)  # the two-stage halves used by AMP and Sailor


def sailor7(d: int) -> list[Cls]:
    return [(d, [(V, 4, None)] + [(A, 1, None)] * 4 + [(V, 4, None)] * 2)]


PEERS: dict[str, list[tuple[str, int, list[Cls], bool]]] = {
    # pool: [(planner, micro-batch, classes, approximated)]
    "32+96": [
        ("Sailor", 2, [(3, [(A, 1, H[0]), (A, 1, H[1])]), (24, [(V, 4, H[0]), (A, 1, H[1])])],
         False),
        ("AMP", 1, [(32, [(A, 1, H[0]), (V, 1, H[1])]), (32, [(V, 1, H[0]), (V, 1, H[1])])],
         False),
        ("Metis", 2, [(16, [(A, 1, (0, 7)), (A, 1, (8, 14)), (V, 2, (15, 18)),
                            (V, 4, (19, 25))])], True),
    ],
    "80+240": [
        ("Sailor", 1, sailor7(20), False),
        ("Metis", 1, [(32, [(A, 1, (0, 10)), (A, 1, (11, 20)), (V, 2, (21, 25))])], False),
        ("AMP", 1, [(80, [(A, 1, H[0]), (V, 1, H[1])]), (48, [(V, 1, H[0]), (V, 1, H[1])])],
         False),
    ],
    "128+384": [
        ("Sailor", 1, sailor7(32), False),
        ("Metis", 1, [(32, [(A, 1, None)] * 4 + [(V, 4, None), (V, 2, None), (V, 2, None),
                                                  (V, 4, None)])], False),
        ("AMP", 1, [(64, [(A, 2, None)]), (192, [(V, 2, None)])], False),
    ],
    "32": [
        ("Sailor", 8, [(8, [(A, 4, None)])], False),
        ("Metis", 2, [(32, [(A, 1, None)])], False),
        ("AMP", 1, [(32, [(A, 1, None)])], False),
        ("Galvatron", 2, [(4, [(A, 2, None)] * 4)], False),
    ],
    "80": [
        ("Sailor", 4, [(20, [(A, 4, None)])], False),
        ("DTFM", 1, [(40, [(A, 1, None)] * 2)], False),
        ("AMP", 1, [(32, [(A, 1, None)] * 2)], False),
        ("Metis", 2, [(64, [(A, 1, None)])], False),
    ],
    "128": [
        ("Sailor", 8, [(32, [(A, 4, None)])], False),
        ("AMP", 1, [(64, [(A, 1, None)] * 2)], False),
        ("Galvatron", 2, [(8, [(A, 2, None)] * 8)], False),
        ("Metis", 2, [(128, [(A, 1, None)])], False),
    ],
}


def pool_cluster(pool: str) -> ClusterSpec:
    """The bundled zone cut to ``pool`` (A100 GPUs + V100 GPUs, 4 per VM)."""
    base = load_cluster("gcp-a100-v100")
    parts = [int(x) for x in pool.split("+")]
    groups = []
    for g, n in zip(base.node_groups, parts, strict=False):
        groups.append(dataclasses.replace(g, num_nodes=n // g.gpus_per_node))
    return dataclasses.replace(base, name=f"gcp-a100-v100[{pool}]", node_groups=tuple(groups))


def _layers(classes_stages: list[Stg], n: int, cluster: ClusterSpec, mode: str
            ) -> list[tuple[int, int]]:
    """hetpar layer ranges of one pipeline: the peer's, equal, or speed-proportional."""
    if all(s[2] is not None for s in classes_stages):
        out = []
        for _, _, rng in classes_stages:
            assert rng is not None
            out.append((max(rng[0], 1) - 1, min(rng[1], n)))
        return out
    if mode == "equal":
        return split_layers(n, len(classes_stages))
    speed = [load_gpu(cluster.group(g).gpu).peak_tflops["fp32"] * tp
             for g, tp, _ in classes_stages]
    want = [n * s / sum(speed) for s in speed]
    counts = [max(1, round(w)) for w in want]
    while sum(counts) > n:
        counts[max(range(len(counts)), key=lambda i: counts[i] - want[i])] -= 1
    while sum(counts) < n:
        counts[min(range(len(counts)), key=lambda i: counts[i] - want[i])] += 1
    out, start = [], 0
    for c in counts:
        out.append((start, start + c))
        start += c
    return out


def _devices(classes: list[Cls], order: str) -> dict[tuple[int, int, int], tuple[int, ...]]:
    """Device indices per (class, replica, stage): stage-major or replica-major."""
    cursor: dict[str, int] = {}
    out = {}

    def take(g: str, tp: int) -> tuple[int, ...]:
        start = cursor.get(g, 0)
        cursor[g] = start + tp
        return tuple(range(start, start + tp))

    for ci, (count, stages) in enumerate(classes):
        if order == "stage-major":
            for r, (g, tp, _) in enumerate(stages):
                for i in range(count):
                    out[(ci, i, r)] = take(g, tp)
        else:
            for i in range(count):
                for r, (g, tp, _) in enumerate(stages):
                    out[(ci, i, r)] = take(g, tp)
    return out


def peer_plans(model: ModelSpec, cluster: ClusterSpec, classes: list[Cls], mbs: int
               ) -> list[Plan]:
    """Every variant (layers x layout x shares) of one peer plan as explicit hetpar plans."""
    out = []
    units = JOB.global_batch // mbs
    reps = [ci for ci, (count, _) in enumerate(classes) for _ in range(count)]
    for mode, order in itertools.product(("equal", "speed"), ("stage-major", "replica-major")):
        devs = _devices(classes, order)
        layers = [_layers(st, model.n_layers, cluster, mode) for _, st in classes]

        def replica(ci: int, i: int, m: int, layers=layers, devs=devs) -> Replica:
            st = classes[ci][1]
            stages = tuple(Stage(layers=layers[ci][r], group=g, tp=tp,
                                 devices=devs[(ci, i, r)]) for r, (g, tp, _) in enumerate(st))
            return Replica(stages=stages, batch=m * mbs, micro_batch=mbs)

        equal = [units // len(reps) + (j < units % len(reps)) for j in range(len(reps))]
        shares = [equal]
        rate = _class_rates(model, cluster, classes, replica)
        if len(set(rate)) > 1:
            fns = [lambda k, r=rate[ci]: k / r for ci in reps]
            res = batch_shares(fns, units)
            assert res is not None
            shares.append(res[0])
        for sh in shares:
            seen: dict[int, int] = {}
            replicas = []
            for ci, m in zip(reps, sh, strict=True):
                i = seen.get(ci, 0)
                seen[ci] = i + 1
                replicas.append(replica(ci, i, m))
            out.append(Plan(replicas=tuple(replicas), global_batch=JOB.global_batch,
                            micro_batch=mbs, precision=JOB.precision, zero=0))
    return out


def _class_rates(model, cluster, classes, replica) -> list[float]:
    """Micro-batches per second of one replica of each class alone (from two simulations)."""
    rates = []
    for ci in range(len(classes)):
        t = []
        for m in (8, 16):
            p = Plan(replicas=(replica(ci, 0, m),), global_batch=m * replica(ci, 0, 1).batch,
                     micro_batch=replica(ci, 0, 1).micro_batch, precision=JOB.precision)
            job = dataclasses.replace(JOB, global_batch=p.global_batch)
            t.append(simulate(model, cluster, p, job).iteration_time_s)
        rates.append(8 / max(t[1] - t[0], 1e-12))
    return rates


def best_peer(model, cluster, classes, mbs) -> float:
    best = 0.0
    for p in peer_plans(model, cluster, classes, mbs):
        try:
            rep = simulate(model, cluster, p, JOB)
        except Infeasible:
            continue
        if not rep.oom:
            best = max(best, rep.tokens_per_s)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pools", default=",".join(PEERS))
    ap.add_argument("--space", default="hetero")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    model = load_model("opt-350m")
    print(f"OPT-350M, {JOB.global_batch} x {JOB.seq_len} tokens, fp32; cluster gcp-a100-v100 "
          f"cut to each pool; hetpar space {args.space}; hetpar's simulator scores all plans")
    print(f"{'pool':>8s} {'planner':10s} {'tokens/s':>10s} {'hetpar/it':>9s}")
    worst = float("inf")
    for pool in args.pools.split(","):
        cluster = pool_cluster(pool)
        peers = []
        for name, mbs, classes, approx in PEERS[pool]:
            tps = best_peer(model, cluster, classes, mbs)
            peers.append((name + ("~" if approx else ""), tps))
        t0 = time.process_time()
        w0 = time.perf_counter()
        res = search(model, cluster, JOB, load_space(args.space), workers=args.workers, top=5)
        cpu, wall = time.process_time() - t0, time.perf_counter() - w0
        own = res.ranked[0].evaluation.tokens_per_s
        for name, tps in peers:
            ratio = own / tps if tps else float("inf")
            print(f"{pool:>8s} {name:10s} {tps:10,.0f} {ratio:9.3f}"
                  + ("" if tps else "  (out of memory or infeasible under hetpar's model)"))
        top = max(t for _, t in peers)
        worst = min(worst, own / top)
        print(f"{pool:>8s} {'hetpar':10s} {own:10,.0f} {own / top:9.3f}  "
              f"({wall:.1f} s wall, {cpu:.1f} s CPU in this process) {res.ranked[0].plan.name}")
        print(f"{'':8s} search: " + res.stats.summary().replace("\n", "\n" + " " * 17))
        u = res.objective.uncertainty
        lo, hi = interval(res.ranked[0].evaluation, u)
        p = p_beats(res.ranked[0].evaluation, res.ranked[1].evaluation, u)
        print(f"{'':8s} robust: #1's 80% interval {lo:,.0f}-{hi:,.0f}; P(#1 faster than #2) "
              f"{p:.0%}; " + "; ".join(reorder(res.ranked, u)[:2]))
    print(f"worst hetpar / best peer: {worst:.3f} (goal >= 1.000 on every pool)")


if __name__ == "__main__":
    main()
