"""Incremental vs full re-planning with the search planner on two small traces.

    .venv/bin/python bench/replay_incremental_check.py

Per state: the plan each picks, its simulated tokens/s and the decision wall time; then
the adaptive policy's tokens over the trace with each. Cases: a 4+4-GPU cluster whose
switch drops to 10% and whose second group gets a straggler, and consumer-mix (32 GPUs)
with the switch at 20%, a straggler, and a node leaving. A full search takes 5 s to minutes
per state on a loaded 2-core machine. See docs/dynamic.md (incremental re-planning).
"""

from __future__ import annotations

import sys
import time

from hetpar.catalog import load_cluster, load_model
from hetpar.dynamic.adapters import SearchPlanner, SimThroughput
from hetpar.dynamic.replay import Replayer
from hetpar.dynamic.state import timeline
from hetpar.dynamic.trace import parse_csv
from hetpar.specs.cluster import ClusterSpec, NetworkTier, NodeGroup
from hetpar.specs.job import Job

HEAD = "# horizon_s: 7200\nt_s,kind,target,value,node,nodes\n"
SMALL = ClusterSpec(name="small-4+4", node_groups=(
    NodeGroup(name="a", gpu="RTX-3090", num_nodes=2, gpus_per_node=2, nic_bandwidth_gbps=25.0),
    NodeGroup(name="b", gpu="RTX-4090", num_nodes=2, gpus_per_node=2, nic_bandwidth_gbps=25.0)),
    tiers=(NetworkTier(name="switch", kind="pod", size_gpus=0, bandwidth_gbps=25.0,
                       latency_us=5.0),))
CASES = (  # cluster, global batch, trace rows
    (SMALL, 16, "1000,factor,tier:switch,0.1,,\n2000,slowdown,group:b,3,1,\n"
                "3000,factor,tier:switch,1,,\n"),
    (load_cluster("consumer-mix"), 64,
     "1000,factor,tier:switch,0.2,,\n2000,slowdown,group:rtx4090,2,1,\n"
     "3000,factor,tier:switch,1,,\n4000,slowdown,group:rtx4090,1,1,\n"
     "5000,leave,group:rtx3090,,,1\n"),
)


def main() -> int:
    model = load_model("opt-350m")
    for cluster, gbs, rows in CASES:
        job = Job(global_batch=gbs)
        trace = parse_csv(HEAD + rows, "t.csv")
        inc, full = SearchPlanner(model, job), SearchPlanner(model, job, incremental=False)
        sim = SimThroughput(model, job)
        print(f"{cluster.name}, opt-350m, gbs {gbs}")
        for step in timeline(cluster, trace):
            t0 = time.perf_counter()
            a = inc.best(step.state)
            t1 = time.perf_counter()
            b = full.best(step.state)
            t2 = time.perf_counter()
            ta = sim.tokens_per_s(a, step.state) if a else 0.0
            tb = sim.tokens_per_s(b, step.state) if b else 0.0
            how = "full" if inc.decisions[-1].full else "re-priced"
            print(f"  t={step.t_s:5.0f} incremental ({how}) {ta:10,.0f} tokens/s "
                  f"{t1 - t0:6.2f} s | full {tb:10,.0f} tokens/s {t2 - t1:6.2f} s", flush=True)
        for name, planner in (("incremental", inc), ("full", full)):
            res = Replayer(model, job, cluster, trace, sim, planner).run("adaptive")
            print(f"  adaptive with {name}: {res.tokens:.4g} tokens, "
                  f"{len(res.switches)} switches", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
