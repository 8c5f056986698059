"""Where mixed-a100-h100's best plan loses against the sum of its halves alone.

Llama-3.1-70B, 512 x 4096, 128 A100 + 128 H100 (bench/search_hetero.py's first case).
Prints: the stage costs the fluid balance rests on (per-layer time per micro-batch of each
half, the head, one cross-type activation send); the best mixed plan's critical rank taken
apart (layers, sends, per-chunk overheads, bubble); the layer split one layer either way; the
best split plan's two halves beside the same halves alone (their cost between the types);
and two checks that the planner misses no better plan in the default space: every vpp 1-40
in the space itself (no widening heuristic, pruning by the proven bound only), and every
candidate of the mixed family evaluated (the bound's slack set so high that nothing is cut).

Run: .venv/bin/python bench/hetero_gap.py   (about 2 minutes on one core)
"""

import dataclasses
import time

from search_hetero import B512, alone_time

from hetpar.catalog import load_cluster, load_model
from hetpar.search import load_space, search
from hetpar.search.costmodel import StageKey
from hetpar.search.simcost import SimCostModel
from hetpar.sim import simulate

MODEL, CLUSTER = load_model("llama3.1-70b"), load_cluster("mixed-a100-h100")


def top(space, cost=None, n=3):
    res = search(MODEL, CLUSTER, B512, space, workers=1, top=n, cost=cost)
    return res


def with_layers(plan, a_layers):
    """``plan`` (one A100 rank then one H100 rank, looped) with ``a_layers`` on the A100."""
    v = plan.vpp
    sizes_a = [a_layers // v + (i < a_layers % v) for i in range(v)]
    rest = MODEL.n_layers - a_layers
    sizes_h = [rest // v + (i < rest % v) for i in range(v)]
    reps = []
    for rep in plan.replicas:
        a, h, start, st = rep.stages[0], rep.stages[1], 0, []
        for na, nh in zip(sizes_a, sizes_h, strict=True):
            st.append(dataclasses.replace(a, layers=(start, start + na)))
            st.append(dataclasses.replace(h, layers=(start + na, start + na + nh)))
            start += na + nh
        reps.append(dataclasses.replace(rep, stages=tuple(st)))
    return dataclasses.replace(plan, replicas=tuple(reps), name=f"{a_layers} A100 layers")


def main() -> None:
    t0 = time.perf_counter()
    space = load_space("default")
    cost = SimCostModel(MODEL, CLUSTER, B512)
    ka, kh = (StageKey(group=g, tp=2, sequence_parallel=True) for g in ("a100", "h100"))
    ca, ch = cost.stage_cost(ka), cost.stage_cost(kh)
    send = cost.boundary_time(ka, kh, False)
    layers = MODEL.n_layers
    x = (layers * ch.layer_time_s + ch.head_time_s) / (ca.layer_time_s + ch.layer_time_s)
    print(f"tp2 per micro-batch: A100 layer {ca.layer_time_s * 1e3:.2f} ms, H100 layer "
          f"{ch.layer_time_s * 1e3:.2f} ms + head {ch.head_time_s * 1e3:.2f} ms; one A100->H100 "
          f"send {send * 1e3:.2f} ms. Balance at {x:.2f} A100 layers: "
          f"{x * ca.layer_time_s:.4f} s per micro-batch")

    res = top(space, n=20)
    mixed = next(r for r in res.evaluated if r.plan.name.startswith("mixed"))
    split = next(r for r in res.evaluated if r.plan.name.startswith("split"))
    plan, rep = mixed.plan, simulate(MODEL, CLUSTER, mixed.plan, B512)
    m, v = plan.replicas[0].batch // plan.replicas[0].micro_batch, plan.vpp
    n_a = sum(s.layers[1] - s.layers[0] for s in plan.replicas[0].stages[0::2])
    b = rep.breakdown
    print(f"\nbest mixed {rep.tokens_per_s:,.0f} tok/s, {rep.iteration_time_s:.3f} s: {plan.name}")
    print(f"  fluid (balanced layers, no sends, no bubble): {m * x * ca.layer_time_s:.3f} s")
    print(f"  layer split {n_a}/{layers - n_a}: {m * (n_a - x) * ca.layer_time_s:.3f} s; sends "
          f"(pp_comm) {b['pp_comm']:.3f} s; bubble {b['bubble']:.3f} s; per-micro-batch "
          f"overheads of {v} chunks, optimizer, step: rest "
          f"{rep.iteration_time_s - m * n_a * ca.layer_time_s - b['pp_comm'] - b['bubble']:.3f} s")
    for a in (n_a - 1, n_a + 1):
        r2 = simulate(MODEL, CLUSTER, with_layers(plan, a), B512)
        print(f"  {a}/{layers - a} layers: {r2.tokens_per_s:,.0f} tok/s")

    srep = simulate(MODEL, CLUSTER, split.plan, B512)
    print(f"\nbest split {srep.tokens_per_s:,.0f} tok/s, {srep.iteration_time_s:.3f} s: "
          f"{split.plan.name}")
    for g in ("a100", "h100"):
        reps = [r for r in split.plan.replicas if r.stages[0].group == g]
        share = sum(r.batch for r in reps)
        t = alone_time(MODEL, CLUSTER, g, B512, space, 1, share)
        print(f"  {g}: {len(reps)} replicas, {share} sequences ({max(r.batch for r in reps)} "
              f"at most per replica); alone on that share {t:.3f} s")
    print(f"  dp_comm (cross-type all-reduce of the shards) {srep.breakdown['dp_comm']:.3f} s")

    every = dataclasses.replace(space, vpp=tuple(range(1, 41)), widen_vpp=False)
    r = top(every)
    print(f"\nevery vpp 1-40 in the space: best {r.ranked[0].evaluation.tokens_per_s:,.0f} "
          f"({r.ranked[0].plan.name}); {r.stats.candidates:,} candidates, "
          f"{r.stats.simulated} evaluated, bound violations {r.stats.bound_violations}")
    fam = dataclasses.replace(space, families=("mixed",))
    r = top(fam, cost=SimCostModel(MODEL, CLUSTER, B512, slack=1e6))
    print(f"every mixed candidate evaluated (no bound pruning): best "
          f"{r.ranked[0].evaluation.tokens_per_s:,.0f} ({r.ranked[0].plan.name}); "
          f"{r.stats.simulated} evaluated, throughput_bound removed "
          f"{r.stats.removed['throughput_bound']}")
    print(f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
