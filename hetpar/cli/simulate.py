"""Simulate one training iteration of a plan: throughput, MFU, memory per rank, time breakdown.

With no arguments it simulates the bundled default example: Llama-3.1-70B on the h100-pod-400g
cluster with the `default` plan and job. Model, cluster, plan and job are catalog names or files;
the plan may also be inline (`tp=8,pp=4,dp=2,mbs=1,gbs=512`). Identical replicas share one
timeline track in --trace output; the track name lists every replica and GPU it stands for.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from hetpar.catalog import load_cluster, load_job, load_model, load_plan
from hetpar.cli.options import check_output
from hetpar.ranking import bundled_bands, cluster_widening, interval
from hetpar.sim import Report, simulate
from hetpar.sim.profile import resolve
from hetpar.specs.plan import Plan

NAME = "simulate"
HELP = "simulate one iteration of a plan on a cluster and print the report"
EXAMPLES = """examples:
  hetpar simulate                                   # the bundled default example
  hetpar simulate --model llama3.1-8b --cluster selene-a100 --plan tp=2,pp=1,dp=4,mbs=2,gbs=64
  hetpar simulate --model llama3.1-8b --cluster gpu=H100-SXM5-80GB,nodes=2 --plan dp=16,gbs=64
  hetpar simulate --model gpt3-175b --cluster selene-a100 \\
      --plan tp=8,pp=8,dp=2,mbs=1,gbs=256,sp=true,schedule=interleaved,vpp=3,recompute=selective
  hetpar simulate --trace iteration.json            # open in https://ui.perfetto.dev
