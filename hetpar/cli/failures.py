"""Throughput of a training job on a cluster with failing GPUs, under every failure policy.

Two analyses. The sweep places a fraction of failed GPUs at random (many placements each) and
gives the mean throughput loss of every policy; the Monte Carlo draws failures and repairs
from published rates for --days and gives throughput over time, goodput after restarts, the
distribution of the loss and the spare scale-up domains each policy needs to keep the global
batch. Policies: drop (drop any replica holding a failed GPU), drop-packed (first pack failed
domains into as few replicas as possible), spare (swap in hot spare domains), checkpoint
(restart the full plan, pausing until enough domains are up), ntp (nonuniform tensor
parallelism: degraded replicas run at lower TP with a smaller batch share) and ntp-boost (NTP
with power-boosted degraded domains). Failure units are the plan's TP groups.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

import numpy as np

from hetpar.catalog import load_cluster, load_model, load_plan
from hetpar.cli import failures_experts, progress
from hetpar.cli.options import SEED, WORKERS, WORKERS_HELP, check_output, float_in, int_in
from hetpar.errors import ConfigError, Infeasible
from hetpar.failures import analysis as A
from hetpar.failures.montecarlo import MonteCarloResult, RestartCost
from hetpar.failures.montecarlo import run as run_mc
from hetpar.failures.ntp_plan import degraded_plan, write_plan
from hetpar.failures.policies import PolicyConfig
from hetpar.failures.power import PowerCurve
from hetpar.failures.rates import FailureRates, load_rates, preset_names
from hetpar.failures.sweep import SweepResult, sweep
from hetpar.io import parse_float
from hetpar.specs.plan import Plan
from hetpar.workers import SERIAL, Pool, open_pool

NAME = "failures"
WRITE_POLICIES = ("ntp", "ntp-boost", "drop-packed")
FAILED_FRACTION = 0.004
MAX_DAYS = 3650.0  # ten years; the Monte Carlo keeps every failure and repair event
HELP = "throughput under GPU failures: drop, spares, checkpoint-restart, NTP, NTP + power boost"
EXAMPLES = f"""examples:
  hetpar failures                       # the NTP paper's setting: ntp-480b on b200-nvl32-32k
  hetpar failures --days 60 --rates meta-rsc1 --plot failures.png
  hetpar failures --model llama3.1-70b --cluster h100-pod-400g --plan tp=8,pp=4,dp=32,gbs=512
  hetpar failures --policy drop-packed,ntp --samples 0 --json   # Monte Carlo only
  hetpar failures --days 365 --samples 1000 --workers 2   # same numbers as --workers 1
  hetpar failures --write-plan ntp.toml --failed-fraction 0.004 && hetpar simulate --plan ntp.toml
  hetpar failures --model mixtral-8x7b --cluster h100-pod-400g \\
      --plan tp=2,pp=8,dp=8,ep=8,gbs=256,sp=true,recompute=full   # EP: re-place or drop
  hetpar failures --model mixtral-8x7b --cluster mixed-a100-h100 \\
      --plan mixtral-a100-h100.toml   # explicit EP replicas: each distinct replica fails once

