"""Dry run: build the groups and stage assignment of a plan and check memory, no collectives.

Validates what a real run would set up (every rank's role, its TP/DP/PP peers, the process
groups) for plans far larger than the machine, e.g. 128 ranks on a laptop.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from hetpar import feasibility
from hetpar.errors import Infeasible
from hetpar.runtime.layout import Layout, build_layout, check_buildable, check_zero3
from hetpar.specs.cluster import ClusterSpec
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import Plan


@dataclass(frozen=True, kw_only=True)
class DryRun:
    """What a run of the plan would build."""

    world_size: int
    replicas: list[dict[str, Any]]
    groups: dict[str, int]
    """Process groups by kind (tp; dp: sync groups of one TP shard; ntp: resharding groups;
    hybrid, under ``zero_scope = "group"`` with ZeRO-1/2: ZeRO and cross-group groups)."""
    memory: list[dict[str, Any]] = field(default_factory=list)
    memory_source: str = ""
    oom: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"world_size": self.world_size, "replicas": self.replicas, "groups": self.groups,
                "memory_source": self.memory_source, "memory": self.memory, "oom": self.oom}


def dry_run(model: ModelSpec, plan: Plan, cluster: ClusterSpec | None = None) -> DryRun:
    """Lay out ``plan``, derive its process groups, check memory; Infeasible if it cannot fit.

    With a cluster, memory comes from the simulator's model (``hetpar.sim``) and is checked
    against each GPU's capacity; without one only weight/gradient/Adam bytes are reported.
    """
    check_buildable(model)
    layout = build_layout(plan, model, cluster)
    check_zero3(layout)
    groups = _groups(layout)
    reps = [_replica_row(layout, r) for r in range(layout.replicas)]
    if cluster is None:
        mem = _state_bytes(layout)
        return DryRun(world_size=layout.world_size, replicas=reps, groups=groups, memory=mem,
                      memory_source="weights+grads+adam only (no cluster given)")
    from hetpar.sim import simulate

    report = simulate(model, cluster, plan)
    rows = [m.to_dict() for m in report.memory]
    out = DryRun(world_size=layout.world_size, replicas=reps, groups=groups, memory=rows,
                 memory_source="hetpar.sim memory model", oom=report.oom)
    worst = max(report.memory, key=lambda m: m.total / m.capacity)
    feasibility.memory(worst.total, worst.capacity,
                       f"replica {worst.replica} pipeline rank {worst.rank}").raise_if_failed()
    return out


def rank_state_bytes(layout: Layout, itemsize: int) -> list[int]:
    """Per rank: bytes of its weights, gradients and Adam moments (ZeRO-1/2 shard the moments
    over the replicas, ZeRO-3 everything; with ``zero_scope = "group"`` over the replicas on
    the rank's node group). A lower bound on what the rank needs: activations, communication
    buffers and the interpreter come on top."""
    zero = layout.plan.zero
    out = [0] * layout.world_size
    for row in _state_bytes(layout):
        dp = _zero_degree(layout, row["replica"], row["rank"])
        per = 4.0 if zero == 0 else (2 + 2 / dp if zero in (1, 2) else 4 / dp)
        for rank in layout.stage_ranks[row["replica"]][row["rank"]]:
            out[rank] = int(row["params"] * itemsize * per)
    return out


def _zero_degree(layout: Layout, replica: int, p: int) -> int:
    """Ranks pipeline rank ``p`` of ``replica`` shards ZeRO state over: one per replica (its
    stage min(p, pp - 1), as the simulator pairs them), on its node group under hybrid
    sharding (``Layout.zero_peers``)."""
    firsts = tuple(st[min(p, layout.roles[st[0][0]].pp - 1)][0] for st in layout.stage_ranks)
    return len(layout.zero_peers(firsts, layout.stage_ranks[replica][p][0]))


def host_state_bytes(layout: Layout, itemsize: int) -> int:
    """Bytes that all ranks of ``layout`` hold together (``rank_state_bytes`` summed)."""
    return sum(rank_state_bytes(layout, itemsize))


def check_device_memory(layout: Layout, itemsize: int, dtype: str, free: list[int]) -> str:
    """Raise Infeasible if the ranks placed round-robin on GPUs with ``free`` bytes each (as
    the forked launcher places them: rank % devices) cannot hold their state."""
    need = [0] * len(free)
    for rank, b in enumerate(rank_state_bytes(layout, itemsize)):
        need[rank % len(free)] += b
    worst = max(range(len(free)), key=lambda i: need[i] / max(free[i], 1))
    line = (f"GPU memory: cuda:{worst} needs >= {need[worst] / 2**30:.2f} GiB ({dtype} "
            f"weights, gradients, Adam moments), {free[worst] / 2**30:.2f} GiB free")
    if need[worst] > free[worst]:
        raise Infeasible("memory", line)
    return line


def available_host_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (Linux), else free physical pages; None if unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


def check_host_memory(layout: Layout, itemsize: int, dtype: str) -> str:
    """Raise Infeasible if the local ranks' state cannot fit in this host's available memory;
    returns the one-line comparison otherwise."""
    need = host_state_bytes(layout, itemsize)
    have = available_host_bytes()
    line = (f"host memory: {layout.world_size} local rank(s) need >= {need / 2**30:.2f} GiB "
            f"({dtype} weights, gradients, Adam moments)")
    if have is None:
        return line + "; available memory unknown"
    line += f", {have / 2**30:.2f} GiB available"
    if need > have:
        raise Infeasible("memory", line)
    return line


def _replica_row(layout: Layout, r: int) -> dict[str, Any]:
    rep = layout.plan.replicas[r]
    return {
        "replica": r, "batch": rep.batch, "micro_batch": rep.micro_batch,
        "stages": [{"layers": list(s.layers), "tp": s.tp, "ranks": list(ranks)}
                   for s, ranks in zip(rep.stages, layout.stage_ranks[r], strict=True)],
    }


def _groups(layout: Layout) -> dict[str, int]:
    """Count the process groups a run creates, by kind, from the gradient-sync plan."""
    from hetpar.runtime.gradsync import holdings, plan_buckets

    tp = {tuple(sorted(g)) for g in layout.mesh.groups("tp") if len(g) > 1}
    sync: dict[tuple[int, ...], str] = {}
    held = holdings(layout)
    for rank in range(layout.world_size):
        for b in plan_buckets(layout, rank, 1 << 62, held):
            kind = "dp"
            if any(e.mode == "piece" for e in b.entries):
                kind = "ntp"
            sync[b.ranks] = kind if sync.get(b.ranks) != "ntp" else "ntp"
    kinds = {"tp": len(tp), "dp": 0, "ntp": 0}
    for ranks, kind in sync.items():
        if ranks not in tp:
            kinds[kind] += 1
    if layout.plan.zero in (1, 2) and layout.plan.zero_scope == "group":
        from hetpar.runtime.hybrid import needed_groups

        # ZeRO groups per node group and the cross-group all-reduces (hetpar.runtime.hybrid)
        kinds["hybrid"] = len(needed_groups(layout, set(sync)) - set(sync) - tp)
    return kinds


def _state_bytes(layout: Layout) -> list[dict[str, Any]]:
    """Per pipeline rank: weight, gradient and Adam bytes (fp32 weights, 16 bytes/param)."""
    from hetpar.runtime.model import param_infos

    m = layout.model
    rows = []
    for r, rep in enumerate(layout.plan.replicas):
        pp = layout.plan.pp_of(rep)
        last = len(rep.stages) - 1
        for p in range(pp):
            n = 0
            for j in range(p, len(rep.stages), pp):
                a, b = rep.stages[j].layers
                for info in param_infos(m, range(a, b), j == 0, j == last).values():
                    size = 1
                    for d in info.shape:
                        size *= d
                    n += size // rep.stages[j].tp if info.shard_dim is not None else size
            rows.append({"replica": r, "rank": p, "params": n,
                         "state_gib": n * 16 / 2**30})
    return rows
