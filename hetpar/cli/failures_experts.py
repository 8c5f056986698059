"""`hetpar failures` on an expert-parallel plan: one failed GPU, the experts re-placed over
the surviving replicas or the EP group dropped (``hetpar.failures.experts``)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from hetpar.errors import ConfigError
from hetpar.failures import experts
from hetpar.failures.ntp_plan import write_plan
from hetpar.specs.cluster import ClusterSpec
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import Plan


def run(model: ModelSpec, cluster: ClusterSpec, plan: Plan, args: argparse.Namespace) -> int:
    """An expert-parallel plan: one failed GPU, experts re-placed or the EP group dropped
    (failures/experts.py); not the NTP sweep and Monte Carlo, whose unit is one replica
    priced alone, which an EP group spanning replicas is not. An explicit plan is studied
    once per distinct replica; ``--write-plan`` writes the first study's chosen plan."""
    studies = [experts.study(model, cluster, plan, at) for at in experts.failed_replicas(plan)]
    out: dict[str, Any] = {"experts": [experts.to_dict(r) for r in studies]}
    if args.write_plan:
        first = studies[0]
        chosen = first.chosen
        if chosen.plan is None or chosen.throughput == 0:
            raise ConfigError(f"--write-plan {args.write_plan}: no policy runs after one GPU "
                              "failure: " + "; ".join(f"{o.policy}: {o.reason}"
                                                      for o in first.options))
        write_plan(chosen.plan, args.write_plan)
        out["written_plan"] = {"path": args.write_plan, "policy": chosen.policy,
                               "failed_gpus": 1, "failed_replica": first.failed_replica,
                               "replicas": experts.replicas(chosen.plan),
                               "global_batch": chosen.plan.batch}
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    lines = [line for r in studies for line in experts.text(r, model)] + [
        "(ep > 1: the NTP sweep and Monte Carlo price one replica alone and an EP group "
        "spans replicas, so they are not run)"]
    if "written_plan" in out:
        w = out["written_plan"]
        lines.append(f"wrote {w['policy']} plan to {w['path']}: {w['replicas']} replicas, "
                     f"global batch {w['global_batch']}")
    print("\n".join(lines))
    return 0