rate presets: {', '.join(preset_names())} (or a TOML file of the same form)
"""


def _floats(text: str, option: str) -> tuple[float, ...]:
    try:  # the one strict parser (hetpar.io): finite ASCII numbers
        out = tuple(parse_float(x, option) for x in text.split(",") if x.strip())
    except ConfigError:
        raise ConfigError(f"{option} {text!r}: expected comma-separated finite numbers") from None
    if not out:  # '' would silently stand for the default
        raise ConfigError(f"{option} {text!r}: gives no number; give at least one or leave "
                          "the option out")
    if len(out) != len(text.split(",")) or len(set(out)) < len(out):  # "0.1,", "0.1,0.1"
        raise ConfigError(f"{option} {text!r}: an empty or repeated value; give each once")
    return out


def _curve(text: str, max_power: float) -> PowerCurve:
    if not text:
        return PowerCurve(max_power=max_power)
    try:
        pts = [tuple(_strict(v) for v in x.split(":")) for x in text.split(",") if x.strip()]
        power, perf = zip(*pts, strict=True)
        if not all(map(math.isfinite, power + perf)):
            raise ValueError(text)
    except ValueError:
        raise ConfigError(f"--power-curve {text!r}: expected POWER:SPEED,... pairs") from None
    return PowerCurve(power=(1.0, *power), perf=(1.0, *perf), max_power=max_power)


def _strict(text: str) -> float:
    try:
        return parse_float(text, "--power-curve")
    except ConfigError:
        raise ValueError(text) from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="ntp-480b", help="model name or file (default ntp-480b)")
    p.add_argument("--cluster", default="b200-nvl32-32k",
                   help="cluster name, file, or inline gpu=NAME,nodes=N[,nic_gbps=B]")
    p.add_argument("--plan", default=A.PAPER_PLAN, help=f"uniform plan (default {A.PAPER_PLAN})")
    p.add_argument("--rates", default="llama3", help="failure-rate preset or file (default llama3)")
    p.add_argument("--rate-scale", type=float_in(0, 1e6), default=1.0,
                   help="multiply every failure rate")
    p.add_argument("--blast-radius", type=int_in(1, 1 << 20), default=None,
                   help="GPUs one failure takes down (aligned block, e.g. a 4-GPU tray); "
                        "default: the rates file's (1 in the presets)")
    p.add_argument("--days", type=float_in(0, MAX_DAYS), default=30.0,
                   help="Monte Carlo days (0: skip; at most 3650)")
    p.add_argument("--warmup-days", type=float_in(0, MAX_DAYS), default=0.0,
                   help="simulate failures this long before day 0 (default 0: start with none)")
    p.add_argument("--policy", default="all", help="comma list of policies (default all)")
    p.add_argument("--seed", type=SEED, default=0, help="random seed (results are deterministic)")
    p.add_argument("--spares", type=int_in(0, 1 << 20), default=0,
                   help="extra hot spare units (default 0)")
    p.add_argument("--fractions", default="0.0005,0.001,0.002,0.003,0.004",
                   help="failed-GPU fractions for the sweep")
    p.add_argument("--samples", type=int_in(0, 100_000), default=100,
                   help="placements per fraction (0: skip)")
    p.add_argument("--ntp-degrees", default=None, help="reduced TP degrees NTP may use, e.g. 30,28")
    p.add_argument("--boost-max", type=float_in(1, 10), default=1.3,
                   help="highest boost power multiplier")
    p.add_argument("--power-curve", default="",
                   help="speed vs power points after (1,1), e.g. 1.1:1.07,1.2:1.12 (default: "
                        "the NTP paper's perf/W figures)")
    p.add_argument("--boost-fraction", type=float_in(0, 1), default=1.0,
                   help="most units boosted at once, as a fraction of the plan's units")
    p.add_argument("--restart-s", type=float_in(0, 1e7), default=600.0,
                   help="job restart time, seconds")
    p.add_argument("--checkpoint-write-s", type=float_in(0, 1e7), default=30.0,
                   help="checkpoint stall, s")
    p.add_argument("--checkpoint-interval-s", type=float_in(0, 1e9, lo_open=True), default=None,
                   help="checkpoint interval (default: Young's optimum)")
    p.add_argument("--cost", choices=A.COSTS, default="sim",
                   help="replica cost model: the simulator or closed forms (default sim)")
    p.add_argument("--workers", type=WORKERS, default=SERIAL, metavar="N|ray[:ADDRESS]",
                   help=WORKERS_HELP + ": sweep placements and Monte Carlo policies are "
                   "spread over them (default 1: this process)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--plot", metavar="FILE", help="write a figure (.png, .svg, .pdf)")
    p.add_argument("--write-plan", metavar="FILE",
                   help="write the degraded cluster's explicit plan (TOML or JSON)")
    p.add_argument("--write-policy", choices=WRITE_POLICIES,
                   help="the policy of --write-plan's plan (default ntp)")
    p.add_argument("--failed-fraction", type=float_in(0, 1, hi_open=True),
                   help="failed GPUs (random, --seed) for --write-plan, >= 0 and < 1 "
                        f"(default {FAILED_FRACTION})")


def run(args: argparse.Namespace) -> int:
    policies = A.parse_policies(args.policy)
    check_output(args.plot, "--plot", (".png", ".svg", ".pdf"))
    check_output(args.write_plan, "--write-plan", (".toml", ".json"))
    for opt, given in (("--write-policy", args.write_policy),
                       ("--failed-fraction", args.failed_fraction)):
        if given is not None and not args.write_plan:
            print(f"hetpar: warning: {opt} {given} applies only with --write-plan; ignored",
                  file=sys.stderr)
    fractions = _floats(args.fractions, "--fractions")
    if not fractions or any(not 0.0 <= f <= 1.0 for f in fractions):
        raise ConfigError(f"--fractions {args.fractions!r}: allowed: numbers in 0..1")
    raw = () if args.ntp_degrees is None else _floats(args.ntp_degrees, "--ntp-degrees")
    if any(x < 1 or x != int(x) for x in raw):
        raise ConfigError(f"--ntp-degrees {args.ntp_degrees!r}: allowed: integers >= 1")
    degrees = tuple(int(x) for x in raw)
    config = PolicyConfig(degrees=degrees, curve=_curve(args.power_curve, args.boost_max),
                          boost_fraction=args.boost_fraction)
    model, cluster, plan = load_model(args.model), load_cluster(args.cluster), load_plan(args.plan)
    if plan.degree("ep") > 1:
        return failures_experts.run(model, cluster, plan, args)
    rates = load_rates(args.rates)
    if args.rate_scale != 1.0:
        rates = rates.scaled(args.rate_scale)
    if args.blast_radius:
        rates = rates.with_blast(args.blast_radius)
    s = A.make_setup(model, cluster, plan, config=config, cost=args.cost, spares=args.spares)
    out: dict[str, Any] = {"setup": A.setup_dict(s, rates)}
    degraded = _degraded(s, args) if args.write_plan else None  # refused before the analyses
    with open_pool(args.workers) as pool:
        sw, mc = _analyses(s, rates, policies, fractions, args, pool, out)
    if degraded is not None:
        write_plan(degraded[0], args.write_plan)
        out["written_plan"] = degraded[1]
    if args.plot:
        from hetpar.failures.plot import plot

        plot(args.plot, sw, mc)
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print(_text(out))
    return 0


def _analyses(s: A.Setup, rates: FailureRates, policies: tuple[str, ...],
              fractions: tuple[float, ...], args: argparse.Namespace, pool: Pool,
              out: dict[str, Any]) -> tuple[SweepResult | None, MonteCarloResult | None]:
    """The sweep and the Monte Carlo (each unless skipped), their results added to ``out``."""
    sw = mc = None
    if args.samples:
        with progress.bar(args, len(fractions) * args.samples, "sweep: failure placements",
                          unit="placement") as bar:
            sw = sweep(s.ev, fractions, samples=args.samples, seed=args.seed,
                       policies=policies, pool_units=s.pool_units, block=args.blast_radius or 1,
                       tick=bar.update, pool=pool)
        out["sweep"] = A.sweep_dict(s, sw)
    if args.days:
        cost = RestartCost(restart_s=args.restart_s, checkpoint_write_s=args.checkpoint_write_s,
                           checkpoint_interval_s=args.checkpoint_interval_s)
        with progress.bar(args, len(policies), f"monte carlo: {args.days:g} days of "
                          f"{rates.name} failures", unit="policy") as bar:
            mc = run_mc(s.ev, rates, days=args.days, seed=args.seed, policies=policies,
                        pool_units=s.pool_units, cost=cost, warmup_days=args.warmup_days,
                        tick=bar.update, pool=pool)
        out["monte_carlo"] = A.mc_dict(mc)
    return sw, mc


def _degraded(s: A.Setup, args: argparse.Namespace) -> tuple[Plan, dict[str, Any]]:
    """The plan --write-plan writes, and its summary line's figures."""
    fraction = FAILED_FRACTION if args.failed_fraction is None else args.failed_fraction
    policy = args.write_policy or "ntp"
    rng = np.random.default_rng(args.seed)
    gpus = s.pool_units * s.lay.tp
    failed = np.zeros(gpus, dtype=bool)
    failed[rng.choice(gpus, size=round(fraction * gpus), replace=False)] = True
    try:
        p = degraded_plan(s.model, s.plan, s.ev, failed, policy)
    except Infeasible as e:
        raise ConfigError(f"--failed-fraction {fraction:g}: {e.reason} (--seed {args.seed}); "
                          "allowed: a smaller fraction") from None
    return p, {"path": args.write_plan, "policy": policy, "failed_gpus": int(failed.sum()),
               "replicas": len(p.replicas), "global_batch": p.batch}


