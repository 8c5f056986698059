"""Train a plan on PyTorch distributed (gloo on CPU, NCCL on GPUs) or dry-run it.

Without torchrun, the plan's ranks are forked on this machine (one process per rank, gloo).
Under torchrun (`torchrun --nproc-per-node N -m hetpar.cli.main run ...`) each process is one
rank and the world size must equal the plan's. Data are seeded synthetic tokens, so two runs
of any two plans of the same model and global batch print the same losses (up to rounding).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from hetpar.catalog import load_cluster, load_model, load_plan
from hetpar.cli import progress
from hetpar.cli.options import SEED, float_in, int_in

NAME = "run"
HELP = "train a plan with PyTorch distributed (or --dry-run it)"
EXAMPLES = """examples:
  hetpar run --model tiny-llama --plan tp=2,pp=2,gbs=8 --steps 5
  hetpar run --model tiny-gpt --plan dp=2,zero=1,gbs=8 --checkpoint ckpt/ --every 2
  hetpar run --model llama3.1-70b --cluster h100-pod-400g \\
      --plan tp=8,pp=4,dp=4,gbs=256,recompute=full,zero=1 --dry-run     # 128 ranks
  hetpar run --model tiny-llama --plan pp=2,gbs=8,schedule=zb-h1 --pp-engine torch
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", metavar="M", required=True, help="model name or file")
    p.add_argument("--plan", metavar="P", required=True,
                   help="plan name, file or inline key=value list")
    p.add_argument("--cluster", metavar="C",
                   help="cluster name or file (default: one local node of just enough devices)")
    p.add_argument("--steps", type=int_in(1, 10**9), default=10,
                   help="iterations to train (default 10)")
    p.add_argument("--checkpoint", metavar="DIR",
                   help="save sharded checkpoints here and resume from the latest one")
    p.add_argument("--every", type=int_in(0, 10**9), default=0, metavar="N",
                   help="checkpoint every N steps (default: only at the end)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    p.add_argument("--dtype", default="float32", choices=("float32", "float64", "bfloat16"),
                   help="parameter and activation dtype (default float32)")
    p.add_argument("--seed", type=SEED, default=0, help="initialisation and data seed")
    p.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate (default 1e-3)")
    p.add_argument("--pp-engine", default="hetpar", choices=("hetpar", "torch"),
                   help="pipeline executor: hetpar's own, or torch.distributed.pipelining "
                        "(tp = 1 only); both run the plan's schedule action lists")
    p.add_argument("--timeout", type=float_in(0, 86400, lo_open=True), default=60.0,
                   help="collective timeout in seconds (default 60)")
    p.add_argument("--dry-run", action="store_true",
                   help="build groups, assign stages, check memory; run nothing")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def run(args: argparse.Namespace) -> int:
    from hetpar.errors import ConfigError

    model = load_model(args.model)
    plan = load_plan(args.plan)
    cluster = load_cluster(args.cluster) if args.cluster else None
    if args.steps < 1:
        raise ConfigError(f"--steps must be >= 1, got {args.steps}")
    if args.dry_run:
        from hetpar.runtime.dryrun import dry_run

        d = dry_run(model, plan, cluster)
        if args.json:
            print(json.dumps(d.to_dict(), indent=2))
        else:
            _print_dry(d)
        return 0
    import torch

    if args.device.split(":")[0] not in ("cpu", "cuda"):
        raise ConfigError(f"--device {args.device!r} unknown; allowed: cpu, cuda")
    if args.device.startswith("cuda") and torch.cuda.device_count() < 1:
        raise ConfigError(f"--device {args.device}: no CUDA device here; allowed: cpu")
    from hetpar.runtime.api import run as run_plan
    from hetpar.runtime.optim import AdamConfig
    from hetpar.runtime.worker import RunConfig

    cfg = RunConfig(dtype=getattr(torch, args.dtype), seed=args.seed,
                    adam=AdamConfig(lr=args.lr), timeout_s=args.timeout, device=args.device,
                    pp_engine=args.pp_engine)
    summary = run_plan(model, plan, steps=args.steps, cluster=cluster,
                       checkpoint=args.checkpoint, every=args.every, cfg=cfg,
                       progress=progress.enabled(args))
    if os.environ.get("RANK", "0") != "0":
        return 0  # under torchrun only rank 0 reports
    if args.json:
        print(json.dumps(summary.to_dict(), indent=2))
    else:
        # steps already shown live on the same terminal are not printed a second time
        live = progress.enabled(args) and sys.stdout.isatty()
        steps = [] if live else zip(summary.losses, summary.step_times_s, strict=True)
        for i, (loss, t) in enumerate(steps):
            print(f"step {i + args.steps - len(summary.losses)}: loss {loss:.6f}  {t:.4f} s")
        print(f"{summary.world_size} ranks, median step {summary.median_step_s:.4f} s")
    return 0


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
