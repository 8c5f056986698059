"""Search for the best hybrid-parallel plan of a model on a (heterogeneous) cluster.

The planner enumerates the search space (a bundled name or a TOML file), prunes with named
rules (tier capacity, divisibility, budget, memory, a throughput upper bound), evaluates
the survivors best-first with the simulator on worker processes, and prints the ranked
plans with their reports and why the best one won. With --out DIR each plan is written as
a TOML file that `hetpar simulate --plan FILE` loads unchanged. If no plan fits, it says
why, names the closest candidate and what it lacks, and exits with code 2.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from hetpar.catalog import gpu_spec, load_cluster, load_job, load_model
from hetpar.cli import progress
from hetpar.cli.options import WORKERS, WORKERS_HELP, check_output, float_in, int_in
from hetpar.errors import ConfigError, Infeasible
from hetpar.export.files import write_atomic
from hetpar.io import dump_toml, to_dict
from hetpar.search import Objective, SearchResult, load_space, search
from hetpar.search.explain import explain, idle
from hetpar.search.objectives import OBJECTIVES, load_prices, parse_prices
from hetpar.search.robust import Uncertainty, interval, p_beats, robust_score
from hetpar.search.space import space_names

NAME = "plan"
HELP = "search for the fastest (or cheapest) plan, including non-uniform plans"
EXAMPLES = """examples:
  hetpar plan --model llama3.1-70b --cluster mixed-a100-h100 --job default --top 3
  hetpar plan --model llama3.1-8b --cluster gpu=H100-SXM5-80GB,nodes=2,nic_gbps=400 --job gbs=64
  hetpar plan --model llama3.1-8b --cluster mixed-a100-h100 --job default --report plans.html
  hetpar plan --model llama3.1-70b --cluster hetero-1024 --job default --workers 2 --out plans/
  hetpar simulate --model llama3.1-70b --cluster hetero-1024 --job default --plan plans/plan-1.toml
  hetpar plan --model llama3.1-8b --cluster mixed-a100-h100 --job default --objective cost \\
      --price H100=2.5,A100=1.2 --json
  hetpar plan --model llama3.1-8b --cluster mixed-a100-h100 --job default \\
      --objective min_gpus --target 200000
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", metavar="M", required=True, help="model name or file")
    p.add_argument("--cluster", metavar="C", required=True,
                   help="cluster name, file, or inline gpu=NAME,nodes=N[,nic_gbps=B]")
    p.add_argument(
        "--job", metavar="J", default="default",
        help="job: catalog name, file, or gbs=N[,seq_len=S] (default: default)"
    )
    p.add_argument(
        "--space",
        metavar="S",
        default="default",
        help=f"search space: {', '.join(space_names())} or a TOML file",
    )
    p.add_argument(
        "--objective",
        choices=OBJECTIVES,
        default="throughput",
        help="throughput (default), cost (tokens per $), budget (needs --budget), "
        "min_gpus (needs --target), robust (smallest worst loss to the best plan under "
        "alternative network models: per-GPU ring, hierarchical, ring, tree, scale-out at "
        "60%%, or the space's network_models; then the highest 10%% quantile of tokens/s "
        "under cost-model error: network bandwidth +-50%%, compute efficiency +-15%%, and "
        "the simulator's own interval)",
    )
    p.add_argument("--price", metavar="GPU=USD,...", help="$/GPU-hour, e.g. H100=2.5,A100=1.2")
    p.add_argument("--prices", metavar="FILE", help="TOML of $/GPU-hour (default: bundled)")
    p.add_argument(
        "--budget", type=float_in(0, lo_open=True), metavar="USD",
        help="$/hour limit for --objective budget"
    )
    p.add_argument(
        "--target", type=float_in(0, lo_open=True), metavar="TOK_S",
        help="tokens/s for --objective min_gpus"
    )
    p.add_argument(
        "--sim-interval", type=float_in(0, 1, hi_open=True), metavar="W",
        default=Uncertainty().sim_interval,
        help="relative half-width of the simulator's 80%% prediction interval, used for the "
        "intervals, P(#1 beats #2) and --objective robust when the simulator gives none "
        "(default %(default)s: the validation set's 7.6%% MAPE as normal errors)",
    )
    p.add_argument("--top", type=int_in(1, 1000), default=5, metavar="K",
                   help="plans to show (default 5)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--out", metavar="DIR", help="write plan-1.toml ... plan-K.toml into DIR")
    p.add_argument("--report", metavar="FILE",
                   help="write an HTML report of the ranked plans (timeline of the best)")
    p.add_argument(
        "--workers", type=WORKERS, metavar="N|ray[:ADDRESS]",
        help=WORKERS_HELP + " (default: os.cpu_count() processes)",
    )
    p.add_argument("--ray", metavar="ADDRESS", help="same as --workers ray:ADDRESS")


