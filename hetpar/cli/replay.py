"""Replay training over a trace of cluster events under a re-planning policy.

The trace (CSV or JSON, see docs/dynamic.md) changes bandwidths of tiers, links and
intra-node paths, fails and restores links and paths, removes and returns nodes, and slows
nodes down. Replay follows the cluster state over the trace's horizon and reports the
throughput over time, the tokens trained, and every re-plan with its reason and cost.
static keeps its plan (re-planning only when it cannot run); oracle re-plans at every
change for free (an upper bound); adaptive re-plans when the expected gain pays for the
switch. --policy all runs the three and prints the ratios; --workers 3 runs them in parallel
(worker processes or a Ray cluster) with the same results.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from hetpar import catalog
from hetpar.cli import progress
from hetpar.cli.options import WORKERS, WORKERS_HELP, check_output
from hetpar.dynamic.adapters import COST_KINDS, PLANNER_KINDS, make_models
from hetpar.dynamic.policy import POLICIES
from hetpar.dynamic.replay import Replayer, ReplayResult, replay_policies
from hetpar.dynamic.trace import load_trace, trace_names
from hetpar.errors import ConfigError
from hetpar.workers import SERIAL, open_pool

NAME = "replay"
HELP = "replay training over a trace of cluster events (static, adaptive, oracle re-planning)"
EXAMPLES = f"""examples:
  hetpar replay --model llama3.1-70b --job gbs=512 --trace interzone-fluctuation --policy all \\
      --workers 3
  hetpar replay --model llama3.1-8b --cluster mixed-a100-h100 --job gbs=1024 \\
      --trace spot-preemptions --policy adaptive --json
  hetpar replay --model llama3.1-8b --job gbs=1024 --trace spine-degraded --policy all \\
      --plot spine.png
bundled traces: {', '.join(trace_names())}
--cluster defaults to the cluster the trace was written for; --job takes a catalog name,
a file, or inline key=value pairs (gbs=512,seq_len=4096).
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="model: catalog name or file")
    p.add_argument("--cluster", help="cluster: catalog name or file (default: the trace's)")
    p.add_argument("--job", required=True, help="job: catalog name, file, or gbs=N[,seq_len=S]")
    p.add_argument("--trace", required=True, help="trace: bundled name or .csv/.json file")
    p.add_argument("--policy", default="adaptive", choices=(*POLICIES, "all"),
                   help="re-planning policy (default adaptive; all = the three side by side)")
    p.add_argument("--plan", help="start plan (default: the planner's best at t=0)")
    p.add_argument("--cost", default="analytic", choices=COST_KINDS,
                   help="throughput model: analytic (fast, default) or sim (hetpar.sim)")
    p.add_argument("--planner", default="shape", choices=PLANNER_KINDS,
                   help="shape (fast per-group TP x PP search, default) or search (hetpar.search: "
                        "more plan families, seconds to minutes per cluster state)")
    p.add_argument("--workers", type=WORKERS, default=SERIAL, metavar="N|ray[:ADDRESS]",
                   help=WORKERS_HELP + ": with --policy all the three policies replay in "
                   "parallel (default 1: this process)")
    p.add_argument("--plot", metavar="FILE", help="write throughput over time (.png/.svg/.pdf)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")


def run(args: argparse.Namespace) -> int:
    check_output(args.plot, "--plot", (".png", ".svg", ".pdf"))
    trace = load_trace(args.trace)
    cluster_ref = args.cluster or trace.cluster
    if not cluster_ref:
        raise ConfigError(f"trace {trace.name!r} names no cluster; give --cluster")
    model, cluster = catalog.load_model(args.model), catalog.load_cluster(cluster_ref)
    job = catalog.load_job(args.job)
    start = catalog.load_plan(args.plan) if args.plan else None
    cost, planner = make_models(args.cost, model, job, args.planner)
    policies = list(POLICIES) if args.policy == "all" else [args.policy]
    if len(policies) == 1 and args.workers != SERIAL:  # one task: the pool had nothing to share
        print(f"hetpar: warning: --workers runs the policies of --policy all in parallel; "
              f"--policy {args.policy} is one replay, run in this process", file=sys.stderr)
        args.workers = SERIAL
    with progress.bar(args, None, "replay", unit="step") as bar, \
            open_pool(args.workers) as pool:
        # the replayer reports every 50 trace steps: shown as the bar's status
        replayer = Replayer(model, job, cluster, trace, cost, planner,
                            progress=bar.set_postfix_str if progress.enabled(args) else None)
        results = replay_policies(replayer, policies, start, pool)
    if args.plot:
        from hetpar.dynamic.plot import plot_results

        plot_results(results, args.plot)
    if args.json:
        data: dict[str, Any] = {
            "trace": trace.name, "cluster": cluster.name, "model": model.name,
            "job": {"global_batch": job.global_batch, "seq_len": job.seq_len or model.seq_len},
            "results": [r.to_dict() for r in results],
        }
        if len(results) == 3:
            data["ratios"] = _ratios(results)
        json.dump(data, sys.stdout, indent=1)
        print()
    else:
        print(_text(trace.name, cluster.name, model.name, results))
    return 0


def _ratios(results: list[ReplayResult]) -> dict[str, float]:
    tok = {r.policy: r.tokens for r in results}
    return {"adaptive/oracle": tok["adaptive"] / tok["oracle"],
            "adaptive/static": tok["adaptive"] / tok["static"],
            "static/oracle": tok["static"] / tok["oracle"]}


def _decisions(wall_s: tuple[float, ...]) -> str:
    """Mean and max wall time of the re-plans after the start plan (wall clock: varies)."""
    later = wall_s[1:]
    if not later:
        return ""
    return f"; decision mean {sum(later) / len(later):.3f} s, max {max(later):.3f} s"


def _text(trace: str, cluster: str, model: str, results: list[ReplayResult]) -> str:
    lines = [f"trace {trace} on {cluster}, model {model}"]
    for r in results:
        lines.append(f"\n{r.policy}: {r.tokens:.4g} tokens in {r.horizon_s / 3600:.2f} h "
                     f"({r.tokens / r.horizon_s:,.0f} tokens/s mean), {len(r.switches)} switches"
                     f"{_decisions(r.decision_s)}")
        for s in r.switches:
            cost = f"{s.cost.total_s:.0f} s ({s.cost.method})" if s.cost else "free"
            lines.append(f"  t={s.t_s:8.0f} s  {s.from_plan} -> {s.to_plan}")
            lines.append(f"              cost {cost}; {s.tokens_per_s_before:,.0f} -> "
                         f"{s.tokens_per_s_after:,.0f} tokens/s; {s.reason}")
        lines.append("  throughput changes (t s: tokens/s, plan):")
        last = None
        shown = 0
        for g in r.segments:
            if (g.plan, round(g.tokens_per_s)) != last and shown < 40:
                lines.append(f"    {g.t_s:8.0f}: {g.tokens_per_s:12,.0f}  {g.plan}")
                last, shown = (g.plan, round(g.tokens_per_s)), shown + 1
    if len(results) == 3:
        lines.append("\n" + ", ".join(f"{k} {v:.3f}" for k, v in _ratios(results).items()))
    return "\n".join(lines)