"""

DEFAULT_MODEL, DEFAULT_CLUSTER, DEFAULT_PLAN, DEFAULT_JOB = (
    "llama3.1-70b", "h100-pod-400g", "default", "default")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", metavar="M", help=f"model name or file (default {DEFAULT_MODEL})")
    p.add_argument("--cluster", metavar="C",
                   help=f"cluster name, file, or inline gpu=NAME,nodes=N[,nic_gbps=B] "
                        f"(default {DEFAULT_CLUSTER})")
    p.add_argument("--plan", metavar="P",
                   help=f"plan name, file or inline key=value list (default {DEFAULT_PLAN})")
    p.add_argument("--job", metavar="J",
                   help="job: catalog name, file, or gbs=N[,seq_len=S] (default: the default job "
                        "when nothing else is given)")
    p.add_argument("--framework", metavar="F",
                   help="framework that runs the plan (catalog/frameworks: megatron-core, fsdp, "
                        "...); overrides the job's")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--trace", metavar="FILE",
                   help="write a Perfetto / Chrome-trace JSON timeline of every rank to FILE")


def run(args: argparse.Namespace) -> int:
    check_output(args.trace, "--trace")
    bare = args.model is None and args.cluster is None and args.plan is None
    model = load_model(args.model or DEFAULT_MODEL)
    cluster = load_cluster(args.cluster or DEFAULT_CLUSTER)
    plan = load_plan(args.plan or DEFAULT_PLAN)
    job_ref = args.job or (DEFAULT_JOB if bare and args.job is None else None)
    job = load_job(job_ref) if job_ref else None
    framework = args.framework or (job.framework if job else None) or None
    profile = resolve(framework, attention=plan.attention or None)
    report = simulate(model, cluster, plan, job, timeline=bool(args.trace), profile=profile,
                      collectives=True)
    band = interval(report.tokens_per_s_per_gpu, framework or "default", bundled_bands(),
                    widen=cluster_widening(cluster))
    if args.trace:
        from hetpar.sim.timeline import write_trace

        assert report.timeline is not None
        write_trace(report.timeline, args.trace)
        print(f"hetpar: wrote {len(report.timeline)} trace events to {args.trace}", file=sys.stderr)
    if args.json:
        data = report.to_dict()
        data.pop("timeline", None)
        data["inputs"] = {"model": model.name, "cluster": cluster.name, "plan": _plan_text(plan),
                          "job": job.name if job else None, "framework": profile.name}
        data["interval_tokens_per_s_per_gpu"] = list(band) if band else None
        json.dump(data, sys.stdout, indent=2)
        print()
    else:
        print(render(report, f"{model.name} on {cluster.name}", plan, band, profile.name))
    return 0


def _plan_text(plan: Plan) -> str:
    if not plan.uniform:
        return f"{plan.name or 'plan'}: {len(plan.replicas)} explicit replicas"
    flags = " sp" if plan.sequence_parallel else ""
    return (f"{plan.name + ' ' if plan.name else ''}[tp={plan.tp} pp={plan.pp} dp={plan.dp} "
            f"cp={plan.cp} vpp={plan.vpp} mbs={plan.micro_batch} gbs={plan.global_batch}{flags} "
            f"{plan.schedule} recompute={plan.recompute} zero={plan.zero} {plan.precision}]")


def render(report: Report, what: str, plan: Plan,
           band: tuple[float, float] | None = None, framework: str = "default") -> str:
    """The human-readable report: figures, memory per rank vs capacity, time breakdown;
    ``band``: the 80% interval of tokens/s per GPU from leave-one-source-out residuals."""
    r = report
    spread = (f"  80% interval          {band[0]:10,.1f} - {band[1]:,.1f} tokens/s per GPU"
              f" (held-out error of {framework} runs)" if band else None)
    lines = [
        f"{what} ({r.num_gpus} GPUs), plan {_plan_text(plan)}",
        "",
        f"  iteration time        {r.iteration_time_s:10.3f} s",
        f"  tokens per iteration  {r.tokens_per_iter:10,d}",
        f"  throughput            {r.tokens_per_s:10,.0f} tokens/s"
        f"  ({r.tokens_per_s_per_gpu:,.1f} per GPU)",
        *([spread] if spread else []),
        f"  framework             {framework:>10s}",
        f"  model TFLOP/s per GPU {r.model_tflops_per_gpu:10.1f}",
        f"  MFU / HFU             {100 * r.mfu:9.1f}% / {100 * r.hfu:.1f}%",
        f"  bottleneck            {r.bottleneck:>10s}",
        f"  out of memory         {'YES' if r.oom else 'no':>10s}",
        "",
        "memory per GPU (GiB)       params   grads   optim   activ   other   total / capacity",
    ]
    for m in _memory_rows(r):
        lines.append(m)
    lines += _expert_lines(r)
    lines += ["", "time breakdown               seconds   share"]
    for k in r.shown_keys():
        v = r.breakdown.get(k, 0.0)
        lines.append(f"  {k:24s} {v:10.3f} {100 * v / r.iteration_time_s:6.1f}%")
    if r.collectives:
        # what NCCL's tuner runs at each communicator's largest message (hetpar.net.nccl)
        lines += ["", "collectives                 ranks  largest bytes  algorithm/protocol"]
        for c in r.collectives:
            size = f"{c.bytes:14,d}" if c.bytes else f"{'-':>14s}"
            lines.append(f"  {c.axis:8s} {c.collective:15s} {c.ranks:5d} {size}  "
                         f"{c.algorithm}/{c.protocol}")
    for n in r.notes:
        lines.append(f"note: {n}")
    return "\n".join(lines)


def _expert_lines(r: Report) -> list[str]:
    """An expert-parallel plan's experts: the all-to-all, its group, the expert memory."""
    e = r.experts
    if e is None:
        return []
    split = e.get("experts_per_rank")  # an uneven split (Plan.experts_per_rank)
    return [
        "",
        f"experts (ep={e['ep']}, etp={e['etp']})",
        f"  all-to-all                {e['all_to_all']}",
        f"  ep group                  {e['ep_group']}",
        f"  experts per GPU           {e['experts_per_gpu']}"
        + (" (slowest replica's busiest rank)" if split else ""),
        *([f"  experts per EP rank       {'/'.join(map(str, split))}"] if split else []),
        f"  slowest rank's load       {e['rank_load']:.2f} x mean",
        f"  expert weights per GPU    {e['expert_weights_gib']:.2f} GiB",
    ]


def _memory_rows(r: Report) -> list[str]:
    rows = r.memory
    shown: list[Any] = list(rows) if len(rows) <= 16 else list(rows[:8]) + [None] + list(rows[-4:])
    out = []
    for m in shown:
        if m is None:
            out.append(f"  ... {len(rows) - 12} more rows (use --json)")
            continue
        d = m.to_dict()
        verdict = "OOM" if m.oom else "ok"
        out.append(
            f"  replica {m.replica:<4d} rank {m.rank:<3d}  {d['params_gib']:7.1f} "
            f"{d['grads_gib']:7.1f} {d['optimizer_gib']:7.1f} {d['activations_gib']:7.1f} "
            f"{d['other_gib']:7.1f} {d['total_gib']:7.1f} / {d['capacity_gib']:5.1f}  {verdict}"
        )
    return out