def _text(out: dict[str, Any]) -> str:
    st = out["setup"]
    lines = [
        f"{st['model']} on {st['cluster']} ({st['cost_model']} cost model): "
        f"{st['replicas']} replicas x {st['units_per_replica']} units of TP{st['tp']} "
        f"(scale-up domain {st['domain_size']}, {st['domains_per_replica']:g} domains/replica), "
        f"pool {st['pool_units']} units",
        f"iteration {st['iteration_s']:.3f} s; NTP batch share at TP t (of "
        f"{st['batch_per_replica']}): {st['ntp_batch']}; boost power to keep pace: "
        + ", ".join(f"TP{t}: {'-' if v is None else f'{v:.3f}x'}"
                    for t, v in st["boost_power"].items()),
    ]
    if "rates" in st:
        r = st["rates"]
        lines.append(f"rates {r['name']}: {r['per_gpu_day']:.3g} failures/GPU/day, "
                     f"mean failed fraction {100 * r['mean_failed_fraction']:.3f}%")
    if "sweep" in out:
        sw = out["sweep"]
        pols = list(sw["loss"])
        lines += ["", "throughput loss (%) vs failed GPUs (mean of "
                  f"{sw['samples']} random placements)",
                  f"{'failed %':>9} {'healthy':>8} {'(1-p)^n':>8} " + " ".join(
                      f"{p:>11}" for p in pols)]
        for i, f in enumerate(sw["fractions"]):
            lines.append(f"{100 * f:>9.3f} {sw['healthy_units'][i]:>8.4f} "
                         f"{sw['healthy_units_closed_form'][i]:>8.4f} " + " ".join(
                             f"{100 * sw['loss'][p][i]:>11.2f}" for p in pols))
    if "monte_carlo" in out:
        mc = out["monte_carlo"]
        lines += ["", f"monte carlo: {mc['days']:g} days, {mc['failures']} failures, failed "
                  f"fraction mean {100 * mc['failed_fraction_mean']:.3f}% max "
                  f"{100 * mc['failed_fraction_max']:.3f}%, checkpoint every "
                  f"{mc['checkpoint_interval_s'] / 60:.1f} min",
                  f"{'policy':>12} {'throughput':>10} {'goodput':>8} {'loss p50':>8} "
                  f"{'p99':>6} {'max':>6} {'spares needed':>13}"]
        for p, x in mc["policies"].items():
            q = x["loss_percentiles"]
            sp = "-" if x["spares_needed"] is None else str(x["spares_needed"])
            lines.append(f"{p:>12} {x['mean_throughput']:>10.4f} {x['goodput']:>8.4f} "
                         f"{100 * q['p50']:>7.2f}% {100 * q['p99']:>5.2f}% "
                         f"{100 * q['p100']:>5.2f}% {sp:>13}")
            if x["boosted_max"]:
                lines.append(f"{'':>12} boosted up to {x['boosted_max']} units, on average "
                             f"+{x['boost_power_gpus']:.1f} nominal GPU powers")
    if "written_plan" in out:
        w = out["written_plan"]
        lines += ["", f"wrote {w['policy']} plan for {w['failed_gpus']} failed GPUs to "
                  f"{w['path']}: {w['replicas']} replicas, global batch {w['global_batch']}"]
    return "\n".join(lines)
