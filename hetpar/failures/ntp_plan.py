"""The degraded cluster's plan as an explicit-replica Plan (what `hetpar simulate --plan` loads)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from hetpar import feasibility
from hetpar.errors import Infeasible
from hetpar.failures.policies import Evaluator
from hetpar.io import dump_toml, to_dict, write_text_atomic
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import Plan
from hetpar.specs.stage import Replica, Stage, split_layers


def degraded_plan(model: ModelSpec, plan: Plan, ev: Evaluator, failed: np.ndarray,
                  policy: str = "ntp") -> Plan:
    """An explicit plan for the node group's GPUs with ``failed`` (a bool per GPU) down.

    Units (TP groups of n consecutive devices) are packed into replicas as ``policy`` does. A
    replica runs every stage at its smallest unit degree under ``ntp`` (the whole replica
    slows to the degraded stage, Arfeen et al. 2025 Sec. 4.4) and each stage at its own degree
    under ``ntp-boost`` (boosted stages keep pace); each stage uses the first surviving GPUs of
    its unit. Batch shares are the ones that keep pace with the healthy replicas.
    """
    lay = ev.lay
    n, cp = lay.tp, plan.cp
    assert failed.size % n == 0 and failed.size // n >= lay.units
    per_unit = failed.reshape(-1, n)
    counts = per_unit.sum(axis=1)
    rows, shares, deg, _ = ev.assignment(policy, counts)
    if not len(rows) or int(shares.sum()) < 1:
        raise Infeasible("no_replica", f"{int(failed.sum())} of {failed.size} GPUs failed "
                         f"leave no replica that can train under {policy}")
    ranges = split_layers(model.n_layers, lay.pp * lay.vpp)
    replicas = []
    for row, share in zip(rows, shares, strict=True):
        units = [int(u) for u in row]
        rep_deg = int(deg[row].min())
        stages = []
        for j, rng in enumerate(ranges):
            mine = units[(j % lay.pp) * cp:(j % lay.pp + 1) * cp]
            t = rep_deg if policy == "ntp" else int(deg[mine].min())
            devices: list[int] = []
            for u in mine:
                alive = np.flatnonzero(~per_unit[u])[:t]
                devices += [u * n + int(i) for i in alive]
            stages.append(Stage(layers=rng, group=lay.group, tp=t, cp=cp, devices=tuple(devices)))
        replicas.append(
            Replica(stages=tuple(stages), batch=int(share), micro_batch=lay.micro_batch)
        )
    name = f"{plan.name or 'plan'}-{policy}-{int(failed.sum())}failed"
    # a degraded TP group of t ranks may split the heads unevenly (NTP): said in the plan
    uneven = any(not feasibility.tp_shards(model, st.tp).ok for r in replicas for st in r.stages)
    return replace(plan, name=name, tp=1, pp=1, dp=1, cp=1, group=None, replicas=tuple(replicas),
                   global_batch=int(shares.sum()), uneven_tp=uneven,
                   on_failure="drop" if policy == "drop-packed" else "ntp")


def write_plan(plan: Plan, path: str | Path) -> None:
    """Write ``plan`` as TOML (or JSON by extension) atomically: nothing half-written on error."""
    import json

    p = Path(path)
    data = to_dict(plan)
    text = json.dumps(data, indent=1) + "\n" if p.suffix == ".json" else dump_toml(data)
    write_text_atomic(p, text)