def _objective(args: argparse.Namespace, gpus: list[str]) -> Objective:
    prices: tuple[tuple[str, float], ...] = ()
    if args.objective in ("cost", "budget"):
        prices = load_prices(args.prices)
        if args.price:
            given = parse_prices(args.price)
            _warn_unmatched(given, gpus)
            prices = prices + given  # later entries win: command line
    elif args.price or args.prices:
        _warn(f"--objective {args.objective} does not use prices; --price/--prices ignored")
    # --budget also caps --objective cost; --target only means something to min_gpus
    if args.budget is not None and args.objective not in ("budget", "cost"):
        _warn(f"--objective {args.objective} does not use a budget; --budget {args.budget:g} "
              "ignored (it applies to --objective budget or cost)")
    if args.target is not None and args.objective != "min_gpus":
        _warn(f"--objective {args.objective} does not use a target; --target {args.target:g} "
              "ignored (it applies to --objective min_gpus)")
    return Objective(
        name=args.objective,
        prices=prices,
        budget_per_hour=args.budget,
        target_tokens_per_s=args.target,
        uncertainty=Uncertainty(sim_interval=args.sim_interval),
    )


def _warn(msg: str) -> None:
    print(f"hetpar: warning: {msg}", file=sys.stderr)


def _warn_unmatched(given: tuple[tuple[str, float], ...], gpus: list[str]) -> None:
    """A misspelt GPU in --price would silently leave the bundled price in force."""
    for key, _ in given:
        if not any(key == g or key.lower() in g.lower() for g in gpus):
            _warn(f"--price {key!r} matches no GPU of the cluster ({', '.join(gpus)}); ignored")


def run(args: argparse.Namespace) -> int:
    check_output(args.report, "--report")
    if args.out and Path(args.out).exists() and not Path(args.out).is_dir():
        raise ConfigError(f"--out: {args.out} exists and is not a directory")
    check_output(args.out and str(Path(args.out) / "plan-1.toml"), "--out")
    model, cluster = load_model(args.model), load_cluster(args.cluster)
    gpus = sorted({gpu_spec(g.gpu).name for g in cluster.node_groups})
    job, space = load_job(args.job), load_space(args.space)
    objective = _objective(args, gpus)
    try:
        result = search(
            model,
            cluster,
            job,
            space,
            objective=objective,
            workers=args.workers.processes if args.workers else None,
            top=args.top,
            ray_address=args.ray or (args.workers.ray_address if args.workers else None),
            progress=progress.enabled(args),
        )
    except Infeasible as e:
        print(
            f"hetpar plan: no plan for {model.name} on {cluster.name}: {e.reason}", file=sys.stderr
        )
        return 2
    if objective.name == "min_gpus" and not result.ranked[0].score[0]:
        fastest = max(result.evaluated, key=lambda r: (r.evaluation.tokens_per_s, r.key))
        print(
            f"hetpar plan: --target {args.target:,.0f} tokens/s is above what any plan "
            f"reaches on {cluster.name}; the fastest found reaches "
            f"{fastest.evaluation.tokens_per_s:,.0f} tokens/s ({fastest.plan.name})",
            file=sys.stderr,
        )
        return 2
    files = _write(result, Path(args.out)) if args.out else []
    if args.report:
        from hetpar.cli.report import write_plans_report

        ranked = [(f"#{i} {r.plan.name or r.key}", r.plan) for i, r in enumerate(result.ranked, 1)]
        write_plans_report(args.report, model, cluster, job, ranked)
        print(f"hetpar: wrote the HTML report {args.report}", file=sys.stderr)
    if args.json:
        json.dump(_as_json(result, files, model.name, cluster.name, job.name), sys.stdout, indent=2)
        print()
    else:
        print(_render(result, f"{model.name} on {cluster.name} ({cluster.num_gpus} GPUs)", files))
    return 0


