"""Measure this cluster's network and write a cluster file of the fitted values.

Without torchrun, `--ranks` ranks are forked on this machine (gloo on CPU, NCCL with --device
cuda), as `hetpar run` forks them. Under torchrun (`torchrun --nnodes M --nproc-per-node N -m
hetpar.cli.main probe ...`) every process is one rank, ranks are grouped into nodes by host
name, and rank 0 writes the files. Sends (half a ping-pong) and all-reduce, all-gather and
reduce-scatter are timed over a geometric sweep of sizes, on one node's ranks (the scale-up
level) and on one rank per node (the network level), each repetition sweeping every size.
Each level's latency and bandwidth are the least-squares fit (of log residuals) of the
simulator's own alpha-beta ring form to the --fit-ops points, each the --statistic of its
repetitions (docs/network.md, "Measure your own cluster"); the cluster file states them with
their spread (the fit of each repetition alone) and each operation's own fit in its comment
block. The raw
collective points are written in `hetpar validate-collectives` format, so a second run checks
the first one's file. With --trace, one all-reduce per level every --interval seconds for
--duration seconds becomes a bandwidth trace that `hetpar replay --cluster FILE` reads.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hetpar.cli import probe_files as files
from hetpar.cli.options import check_output, float_in, int_in
from hetpar.errors import ConfigError
from hetpar.net.fit import OPS, STATISTICS, LevelFit, Point, fit_level

NAME = "probe"
HELP = "measure this cluster's sends and collectives; write a fitted cluster file and raw points"
EXAMPLES = """examples:
  hetpar probe --ranks 2 --gpu A10 --out probe/local.toml      # + probe/local-points.csv
  hetpar validate-collectives probe2/local-points.csv --cluster probe/local.toml
  hetpar probe --ranks 4 --gpu A10 --out probe/local.toml --trace probe/bw.csv --duration 60 \\
      --interval 5
  torchrun --nnodes 2 --nproc-per-node 8 -m hetpar.cli.main probe --device cuda \\
      --gpu H100-SXM5-80GB --out probe/cluster.toml
