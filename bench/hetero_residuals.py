"""Where the bundled AMP runs' TP+PP residual sits, and which candidate causes it rules out.

Prints (docs/hetero-validation.md quotes these figures):
1. per run with TP (with and without PP): measured and predicted seconds per iteration, the
   residual, the residual per pipeline step (m + pp - 1 forward/backward step pairs of
   DeepSpeed's TrainSchedule) and the excess over the smallest residual of the same
   (mp, dp, pp) at micro-batch >= 4;
2. the non-monotone cases: within one (mp, dp, pp), measured seconds per pipeline step at
   micro-batch b above those at 2b (a step doing half the work takes longer; fixed per-iteration
   costs spread over fewer steps at 2b, so the comparison is conservative);
3. the T4 TP all-reduce latency that would be needed to carry the excess (4 all-reduces per
   layer per micro-batch on the busiest T4 stage, Megatron-LM mpu: 2 forward, 2 backward)
   against the simulator's;
4. a sensitivity run with every plan's ``p2p_split`` set to "none" (whole activations per TP
   rank, which AMP's vendored PipelineEngine does not do: is_pipe_partitioned = mp > 1);
5. AMP's per-trial wall times (results file, "running real trials till iter N takes T" lines,
   cumulative) against r_cost: if the iterations timed (20-39) were unrepresentative, the trial
   durations would not follow a + b x r_cost.

Run: PYTHONPATH=$PWD .venv/bin/python bench/hetero_residuals.py
"""

import dataclasses
import re
from collections import defaultdict
from pathlib import Path

import numpy as np

from hetpar.catalog import load_job, load_model, load_plan
from hetpar.sim import simulate
from hetpar.sim.network import all_reduce, topology
from hetpar.validation_hetero import BUNDLED, load_run_cluster, read_index, validate

TOKENS = 32 * 1024  # AMP: global batch 32 sequences of 1024
# AMP src/results/het_cluster_results.txt: cumulative seconds after each trial (53 trials) and
# each trial's r_cost (None = inf: did not finish).
CUMULATIVE_S = [
    740.57, 816.69, 898.95, 986.26, 1069.63, 1154.93, 1245.30, 1369.69, 1511.10, 1600.73,
    1813.72, 1992.18, 2109.46, 2251.98, 2369.61, 2485.95, 2643.35, 2770.76, 2918.37, 3063.75,
    3212.08, 3349.61, 3564.22, 3668.71, 3791.87, 3881.26, 8775.78, 9078.57, 9171.96, 9535.77,
    9711.31, 9881.82, 10036.32, 10190.81, 10307.60, 10464.12, 10651.63, 10782.12, 10902.38,
    11008.77, 11113.13, 11245.65, 11353.19, 11463.74, 11566.55, 11641.68, 11777.09, 11893.54,
    12018.05, 12149.53, 12237.67, 12389.11, 12457.43]


def degrees(notes: str) -> tuple[int, int, int, int]:
    m = re.search(r"mp(\d+) dp(\d+) pp(\d+) mbs(\d+)", notes)
    assert m, notes
    mp, dp, pp, mbs = (int(x) for x in m.groups())
    return mp, dp, pp, mbs


