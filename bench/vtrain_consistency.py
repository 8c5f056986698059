"""Check vTrain's GPT-39.1B runs against what any 1F1B cost model can give, from the CSV alone.

Under 1F1B an iteration takes about (m + p - 1) micro-batch stage times (Narayanan et al. 2021,
Sec. 2.2: bubble (p - 1) / m), and a stage's micro-batch carries ``mbs * L / (p * t)`` layer-samples
per GPU. Their ratio, seconds per layer-sample per GPU, is the cost of one unit of work. Lowering
TP at fixed p makes each GPU's GEMMs larger and its TP traffic smaller (Megatron TP moves
2 (t - 1) / t of an activation per all-reduce), so that unit cost cannot rise as t falls from 4 to
2 to 1, and at fixed t and mbs it cannot depend on p beyond the pipeline sends (about 1% of a
stage here: one activation of mbs x s x h x 2 bytes over a 100 Gbit/s NIC per stage boundary). The
script prints it for every row of the group, then `hetpar validate`'s pairwise order
on the whole set and with the group's tp=2 rows left out (a measure of how much of the misorder
those rows hold; the shipped figures keep every row). Run from the repository root:
`.venv/bin/python bench/vtrain_consistency.py [RUNS.csv]`.
"""

from __future__ import annotations

import csv
import sys
from collections import defaultdict
from pathlib import Path

from hetpar.ranking import pairwise_order
from hetpar.validation.predict import validate

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ROOT / "hetpar" / "catalog" / "validation" / "runs.csv"
MODEL = "GPT-39.1B"


def unit_cost(row: dict[str, str]) -> float:
    """Measured seconds per layer-sample per GPU, the 1F1B bubble taken out (see module doc)."""
    tp, pp, dp, mbs = (int(row[k]) for k in ("tp", "pp", "dp", "mbs"))
    gbs, seq, gpus = int(row["gbs"]), int(row["seq_len"]), int(row["num_gpus"])
    iteration = gbs * seq / (gpus * float(row["measured_tokens_per_s_per_gpu"]))
    m = gbs // (dp * mbs)
    per_microbatch = iteration / (m + pp - 1)
    return per_microbatch / (mbs * int(row["n_layers"]) / (pp * tp))


def main(path: Path) -> None:
    rows = list(csv.DictReader(path.open()))
    group = [r for r in rows if r["model"] == MODEL]
    table: dict[tuple[int, int], dict[int, float]] = defaultdict(dict)
    for r in group:
        table[(int(r["pp"]), int(r["mbs"]))][int(r["tp"])] = unit_cost(r)
    print(f"{MODEL}: measured ms per layer-sample per GPU (bubble removed), by (pp, mbs) and tp")
    print("   pp  mbs " + "".join(f"{'tp=' + str(t):>9}" for t in (1, 2, 4, 8)) + "   tp=2 vs tp=4")
    for (pp, mbs), by_tp in sorted(table.items()):
        if len(by_tp) < 2:
            continue
        cells = "".join(f"{by_tp[t] * 1e3:9.1f}" if t in by_tp else f"{'':9}" for t in (1, 2, 4, 8))
        ratio = f"{by_tp[2] / by_tp[4]:9.2f}x" if 2 in by_tp and 4 in by_tp else ""
        print(f"  {pp:3d} {mbs:4d} {cells}  {ratio}")
    print("spread over pp at the same tp and mbs (max / min; per-GPU work equal, bubble removed):")
    for tp in (2, 4, 8):
        spreads = []
        for mbs in sorted({k[1] for k in table}):
            costs = [v[tp] for (p, b), v in table.items() if b == mbs and tp in v]
            if len(costs) >= 2:
                spreads.append(f"mbs {mbs}: {max(costs) / min(costs):.2f}x")
        print(f"  tp={tp}: " + ", ".join(spreads))
    results = validate(rows)
    right, total = pairwise_order(rows, results)
    keep = [i for i, r in enumerate(rows) if not (r["model"] == MODEL and r["tp"] == "2")]
    r2, t2 = pairwise_order([rows[i] for i in keep], [results[i] for i in keep])
    print(f"pairwise order, all rows: {right}/{total} ({100 * right / total:.2f}%)")
    print(f"pairwise order, {MODEL} tp=2 rows left out ({len(rows) - len(keep)} rows): "
          f"{r2}/{t2} ({100 * r2 / t2:.2f}%)")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT)