"""
MIB = 2**20


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", metavar="FILE", default="probe/local.toml",
                   help="cluster file to write (.toml; default probe/local.toml)")
    p.add_argument("--points", metavar="FILE",
                   help="raw collective points, validate-collectives CSV (default: "
                        "<out stem>-points.csv beside --out)")
    p.add_argument("--gpu", metavar="NAME|FILE", required=True,
                   help="catalog GPU or GPU file the nodes have (the probe measures only the "
                        "network; on CPU `hetpar calibrate` writes a GPU file)")
    p.add_argument("--ranks", type=int_in(2, 1024), default=2,
                   help="local ranks to fork (default 2); under torchrun the job's ranks")
    p.add_argument("--device", default="cpu", help="cpu (gloo) or cuda (NCCL); default cpu")
    p.add_argument("--ops", default=",".join(OPS), metavar="OP,...",
                   help=f"operations to time (default {','.join(OPS)})")
    p.add_argument("--fit-ops", default="all_reduce", metavar="OP,...",
                   help="operations whose points the written latency and bandwidth fit "
                        "(default all_reduce, the gradient sync's; each op's own fit is in "
                        "the file's comments)")
    p.add_argument("--min-bytes", type=int_in(1, 2**34), default=8, metavar="B",
                   help="smallest size (default 8)")
    p.add_argument("--max-bytes", type=int_in(1, 2**34), default=32 * MIB, metavar="B",
                   help="largest size (default 32 MiB; the fit needs sizes where bandwidth, "
                        "not latency, decides the time)")
    p.add_argument("--factor", type=int_in(2, 1024), default=4,
                   help="size step of the sweep (default 4: 8 B, 32 B, ... 32 MiB)")
    p.add_argument("--repeats", type=int_in(1, 1000), default=15,
                   help="timed repetitions per size (default 15; the spread is over them)")
    p.add_argument("--statistic", choices=STATISTICS, default="min",
                   help="which repetition stands for a size: min (default: the fabric's "
                        "floor; the slower repetitions time load on the hosts, and the spread "
                        "states it) or median (the typical repetition)")
    p.add_argument("--warmup", type=int_in(0, 1000), default=2,
                   help="untimed calls per size first (default 2)")
    p.add_argument("--trace", metavar="FILE",
                   help="also log bandwidth over time as a replay trace (.csv)")
    p.add_argument("--duration", type=float_in(0, 86400, lo_open=True), metavar="S",
                   help="seconds the --trace covers (default 60)")
    p.add_argument("--interval", type=float_in(0, 3600, lo_open=True), metavar="S",
                   help="seconds between --trace samples (default 5)")
    p.add_argument("--trace-bytes", type=int_in(4, 2**34), metavar="B",
                   help="all-reduce size of each --trace sample (default 4 MiB, at most "
                        "--max-bytes: large enough that bandwidth dominates)")
    p.add_argument("--json", action="store_true", help="print the fit and every point as JSON")


def _ops(text: str, option: str, allowed: tuple[str, ...]) -> tuple[str, ...]:
    items = [o.strip() for o in text.split(",")]
    if len(items) > 1 and (not all(items) or len(set(items)) < len(items)):
        raise ConfigError(f"{option} {text!r}: an empty or repeated operation; give each once")
    got = [o for o in items if o]
    bad = [o for o in got if o not in allowed]
    if bad or not got:
        raise ConfigError(f"{option} {bad[0] if bad else text!r} not allowed; allowed: "
                          f"{', '.join(allowed)}")
    return tuple(o for o in allowed if o in got)


def _check(args: argparse.Namespace) -> dict[str, Any]:
    """Every option, before any measuring (and before torch is imported)."""
    from hetpar.catalog import load_gpu

    if args.device.split(":")[0] not in ("cpu", "cuda"):
        raise ConfigError(f"--device {args.device!r} unknown; allowed: cpu, cuda, cuda:N")
    load_gpu(args.gpu)
    ops = _ops(args.ops, "--ops", OPS)
    fit_ops = _ops(args.fit_ops, "--fit-ops", ops)
    if args.min_bytes >= args.max_bytes:
        raise ConfigError(f"--min-bytes {args.min_bytes} not allowed; allowed: below "
                          f"--max-bytes {args.max_bytes} (the fit needs two sizes)")
    if args.trace is None and any(x is not None for x in
                                  (args.duration, args.interval, args.trace_bytes)):
        raise ConfigError("--duration/--interval/--trace-bytes apply to --trace only; give "
                          "--trace FILE")
    check_output(args.out, "--out", (".toml",))
    points = args.points or str(Path(args.out).with_name(Path(args.out).stem + "-points.csv"))
    check_output(points, "--points", (".csv",))
    check_output(args.trace, "--trace", (".csv",))
    sizes, s = [], args.min_bytes
    while s <= args.max_bytes:
        sizes.append(s)
        s *= args.factor
    gpu = args.gpu if not Path(args.gpu).is_file() else str(Path(args.gpu).resolve())
    return {"ops": ops, "fit_ops": fit_ops, "points": points, "sizes": tuple(sizes),
            "gpu": gpu, "duration": args.duration or 60.0, "interval": args.interval or 5.0,
            "trace_bytes": args.trace_bytes or min(4 * MIB, args.max_bytes)}


def run(args: argparse.Namespace) -> int:
    from hetpar.cli import progress

    opts = _check(args)
    from hetpar.runtime import probe as rp

    sweep = rp.Sweep(ops=opts["ops"], sizes=opts["sizes"], repeats=args.repeats,
                     warmup=args.warmup, device=args.device,
                     trace_duration_s=opts["duration"] if args.trace else 0.0,
                     trace_interval_s=opts["interval"], trace_bytes=opts["trace_bytes"],
                     progress=progress.enabled(args))
    ranks = rp.local_ranks(args.ranks, args.device)
    progress.note(args, f"hetpar probe: timing {', '.join(opts['ops'])} at {len(opts['sizes'])} "
                        f"sizes x {args.repeats} repetitions on {ranks} rank(s)"
                  + (f", then {opts['duration']:g} s of bandwidth trace" if args.trace else ""))
    t0 = time.perf_counter()
    try:
        m = rp.measure(ranks, sweep)
    except rp.NotRankZero:
        return 0  # under torchrun rank 0 writes and reports
    elapsed = time.perf_counter() - t0
    return _report(args, opts, m, elapsed)


def _report(args: argparse.Namespace, opts: dict[str, Any], m: Any, elapsed: float) -> int:
    from hetpar.catalog import load_cluster

    points = [Point(**p, statistic=args.statistic) for p in m.points]
    levels = sorted({p.level for p in points}, key=("scale-up", "network").index)
    fits = {lv: fit_level(points, lv, opts["fit_ops"]) for lv in levels}
    per_op = {lv: _alone(points, lv, opts["ops"]) for lv in levels}
    nodes, per_node = len(m.nodes), len(m.nodes[0])
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    host = socket.gethostname() if nodes == 1 else f"{nodes} hosts"
    what = (f"hetpar probe {when} on {host}: {per_node} rank(s) x {nodes} node(s), "
            f"{m.backend} ({args.device})")
    out, name = Path(args.out), Path(args.out).stem
    doc = files.cluster_doc(name, opts["gpu"], nodes, per_node, fits, what,
                            [what, f"raw points: {opts['points']}"])
    comments = [f"Measured by {what}.",
                "Fit (hetpar/net/fit.py): least squares of log residuals of t = c_lat x "
                "latency + c_bw x bytes / bandwidth (the simulator's ring form; sends: latency "
                f"+ bytes / bandwidth) to each size's {args.statistic} time over "
                f"{args.repeats} repetitions; spread = each repetition fitted alone.",
                *files.fit_lines(fits, per_op),
                f"Check: hetpar validate-collectives POINTS.csv --cluster {out}"]
    files.write(opts["points"], files.points_text(points, name, nodes, what))
    if args.trace:
        files.write(args.trace, files.trace_text(m.samples, fits, per_node, str(out),
                                                 opts["duration"], what))
    files.write(str(out), files.cluster_text(doc, comments))
    load_cluster(str(out))  # the file must load with the strict schema loader
    result = {"cluster_file": str(out), "points_file": opts["points"], "trace_file": args.trace,
              "backend": m.backend, "hosts": list(m.hosts), "nodes": [list(n) for n in m.nodes],
              "seconds": round(elapsed, 3), "fits": {lv: _fit_dict(f) for lv, f in fits.items()},
              "per_op": {lv: {op: _fit_dict(f) for op, f in d.items()} for lv, d in per_op.items()},
              "points": [{"level": p.level, "op": p.op, "ranks": p.ranks,
                          "size_bytes": p.size_bytes, "seconds": list(p.seconds)}
                         for p in points]}
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        _print(result, comments[2:-1], what)
    return 0


def _alone(points: Any, level: str, ops: tuple[str, ...]) -> dict[str, LevelFit | None]:
    """Each operation fitted alone (None: its times do not grow with size, too noisy)."""
    out: dict[str, LevelFit | None] = {}
    for op in ops:
        try:
            out[op] = fit_level(points, level, (op,))
        except ConfigError:
            out[op] = None
    return out


def _fit_dict(f: LevelFit | None) -> dict[str, Any] | None:
    if f is None:
        return None
    return {"ops": list(f.ops), "latency_us": f.latency_s * 1e6,
            "bandwidth_gbps": files.gbps(f.bandwidth_bytes_s), "points": f.points,
            "residual_mape_pct": f.residual_mape_pct, "repetitions": f.repetitions,
            "latency_us_range": [x * 1e6 for x in f.latency_range_s],
            "bandwidth_gbps_range": [files.gbps(x) for x in f.bandwidth_range_bytes_s]}


def _print(r: dict[str, Any], lines: list[str], what: str) -> None:
    wrote = [r["cluster_file"], r["points_file"]] + ([r["trace_file"]] if r["trace_file"] else [])
    print(f"wrote {', '.join(wrote)}")
    print(f"{what}; {len(r['points'])} points in {r['seconds']:.1f} s")
    for line in lines:
        print(line)
    print(f"check with: hetpar validate-collectives {r['points_file']} --cluster "
          f"{r['cluster_file']}" + ("" if "WORLD_SIZE" in os.environ else
                                    " (points of a second run are the fair test)"))
