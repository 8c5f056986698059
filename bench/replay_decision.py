"""Wall time of adaptive re-planning decisions on 1,024-GPU clusters (mean over events).

    .venv/bin/python bench/replay_decision.py [--cost analytic|sim] [--planner shape|search]
        [--no-incremental] [--case N] [--events N] [--clock wall|cpu]

Replays a busy synthetic trace (spine bandwidth changing every 5 minutes, nodes leaving and
returning, a straggler; generated deterministically here) on hetero-1024 and h100-pod-400g
and prints the distribution of the time one decision takes: the planner plus the switch
cost. Single-threaded. Target (issue 36): mean <= 1 s on the heterogeneous cluster.
``--planner search`` plans with hetpar.search, incrementally (re-pricing the last search's
plans while the GPU set holds, dynamic/incremental.py) unless ``--no-incremental`` (a full
search per state: minutes each on 1,024 GPUs, so cap the trace with ``--events``).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
import types

from hetpar.catalog import load_cluster, load_model
from hetpar.dynamic import replay
from hetpar.dynamic.adapters import SearchPlanner, make_models
from hetpar.dynamic.replay import Replayer
from hetpar.dynamic.trace import parse_csv
from hetpar.specs.job import Job

CASES = (  # cluster, spine tier, group for membership events, model, global batch
    ("hetero-1024", "spine", "a100-80", "llama3.1-8b", 1024),
    ("hetero-1024", "spine", "a100-80", "llama3.1-70b", 2048),
    ("h100-pod-400g", "pod", "h100", "llama3.1-70b", 2048),
)


def busy_trace(tier: str, group: str, seed: int = 7, events: int = 71) -> str:
    rng = random.Random(seed)
    rows = []
    for k in range(1, min(events, 71) + 1):
        # distinct values: replay caches plans per repeated state, this measures planning
        rows.append(f"{k * 300},factor,tier:{tier},{rng.uniform(0.1, 1.0):.4f},,")
    rows += [f"{3 * 3600 + 17},leave,group:{group},,,3",
             f"{4 * 3600 + 17},join,group:{group},,,3",
             f"{5 * 3600 + 29},slowdown,group:{group},2,5,",
             f"{5.5 * 3600 + 29:g},slowdown,group:{group},1,5,"]
    rows = [r for r in rows if float(r.split(",")[0]) <= (min(events, 71) + 0.5) * 300]
    rows.sort(key=lambda r: float(r.split(",")[0]))
    head = "# horizon_s: 21600\n# restart_s: 60\nt_s,kind,target,value,node,nodes\n"
    return head + "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cost", choices=("analytic", "sim"), default="analytic")
    ap.add_argument("--planner", choices=("shape", "search"), default="shape")
    ap.add_argument("--no-incremental", action="store_true",
                    help="--planner search: a full search at every state (the before)")
    ap.add_argument("--case", type=int, action="append",
                    help="run only these rows of CASES (0-based; repeatable)")
    ap.add_argument("--events", type=int, default=71,
                    help="bandwidth changes in the trace (default 71: 6 h at one per 5 min)")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="time decisions by the wall clock (default) or by this process's "
                         "CPU time (a loaded machine: the decision is single-threaded)")
    args = ap.parse_args()
    if args.clock == "cpu":  # the replay times its decisions with this clock
        replay.time = types.SimpleNamespace(perf_counter=time.process_time)  # type: ignore
    print(f"{'cluster':15} {'model':13} {'gpus':>5} {'decisions':>9} {'mean s':>7} "
          f"{'median s':>9} {'p90 s':>7} {'max s':>7} {'first (cold) s':>14}")
    for i, (cname, tier, group, mname, gbs) in enumerate(CASES):
        if args.case and i not in args.case:
            continue
        cluster, model, job = load_cluster(cname), load_model(mname), Job(global_batch=gbs)
        trace = parse_csv(busy_trace(tier, group, events=args.events), "busy.csv")
        cost, planner = make_models(args.cost, model, job, args.planner)
        if isinstance(planner, SearchPlanner):
            planner.incremental = not args.no_incremental
        t0 = time.perf_counter()
        res = Replayer(model, job, cluster, trace, cost, planner).run("adaptive")
        dec = sorted(res.decision_s[1:])
        print(f"{cname:15} {mname:13} {cluster.num_gpus:5d} {len(dec):9d} "
              f"{statistics.mean(dec):7.3f} {statistics.median(dec):9.3f} "
              f"{dec[int(0.9 * (len(dec) - 1))]:7.3f} {dec[-1]:7.3f} "
              f"{res.decision_s[0]:14.3f}", flush=True)
        extra = ""
        if isinstance(planner, SearchPlanner):
            extra = (f", {planner.full_searches} full searches for "
                     f"{len(planner.decisions)} states")
        print(f"  ({len(res.switches)} switches{extra}, {time.perf_counter() - t0:.0f} s wall)",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
