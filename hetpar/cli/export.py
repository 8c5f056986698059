"""Export a plan to a training framework: Megatron-LM arguments, a torchtitan launch script (or
TOML), a DeepSpeed config and launcher, or any other registered export target.

A plan the framework cannot express (per-stage TP degrees, replicas of different shapes,
uneven batch shares or layer splits, a schedule or precision it lacks) is replaced by the
nearest plan it can express; every such change is printed as a warning on stderr, and the
files carry the same warnings as comments where the format allows comments. A plan the chosen
--framework-version cannot run even in its nearest form is refused (exit 2) naming the
nearest plan it can.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hetpar import catalog
from hetpar.cli.options import check_output
from hetpar.export import export, get, names
from hetpar.export.files import write_atomic
from hetpar.io import to_dict

NAME = "export"
HELP = "export a plan to Megatron-LM, torchtitan or DeepSpeed"
EXAMPLES = """examples:
  hetpar export --plan tp=8,pp=4,dp=2,gbs=512 --model llama3.1-70b --to megatron
  hetpar export --plan tp=2,pp=2,dp=2,gbs=64,sp=true,zero=3 --model llama3.1-8b \\
      --to torchtitan --out train_llama.sh
  hetpar export --plan tp=2,dp=4,gbs=64,zero=1 --model llama3.1-8b --cluster selene-a100 \\
      --to deepspeed --out ds_config.json      # also writes ds_config.sh (the launcher)
  hetpar export --plan tp=4,gbs=32 --model tiny-llama --to megatron --json
  hetpar export --plan tp=2,pp=4,dp=2,gbs=64 --model llama3.1-8b --to torchtitan \
      --framework-version 2025-10 --out llama.toml   # the last TOML form
  hetpar export --plan tp=2,dp=4,gbs=64,zero=1 --model llama3.1-8b --to deepspeed --check
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--plan", required=True, help="plan: catalog name, file, or inline tp=..,pp=..")
    p.add_argument("--model", required=True, help="model: catalog name or file")
    p.add_argument("--cluster", help="cluster (sets GPUs per node in the launch command; "
                   "the node groups of a hybrid-sharded plan, zero_scope = group)")
    targets = names()  # the registry as it is now: bundled targets and any plug-in imported
    p.add_argument("--to", required=True, choices=targets, help="target framework: "
                   + "; ".join(f"{t}: {get(t).help}" for t in targets))
    p.add_argument(
        "--framework-version",
        help="framework version whose options and rules to follow (default: the newest; "
        + "; ".join(f"{t}: {', '.join(sorted(get(t).versions))}" for t in targets) + ")",
    )
    p.add_argument("--out", help="write the main file here (DeepSpeed: and <stem>.sh beside it)")
    p.add_argument("--json", action="store_true", help="print files, warnings and plan as JSON")
    p.add_argument(
        "--check", action="store_true",
        help="also read the export with the installed framework's own code before writing it "
        "(DeepSpeed: DeepSpeedConfig; Megatron-LM: megatron-core's TransformerConfig and "
        "DistributedDataParallelConfig; torchtitan: its ConfigManager, for exports of the "
        "installed release's form, --framework-version 0.3.0); exit 2 with the "
        "framework's message when it refuses, 0 with 'not checked' when it is not installed",
    )


def run(args: argparse.Namespace) -> int:
    check_output(args.out, "--out")
    plan, model = catalog.load_plan(args.plan), catalog.load_model(args.model)
    cluster = catalog.load_cluster(args.cluster) if args.cluster else None
    out = Path(args.out) if args.out else None
    e = export(plan, model, args.to, cluster, config_name=out.name if out else "",
               version=args.framework_version)
    assert not e.problems(), e.problems()  # every export is checked against the option table
    for w in e.warnings:
        print(f"hetpar: warning: {w}", file=sys.stderr)
    if e.warnings:
        print("hetpar: exported the nearest expressible plan: "
              + json.dumps(to_dict(e.plan)), file=sys.stderr)
    checked = get(args.to).check_export(e) if args.check else None
    if checked is not None and checked.accepted is False:
        print(f"hetpar: error: export --check: {checked.message}", file=sys.stderr)
        return 2  # nothing written
    if checked is not None:
        print(f"hetpar: check: {checked.message}", file=sys.stderr)
    if out is not None:
        paths = [out] + [out.with_name(name) for name, _ in e.files[1:]]
        write_atomic([(p, text) for p, (_, text) in zip(paths, e.files, strict=True)])
        print("hetpar: wrote " + ", ".join(map(str, paths)), file=sys.stderr)
    if args.json:
        extra = {} if checked is None else {"check": {"accepted": checked.accepted,
                                                      "message": checked.message}}
        print(json.dumps({"target": e.target, "warnings": list(e.warnings),
                          "plan": to_dict(e.plan), "files": dict(e.files), **extra}, indent=2))
    elif out is None:
        for name, text in e.files:
            if len(e.files) > 1:
                print(f"==> {name} <==")
            sys.stdout.write(text)
    return 0
