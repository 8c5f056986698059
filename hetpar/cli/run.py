"""Train a plan on PyTorch distributed (gloo on CPU, NCCL on GPUs) or dry-run it.

Without torchrun, the plan's ranks are forked on this machine (one process per rank, gloo).
Under torchrun (`torchrun --nproc-per-node N -m hetpar.cli.main run ...`) each process is one
rank and the world size must equal the plan's. Data are seeded synthetic tokens, so two runs
of any two plans of the same model and global batch print the same losses (up to rounding).

A forked rank that dies (SIGKILL, the OOM killer) is recovered: the others are stopped, the
plan is degraded per its on_failure (ntp: shrink the hit replica's TP; drop: hand its batch
to the others) and the survivors resume from the last verified checkpoint (docs/runtime.md).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

from hetpar.catalog import load_cluster, load_model, load_plan
from hetpar.cli.options import SEED, check_writable_dir, float_in, int_in

NAME = "run"
HELP = "train a plan with PyTorch distributed (or --dry-run it)"
EXAMPLES = """examples:
  hetpar run --model tiny-llama --plan tp=2,pp=2,gbs=8 --steps 5
  hetpar run --model tiny-gpt --plan dp=2,zero=1,gbs=8 --checkpoint ckpt/ --every 2
  hetpar run --model llama3.1-70b --cluster h100-pod-400g \\
      --plan tp=8,pp=4,dp=4,gbs=256,recompute=full,zero=1 --dry-run     # 128 ranks
  hetpar run --model tiny-llama --plan pp=2,gbs=8,schedule=zb-h1 --pp-engine torch
  hetpar run --model tiny-llama --plan tp=2,dp=2,gbs=8 --steps 400 --checkpoint ck/ --every 10
      # kill -9 one rank: the run continues on 3 ranks from ck/'s last step
"""
KEEP = 3
"""Checkpoint steps kept on disk by default (``--keep``)."""
STEPS = 10
"""Iterations a run trains by default (``--steps``)."""
LR_MAX = 1.0
"""Largest accepted Adam learning rate: Adam moves every weight by about lr per step, and
initial weights are ~0.02, so lr > 1 destroys the model in one step."""



def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", metavar="M", required=True, help="model name or file")
    p.add_argument("--plan", metavar="P", required=True,
                   help="plan name, file or inline key=value list")
    p.add_argument("--cluster", metavar="C",
                   help="cluster name or file (default: one local node of just enough devices)")
    p.add_argument("--steps", type=int_in(1, 10**9), default=None,
                   help="iterations to train (default 10)")
    p.add_argument("--checkpoint", metavar="DIR",
                   help="save sharded checkpoints here and resume from the latest verified one")
    p.add_argument("--every", type=int_in(0, 10**9), default=0, metavar="N",
                   help="checkpoint every N steps (default: only at the end)")
    p.add_argument("--keep", type=int_in(0, 10**9), default=None, metavar="N",
                   help="checkpoint steps kept on disk, newest first (default 3; 0 keeps all)")
    p.add_argument("--on-nan", default="stop", choices=("stop", "skip"),
                   help="a NaN/inf loss stops the run (default) or skips that step's update")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    p.add_argument("--dtype", default="float32", choices=("float32", "float64", "bfloat16"),
                   help="parameter and activation dtype (default float32)")
    p.add_argument("--seed", type=SEED, default=0, help="initialisation and data seed")
    p.add_argument("--lr", type=float_in(0, LR_MAX, lo_open=True), default=1e-3,
                   help=f"Adam learning rate, in (0, {LR_MAX:g}] (default 1e-3)")
    p.add_argument("--pp-engine", default="hetpar", choices=("hetpar", "torch"),
                   help="pipeline executor: hetpar's own, or torch.distributed.pipelining "
                        "(tp = 1 only); both run the plan's schedule action lists")
    p.add_argument("--timeout", type=float_in(0, 86400, lo_open=True), default=60.0,
                   help="collective timeout in seconds (default 60)")
    p.add_argument("--dry-run", action="store_true",
                   help="build groups, assign stages, check memory; run nothing")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def _check_options(args: argparse.Namespace) -> None:
    """Option ranges, checked before anything is loaded or forked."""
    from hetpar.errors import ConfigError

    if args.keep is not None and not args.checkpoint:
        print(f"hetpar: warning: --keep {args.keep} applies only with --checkpoint DIR; "
              "ignored (no checkpoints are saved)", file=sys.stderr)
    args.keep = KEEP if args.keep is None else args.keep
    if args.steps is not None and args.dry_run:
        print(f"hetpar: warning: --steps {args.steps} applies to a run; --dry-run trains no "
              "step", file=sys.stderr)
    args.steps = STEPS if args.steps is None else args.steps
    if args.steps < 1:
        raise ConfigError(f"--steps must be >= 1, got {args.steps}")
    if args.every < 0 or args.keep < 0:
        raise ConfigError(f"--every and --keep must be >= 0, got {args.every} and {args.keep}")
    if not (math.isfinite(args.lr) and 0 < args.lr <= LR_MAX):
        raise ConfigError(f"--lr must be a number in (0, {LR_MAX:g}], got {args.lr}")
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        raise ConfigError(f"--timeout must be a positive number of seconds, got {args.timeout}")
    if not 0 <= args.seed < 2**63:
        raise ConfigError(f"--seed must be in [0, 2**63), got {args.seed}")
    if args.device.split(":")[0] not in ("cpu", "cuda"):  # --dry-run too: it checks memory
        raise ConfigError(f"--device {args.device!r} unknown; allowed: cpu, cuda, cuda:N")
    if args.every and not args.checkpoint:
        print(f"hetpar: warning: --every {args.every} applies only with --checkpoint DIR; "
              "ignored (no checkpoints are saved)", file=sys.stderr)
    if args.checkpoint:  # a dry run checks it too: the run it stands for would write there
        check_writable_dir(Path(args.checkpoint), "--checkpoint")


def run(args: argparse.Namespace) -> int:
    from hetpar.errors import ConfigError

    _check_options(args)
    if not args.dry_run:
        from hetpar.runtime import faults, torchrun

        faults.spec()  # a malformed HETPAR_FAULT is refused before torch loads (seconds)
        if torchrun.under_torchelastic():
            # before any thread exists: the agent's SIGTERM must reach the marking thread
            torchrun.watch_sigterm()
    model = load_model(args.model)
    plan = load_plan(args.plan)
    cluster = load_cluster(args.cluster) if args.cluster else None
    from hetpar.runtime.layout import check_buildable

    check_buildable(model)  # before any plan or memory verdict: it would train another model
    if args.dry_run:
        from hetpar.runtime.dryrun import dry_run

        d = dry_run(model, plan, cluster)
        host = _host_memory(model, plan, cluster, args)
        if args.json:
            print(json.dumps(d.to_dict() | ({"host_memory": host} if host else {}), indent=2))
        else:
            _print_dry(d)
            if host:
                print(host)
        return 0
    import torch

    if args.device.startswith("cuda") and torch.cuda.device_count() < 1:
        raise ConfigError(f"--device {args.device}: no CUDA device here; allowed: cpu")
    from hetpar.runtime.api import run as run_plan
    from hetpar.runtime.launch import LaunchError
    from hetpar.runtime.optim import AdamConfig
    from hetpar.runtime.worker import RunConfig

    _host_memory(model, plan, cluster, args)
    cfg = RunConfig(dtype=getattr(torch, args.dtype), seed=args.seed,
                    adam=AdamConfig(lr=args.lr), timeout_s=args.timeout, device=args.device,
                    pp_engine=args.pp_engine, on_nan=args.on_nan, keep=args.keep)
    try:
        summary = run_plan(model, plan, steps=args.steps, cluster=cluster,
                           checkpoint=args.checkpoint, every=args.every, cfg=cfg,
                           # step lines and recovery messages are the run's log on stderr,
                           # not a progress bar: only --quiet silences them
                           progress=not getattr(args, "quiet", False))
    except LaunchError as e:
        print(_launch_failure(str(e)), file=sys.stderr)
        return 1
    if not summary.reports:
        return 0  # under torchrun only the group's rank 0 reports
    if args.json:
        print(json.dumps(summary.to_dict(), indent=2))
    else:
        # Per-step losses went to stderr as the run progressed; stdout gets the summary.
        if not summary.losses:
            print(f"{summary.world_size} ranks, nothing to train (at step {args.steps})")
            return 0
        last = f", final loss {summary.losses[-1]:.6f}"
        print(f"{summary.world_size} ranks, steps {summary.first_step}..{args.steps - 1}"
              f"{last}, median step {summary.median_step_s:.4f} s"
              + (f", {len(summary.recoveries)} rank failure(s) recovered"
                 if summary.recoveries else ""))
    return 0


def _launch_failure(text: str) -> str:
    """One line for a failed launch; a rank's traceback (a bug) follows it, asking for a report."""
    import re

    lines = text.splitlines()
    exc = next((ln for ln in lines if re.match(r"[A-Za-z_][\w.]*(Error|Exception)\b", ln)), "")
    head = f"hetpar: run failed: {lines[0]}" + (f" {exc}" if exc else "")
    if len(lines) == 1:
        return head
    return head + "\n(rank tracebacks follow; please report this as a bug)\n" + text


