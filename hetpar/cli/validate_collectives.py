"""Predict measured collective bus bandwidths (an nccl-tests CSV) and report the error.

The CSV has the columns row_id, system, collective, gpus, gpus_per_node, size_bytes,
measured_busbw_gbyte_s, source, and optionally algorithm (what the row's source forced with
NCCL_ALGO: ring, tree, pat, ...; empty: the library's choice); ``system`` names a cluster
file in the CSV's ``systems/`` folder (or a bundled cluster). The rank layout is
``gpus_per_node`` GPUs on each of the first gpus / gpus_per_node nodes of the system's first
node group. --cluster prices every row on one cluster file instead (points measured by
`hetpar probe`, against a fitted file).
"""

from __future__ import annotations

import argparse
import json

from hetpar.net.collectives import ALGORITHMS
from hetpar.validation_collectives import MIB, by_system, mape, run_file

NAME = "validate-collectives"
HELP = "predict measured collective bus bandwidths (nccl-tests rows) and report the error"
EXAMPLES = """examples:
  hetpar validate-collectives validation/collectives/nccl-tests.csv
  hetpar validate-collectives validation/collectives/nccl-tests.csv --json
  hetpar validate-collectives validation/collectives/nccl-tests.csv --algorithm ring
  hetpar validate-collectives probe2/local-points.csv --cluster probe/local.toml
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE", help="CSV of measured collectives")
    p.add_argument("--algorithm", choices=sorted(ALGORITHMS),
                   help="force one algorithm for every row, as NCCL_ALGO does (default: "
                        "each row's algorithm cell, else what the system's cluster file "
                        "chooses)")
    p.add_argument("--cluster", metavar="NAME|FILE",
                   help="price every row on this cluster (default: each row's system)")
    p.add_argument("--json", action="store_true",
                   help='print {"rows": [...], "mape_pct": ..., "systems": [...]} instead of '
                        "the tables")


def run(args: argparse.Namespace) -> int:
    results = run_file(args.file, args.algorithm, args.cluster)
    summary = {"mape_pct": mape(results), "mape_ge_1mib_pct": mape(results, MIB),
               "mape_lt_1mib_pct": mape(results, 0, MIB)}
    if args.json:
        print(json.dumps({"rows": [r.to_dict() for r in results], **summary,
                          "systems": by_system(results)}, indent=1))
        return 0
    print(f"{'row':>4s} {'system':18s} {'collective':15s} {'size':>12s} {'predicted':>10s} "
          f"{'measured':>10s} {'error':>8s}")
    for r in results:
        print(f"{r.row_id:>4s} {r.system[:18]:18s} {r.collective:15s} {r.size_bytes:12d} "
              f"{r.predicted_busbw_gbyte_s:10.3f} {r.measured_busbw_gbyte_s:10.3f} "
              f"{r.error_pct:+7.1f}%")
    for k, v in summary.items():
        print(f"{k}: {'-' if v is None else f'{v:.1f}'}")
    print()
    print(f"{'system':20s} {'rows':>5s} {'MAPE >= 1 MiB':>14s} {'MAPE < 1 MiB':>13s}")
    for row in by_system(results):
        ge, lt = (_pct(row[k]) for k in ("mape_ge_1mib_pct", "mape_lt_1mib_pct"))
        print(f"{str(row['system'])[:20]:20s} {row['rows']:5d} {ge:>14s} {lt:>13s}")
    return 0


def _pct(v: object) -> str:
    return "-" if v is None else f"{v:.1f}%"
