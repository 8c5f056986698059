"""Simulator speed: uniform-plan evaluations per second, and a 16,384-GPU timeline.

Targets (issue "Core"): >= 2,000 uniform-plan evaluations/s on one core for a 1,024-GPU
cluster without a timeline; a full timeline of a 16,384-GPU Llama-3.1-405B plan in < 2 s.
Run: .venv/bin/python bench/sim_speed.py
"""

from __future__ import annotations

import itertools
import time

from hetpar.catalog import load_cluster, load_model
from hetpar.errors import Infeasible
from hetpar.sim import simulate
from hetpar.specs.plan import Plan


def uniform_plans(gpus: int, gbs: int) -> list[Plan]:
    """Every uniform plan of a small Megatron-style space that uses exactly ``gpus`` GPUs."""
    out = []
    for tp, pp, mbs, rec, zero in itertools.product(
        (1, 2, 4, 8), (1, 2, 4, 8, 16), (1, 2), ("none", "selective", "full"), (0, 1)
    ):
        dp = gpus // (tp * pp)
        if tp * pp * dp != gpus or gbs % (dp * mbs):
            continue
        vpp = 2 if pp > 1 else 1
        out.append(Plan(tp=tp, pp=pp, dp=dp, micro_batch=mbs, global_batch=gbs,
                        sequence_parallel=tp > 1, recompute=rec, zero=zero, vpp=vpp,
                        schedule="interleaved" if vpp > 1 else "1f1b"))
    return out


def evaluations_per_second(seconds: float = 3.0) -> tuple[float, float, int, int]:
    """(all evaluations/s, feasible evaluations/s, plans in the space, infeasible count).

    Rates are per CPU-second of this process (time.process_time), i.e. per core, so other work
    on a shared machine does not distort them.
    """
    model, cluster = load_model("llama3.1-70b"), load_cluster("h100-pod-400g")
    plans = uniform_plans(cluster.num_gpus, 1024)
    done = infeasible = 0
    feasible_time = 0.0
    clock = time.process_time
    start = clock()
    for plan in itertools.cycle(plans):
        t0 = clock()
        try:
            simulate(model, cluster, plan)
            feasible_time += clock() - t0
        except Infeasible:
            infeasible += 1
        done += 1
        if done % 64 == 0 and clock() - start > seconds:
            break
    return done / (clock() - start), (done - infeasible) / feasible_time, len(plans), infeasible


def big_timeline() -> tuple[float, int, int]:
    model, cluster = load_model("llama3.1-405b"), load_cluster("b200-nvl32-32k")
    plan = Plan(tp=8, pp=16, dp=128, micro_batch=1, global_batch=2048,
                sequence_parallel=True, recompute="selective", zero=1)
    start = time.perf_counter()
    rep = simulate(model, cluster, plan, timeline=True)
    assert rep.timeline is not None
    return time.perf_counter() - start, rep.num_gpus, len(rep.timeline)


def main() -> None:
    rate, feasible, n_plans, infeasible = evaluations_per_second()
    print(f"uniform-plan evaluations/s (1,024-GPU h100-pod-400g, llama3.1-70b, {n_plans} plans "
          f"cycled, per CPU-second): {rate:,.0f} all, {feasible:,.0f} counting only the "
          f"feasible ones ({infeasible} infeasible evaluations)  (target >= 2,000)")
    secs, gpus, events = big_timeline()
    print(f"full timeline, {gpus:,}-GPU llama3.1-405b plan (tp8 pp16 dp128, 16 micro-batches) "
          f"on b200-nvl32-32k: {secs:.3f} s, {events:,} events  (target < 2 s)")


if __name__ == "__main__":
    main()