def _host_memory(model: object, plan: object, cluster: object,
                 args: argparse.Namespace) -> str:
    """Refuse (Infeasible) when the forked ranks' state cannot fit in this host's memory
    (CPU ranks) or in the free memory of this host's GPUs (``--device cuda``)."""
    if cluster is not None or "WORLD_SIZE" in os.environ:
        return ""  # ranks on other hosts: the simulator's memory check applies
    from hetpar.runtime.dryrun import check_device_memory, check_host_memory
    from hetpar.runtime.layout import build_layout

    layout = build_layout(plan, model, None)  # type: ignore[arg-type]
    size = {"float32": 4, "float64": 8, "bfloat16": 2}[args.dtype]
    if args.device.startswith("cpu"):
        return check_host_memory(layout, size, args.dtype)
    import torch

    n = torch.cuda.device_count()
    if n < 1:
        return ""  # refused with a clearer message by the --device check
    free = [torch.cuda.mem_get_info(i)[0] for i in range(n)]
    return check_device_memory(layout, size, args.dtype, free)


def _print_dry(d: object) -> None:
    from hetpar.runtime.dryrun import DryRun

    assert isinstance(d, DryRun)
    print(f"world size {d.world_size}, {len(d.replicas)} replica(s); process groups: "
          + ", ".join(f"{k} {v}" for k, v in d.groups.items()))
    for r in d.replicas[:8]:
        st = " | ".join(f"L{s['layers'][0]}-{s['layers'][1]} tp{s['tp']} ranks "
                        f"{s['ranks'][0]}..{s['ranks'][-1]}" for s in r["stages"])
        print(f"  replica {r['replica']} batch {r['batch']}: {st}")
    if len(d.replicas) > 8:
        print(f"  ... {len(d.replicas) - 8} more replicas")
    print(f"memory ({d.memory_source}):")
    for row in d.memory[:16]:
        print("  " + ", ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}"
                              for k, v in row.items()))
    print("fits" if not d.oom else "OUT OF MEMORY", file=sys.stdout)
