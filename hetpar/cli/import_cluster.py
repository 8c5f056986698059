"""Import a cluster written for another planner (Metis, ASTRA-sim) into hetpar's cluster schema.

Also reads framework exports back into a hetpar plan (--from an export target: megatron,
torchtitan, deepspeed or a registered plug-in; with --model), e.g. to compare a hand-written
Megatron launch script with hetpar's plans.
Foreign device names map to hetpar GPU catalog names through the table in docs/exports.md;
add or override entries with --gpu-map NAME=CATALOG_GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hetpar import catalog
from hetpar.cli.options import check_output
from hetpar.errors import ConfigError
from hetpar.export import get, names
from hetpar.export.files import write_atomic
from hetpar.importers import FORMATS, read_astrasim, read_metis
from hetpar.importers.metis import TO_GBPS
from hetpar.io import dump_toml, to_dict
from hetpar.strict import check_name, decode_utf8

NAME = "import"
HELP = "import a Metis or ASTRA-sim cluster (or a framework export as a plan)"
EXAMPLES = """examples:
  hetpar import --from metis hostfile --cluster-file clusterfile.json --out cluster.toml
  hetpar import --from metis hostfile --bandwidth-unit gbps --gpu-map P100=V100
  hetpar import --from astra-sim network.yml --gpu H100 --out h100-64.toml
  hetpar import --from megatron megatron_args.sh --model llama3.1-8b --out plan.toml
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE", help="Metis hostfile, ASTRA-sim network.yml, or export")
    p.add_argument("--from", dest="fmt", required=True, choices=FORMATS + names(),
                   help="the format of FILE")
    p.add_argument("--cluster-file", help="metis: the clusterfile JSON (default: "
                   "clusterfile.json next to FILE)")
    p.add_argument("--bandwidth-unit", choices=sorted(TO_GBPS),
                   help="metis: unit of inter/intra_bandwidth (default: mib_s, as Metis's cost "
                   "model reads them, and implausible values are an error)")
    p.add_argument("--gpu", help="astra-sim: the device type of every NPU (e.g. H100)")
    p.add_argument("--gpu-map", action="append", default=[], metavar="NAME=GPU",
                   help="map a foreign device name to a catalog GPU (repeatable)")
    p.add_argument("--model", help="framework exports: the model (catalog name or file)")
    p.add_argument("--name", help="name of the imported cluster or plan")
    p.add_argument("--out", help="write the TOML (FILE.toml) or JSON (FILE.json) here "
                   "(atomically) instead of stdout")
    p.add_argument("--json", action="store_true", help="print JSON instead of TOML")


def _read(path: str | Path) -> str:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: file not found")
    return decode_utf8(p.read_bytes(), str(p))


def _gpu_map(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--gpu-map: {item!r} is not NAME=CATALOG_GPU")
        k, v = item.split("=", 1)
        check_name(k.strip(), f"--gpu-map {item!r}: the foreign name")
        out[k.strip()] = v.strip()
    return out


# The options each importer reads; any other given is refused (it would be silently ignored).
APPLIES = {"metis": ("cluster_file", "bandwidth_unit", "gpu_map", "name"),
           "astra-sim": ("gpu", "gpu_map", "name")}
EXPORT_APPLIES = ("model", "name")


def _check_options(args: argparse.Namespace) -> None:
    if args.out and args.json and not args.out.lower().endswith(".json"):
        raise ConfigError(f"--json with --out {args.out}: --out writes TOML unless it ends in "
                          ".json; give --out FILE.json, or leave out --json")
    check_output(args.out, "--out", (".toml", ".json"))
    used = APPLIES.get(args.fmt, EXPORT_APPLIES)
    for opt in ("cluster_file", "bandwidth_unit", "gpu", "gpu_map", "model"):
        if getattr(args, opt) and opt not in used:
            flag = "--" + opt.replace("_", "-")
            raise ConfigError(f"{flag} does not apply to --from {args.fmt}; it takes: "
                              + ", ".join("--" + o.replace("_", "-") for o in used))


def _load(args: argparse.Namespace) -> tuple[dict[str, object], list[str]]:
    """The imported object in file form, and conversion warnings."""
    text = _read(args.file)
    if args.name is not None:  # it names the cluster or plan in every later report
        check_name(args.name, "--name")
    if args.fmt in names():
        if not args.model:
            raise ConfigError(f"--from {args.fmt}: --model is required")
        # a target whose export spans files (DeepSpeed: the launcher beside the config)
        # reads them itself
        plan, notes = get(args.fmt).read_file(Path(args.file), text, catalog.load_model(args.model))
        data = to_dict(plan)
        if args.name:
            data["name"] = args.name
        return data, notes
    if args.fmt == "metis":
        cf = args.cluster_file or Path(args.file).with_name("clusterfile.json")
        cluster, warnings = read_metis(text, _read(cf), args.name or "metis",
                                       args.bandwidth_unit, _gpu_map(args.gpu_map))
    else:
        if not args.gpu:
            raise ConfigError("--from astra-sim: --gpu is required (the NPUs' device type)")
        cluster, warnings = read_astrasim(text, args.gpu, args.name or "astra-sim",
                                          _gpu_map(args.gpu_map))
    return to_dict(cluster), warnings


def run(args: argparse.Namespace) -> int:
    _check_options(args)
    data, warnings = _load(args)
    for w in warnings:
        print(f"hetpar: warning: {w}", file=sys.stderr)
    as_json = args.json or bool(args.out and args.out.lower().endswith(".json"))
    text = json.dumps(data, indent=2) + "\n" if as_json else dump_toml(data)
    if args.out:
        write_atomic([(args.out, text)])
        print(f"hetpar: wrote {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
