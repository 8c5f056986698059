"""Tokens trained by each policy on every bundled trace, the ratios, switches and decision times.

    .venv/bin/python bench/replay_policies.py [--cost analytic|sim] [TRACE ...]

Prints one row per trace; targets: adaptive >= 95% of oracle everywhere, above static where
conditions change by more than 2x (or/st, oracle over static, is the most any policy can
gain over static: where it is ~1, re-planning cannot help under that cost model), at most one
switch on the flapping link, median decision time < 1 s on the 1,024-GPU clusters.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from hetpar.catalog import load_cluster, load_model
from hetpar.dynamic.adapters import make_models
from hetpar.dynamic.replay import Replayer
from hetpar.dynamic.trace import load_trace, trace_names
from hetpar.specs.job import Job

# The workload replayed on each trace: a model and a global batch (sequences) that fit it.
WORKLOADS = {
    "interzone-fluctuation": ("llama3.1-70b", 512),
    "spine-degraded": ("llama3.1-8b", 1024),
    "spot-preemptions": ("llama3.1-8b", 1024),
    "straggler-node": ("llama3.1-70b", 2048),
    "flapping-link": ("llama3.1-70b", 512),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("traces", nargs="*", default=trace_names())
    ap.add_argument("--cost", choices=("analytic", "sim"), default="analytic")
    args = ap.parse_args()
    print(f"{'trace':24} {'gpus':>5} {'static':>10} {'adaptive':>10} {'oracle':>10} "
          f"{'ad/or':>6} {'ad/st':>6} {'or/st':>6} {'sw st/ad/or':>12} {'dec med s':>9} "
          f"{'dec max s':>9}")
    for name in args.traces:
        trace = load_trace(name)
        model_name, gbs = WORKLOADS[name]
        model, cluster = load_model(model_name), load_cluster(trace.cluster)
        job = Job(global_batch=gbs)
        cost, planner = make_models(args.cost, model, job)
        t0 = time.perf_counter()
        rp = Replayer(model, job, cluster, trace, cost, planner)
        res = {p: rp.run(p) for p in ("static", "adaptive", "oracle")}
        ad, st, orc = (res[p].tokens for p in ("adaptive", "static", "oracle"))
        dec = res["adaptive"].decision_s[1:] or res["adaptive"].decision_s
        sw = "/".join(str(len(res[p].switches)) for p in ("static", "adaptive", "oracle"))
        print(f"{name:24} {cluster.num_gpus:5d} {st:10.3e} {ad:10.3e} {orc:10.3e} "
              f"{ad / orc:6.3f} {ad / st:6.3f} {orc / st:6.3f} {sw:>12} "
              f"{statistics.median(dec):9.3f} {max(dec):9.3f}", flush=True)
        print(f"  ({model_name}, global batch {gbs}; {len(rp.steps)} states; "
              f"{time.perf_counter() - t0:.0f} s wall)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