def _write(result: SearchResult, out: Path) -> list[str]:
    """Each ranked plan as TOML, written as one set: every file atomically (temp file +
    rename), then the plan-N.toml files of an earlier, longer run removed, so that a
    `report --plans-dir` of the folder never mixes two searches."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out: {out} exists and is not a directory")
    files: list[tuple[Path, str]] = []
    for i, r in enumerate(result.ranked, 1):
        text = f"# hetpar plan #{i}: {r.evaluation.tokens_per_s:,.0f} tokens/s predicted\n"
        files.append((out / f"plan-{i}.toml", text + dump_toml(to_dict(r.plan))))
    write_atomic(files)
    stale = [p for p in out.glob("plan-*.toml")
             if re.fullmatch(r"plan-\d+\.toml", p.name) and p not in {f for f, _ in files}]
    for p in stale:
        p.unlink()
    gone = f" (removed {len(stale)} stale plan files of an earlier run)" if stale else ""
    print(f"hetpar: wrote {len(files)} plan{'' if len(files) == 1 else 's'} to {out}/{gone}",
          file=sys.stderr)
    return [str(p) for p, _ in files]


def _as_json(
    result: SearchResult, files: list[str], model: str, cluster: str, job: str
) -> dict[str, Any]:
    plans = []
    u = result.objective.uncertainty
    for i, r in enumerate(result.ranked):
        lo, hi = interval(r.evaluation, u)
        plans.append(
            {
                "rank": i + 1,
                "name": r.plan.name,
                "score": list(r.score),
                "gpus": r.gpus,
                "price_per_hour": r.price_per_hour,
                "upper_bound_tokens_per_s": r.bound,
                "interval_80_tokens_per_s": [round(lo, 1), round(hi, 1)],
                "robust_tokens_per_s": round(robust_score(r.evaluation, u), 1),
                "network_models_tokens_per_s": {n: round(t, 1) for n, t in r.alternatives},
                "file": files[i] if files else None,
                "report": r.evaluation.report
                or {
                    "tokens_per_s": r.evaluation.tokens_per_s,
                    "iteration_time_s": r.evaluation.iteration_time_s,
                },
                "plan": to_dict(r.plan),
            }
        )
    return {
        "inputs": {"model": model, "cluster": cluster, "job": job},
        "objective": result.objective.describe(),
        "why": explain(result),
        "idle_gpus": result.cluster_gpus - result.ranked[0].gpus,
        "idle_reason": idle(result),
        "p_first_beats_second": (
            round(p_beats(result.ranked[0].evaluation, result.ranked[1].evaluation, u), 4)
            if len(result.ranked) > 1 else None
        ),
        "plans": plans,
        "stats": result.stats.to_dict(),
    }


def _render(result: SearchResult, what: str, files: list[str]) -> str:
    lines = [
        f"{what}: {result.objective.describe()}",
        "",
        "  #   tokens/s   80% interval        per GPU   MFU  GPUs   $/hour  iter s  bottleneck"
        "  plan",
    ]
    u = result.objective.uncertainty
    for i, r in enumerate(result.ranked, 1):
        ev = r.evaluation
        lo, hi = interval(ev, u)
        price = f"{r.price_per_hour:8.2f}" if r.price_per_hour else "       -"
        lines.append(
            f"  {i:<2d}{ev.tokens_per_s:10,.0f} {_short(lo):>8s}-{_short(hi):<8s} "
            f"{ev.tokens_per_s / r.gpus:8,.1f} {ev.mfu:5.1%} "
            f"{r.gpus:5d} {price} {ev.iteration_time_s:7.2f}  {ev.bottleneck:10s}  {r.plan.name}"
        )
    lines += ["", "why #1 won:"] + [f"  {x}" for x in explain(result)]
    lines += ["", "search: " + result.stats.summary().replace("\n", "\n        ")]
    if files:
        lines += ["", "plans written: " + ", ".join(files)]
    return "\n".join(lines)


def _short(x: float) -> str:
    """1234567 -> '1.23M', 45678 -> '45.7k' (the interval column stays narrow)."""
    if x >= 1e6:
        return f"{x / 1e6:.3g}M"
    if x >= 1e3:
        return f"{x / 1e3:.3g}k"
    return f"{x:.3g}"