def main() -> None:
    rows = read_index(BUNDLED)
    res = {r.row_id: r for r in validate(rows)}
    info = {}
    for row in rows:
        mp, dp, pp, mbs = degrees(row["notes"])
        r = res[row["run_id"]]
        meas, pred = TOKENS / r.measured, TOKENS / (r.predicted or float("nan"))
        info[row["run_id"]] = (mp, dp, pp, mbs, 32 // (dp * mbs), meas, pred, row)
    tpp = {k: v for k, v in info.items() if v[0] > 1}
    base: dict[tuple[int, int, int], float] = defaultdict(lambda: float("inf"))
    for mp, dp, pp, mbs, _, meas, pred, _ in tpp.values():
        if mbs >= 4:
            base[(mp, dp, pp)] = min(base[(mp, dp, pp)], meas - pred)
    print("1. TP and TP+PP runs: seconds per iteration")
    print(" run        mp dp pp mbs  m   meas   pred  resid  resid/step  excess")
    for k, (mp, dp, pp, mbs, m, meas, pred, _) in sorted(tpp.items(), key=lambda kv: kv[1][:4]):
        ex = meas - pred - base[(mp, dp, pp)]
        print(f" {k}  {mp}  {dp}  {pp} {mbs:3d} {m:2d}  {meas:5.2f}  {pred:5.2f}"
              f"  {meas - pred:+5.2f}  {1e3 * (meas - pred) / (m + pp - 1):7.1f} ms  {ex:+5.2f}")
    print("\n2. measured s per pipeline step, micro-batch b vs 2b (same mp, dp, pp)")
    by = {(v[0], v[1], v[2], v[3]): v for v in info.values()}
    for (mp, dp, pp, mbs), v in sorted(by.items()):
        w = by.get((mp, dp, pp, 2 * mbs))
        if w is None or pp == 1:
            continue
        a, b = v[5] / (v[4] + pp - 1), w[5] / (w[4] + pp - 1)
        flag = "  <- half the work, slower step" if a > b else ""
        print(f" mp{mp} dp{dp} pp{pp}: mbs {mbs:2d} {1e3 * a:6.1f} ms, mbs {2 * mbs:2d}"
              f" {1e3 * b:6.1f} ms{flag}")
    print("\n3. T4 TP all-reduce latency needed to carry the excess (mbs <= 2 runs)")
    for k, (mp, dp, pp, mbs, m, meas, pred, row) in sorted(tpp.items()):
        ex = meas - pred - base[(mp, dp, pp)]
        if mbs > 2 or ex <= 0.1:
            continue
        plan = load_plan(str(BUNDLED.parent / row["plan_file"]))
        # one T4 stage's layers: stages run their all-reduces side by side, so the busiest
        # T4 stage is the one whose latency would sit on the critical path
        layers = max(s.layers[1] - s.layers[0] for r in plan.replicas for s in r.stages
                     if s.group == "t4")
        cluster = load_run_cluster(BUNDLED.parent / row["cluster_file"])
        lat = all_reduce(topology(cluster).shape([("t4", i) for i in range(mp)]), 8.0)
        need = ex / (m * 4 * layers)
        print(f" {k}: excess {ex:4.2f} s over {m} micro-batches x 4 x {layers} T4 layers ->"
              f" {1e3 * need:5.2f} ms each; simulator's {1e6 * lat:4.1f} us ({need / lat:4.0f}x)")
    print("\n4. sensitivity: p2p_split = 'none' (whole activation per TP rank)")
    errs = []
    for k, v in sorted(info.items()):
        row = v[7]
        plan = dataclasses.replace(load_plan(str(BUNDLED.parent / row["plan_file"])),
                                   p2p_split="none")
        rep = simulate(load_model(str(BUNDLED.parent / row["model"])),
                       load_run_cluster(BUNDLED.parent / row["cluster_file"]), plan,
                       load_job(row["job"]))
        e = 100 * (rep.tokens_per_s / res[k].measured - 1)
        errs.append(abs(e))
        if k in ("amp-hc-11", "amp-hc-16", "amp-hc-36", "amp-hc-48", "amp-hc-51"):
            print(f" {k}: {res[k].error_pct:+6.1f}% -> {e:+6.1f}%")
    print(f" MAPE {np.mean([abs(r.error_pct or 0) for r in res.values()]):.1f}% ->"
          f" {np.mean(errs):.1f}%")
    print("\n5. AMP trial wall time against r_cost")
    durations = np.diff([0.0, *CUMULATIVE_S])
    ids = {int(k.rsplit("-", 1)[1]): v[5] for k, v in info.items()}
    x = np.array([ids[i] for i in sorted(ids) if i > 0])
    y = np.array([durations[i] for i in sorted(ids) if i > 0])
    (a, b), *_ = np.linalg.lstsq(np.vstack([np.ones_like(x), x]).T, y, rcond=None)
    dev = y - (a + b * x)
    print(f" trial s = {a:.1f} + {b:.1f} x r_cost over {len(x)} finished trials (first left out:"
          f" start-up); residual {dev.min():+.1f} .. {dev.max():+.1f} s")


if __name__ == "__main__":
    assert Path(BUNDLED).is_file()
    main()
