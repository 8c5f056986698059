"""Cost of switching from one plan to another: state that must move, by resharding or via a
checkpoint, plus the restart."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hetpar import formulas
from hetpar.dynamic.state import ClusterState
from hetpar.sim import terms
from hetpar.specs.job import Job
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import Plan

Holding = tuple[int, int, float, float, float, float, tuple[int, int] | None]
"""Layers [a, b), TP fraction [lo, hi) of their parameters, weight bytes and optimizer bytes
per parameter, and the ZeRO shard (replica index, replicas) of the optimizer state, or None
when the optimizer state is not sharded."""


@dataclass(frozen=True, kw_only=True)
class SwitchSettings:
    """What a switch costs besides moving state."""

    restart_s: float = 60.0
    """Stop, rebuild process groups and communicators, warm up (per switch)."""
    storage_bandwidth_gbyte_s: float = 20.0
    """Aggregate bandwidth of checkpoint storage (GB/s), for save and load."""


@dataclass(frozen=True, kw_only=True)
class SwitchCost:
    """Seconds without training that a switch costs, and how they were spent."""

    total_s: float
    restart_s: float
    transfer_s: float
    method: Literal["reshard", "checkpoint"]
    bytes_moved: float
    """Weights + optimizer state that change devices (reshard) or go through storage."""
    reshard_s: float | None
    """None when some state existed only on nodes that left (a checkpoint is needed)."""
    checkpoint_s: float

    def to_dict(self) -> dict[str, object]:
        """Plain form for JSON output."""
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def _holdings(plan: Plan, state: ClusterState, model: ModelSpec,
              job: Job) -> dict[tuple[str, int], list[Holding]]:
    """For each physical device (original group, index), the state it holds under ``plan``.

    Each device keeps the weights of its TP shard of its stage's layers, plus master weights
    and optimizer moments, divided over the replicas under ZeRO-1 and above (bytes per
    parameter: the simulator's ``state_bytes_per_param``).
    """
    dp = len(plan.replicas)
    weights, _, opt_bytes = terms.state_bytes_per_param(plan.precision, job.optimizer)
    opt = opt_bytes / (dp if plan.zero >= 1 else 1)
    out: dict[tuple[str, int], list[Holding]] = {}
    for i, r in enumerate(plan.replicas):
        shard = (i, dp) if plan.zero >= 1 else None
        for s in r.stages:
            assert s.devices is not None, "switching cost needs expanded plans"
            for k in range(s.tp):
                lo, hi = k / s.tp, (k + 1) / s.tp
                for c in range(s.cp):  # CP ranks hold the same shard as their TP peer
                    dev = s.devices[c * s.tp + k]
                    out.setdefault(state.identity(s.group, dev), []).append(
                        (s.layers[0], s.layers[1], lo, hi, weights, opt, shard))
    return out


def _bytes(model: ModelSpec, h: Holding) -> float:
    a, b, lo, hi, weights, opt, _ = h
    return formulas.layers_params(model, a, b) * (hi - lo) * (weights + opt)


def _overlap(model: ModelSpec, x: Holding, y: Holding) -> float:
    """Bytes of ``x`` already held in ``y``: the weights of the common layers and TP slice,
    and their optimizer state only if it is sharded the same way (a ZeRO slice of the DP
    group is re-cut whenever the number of replicas or the replica changes)."""
    a, b = max(x[0], y[0]), min(x[1], y[1])
    lo, hi = max(x[2], y[2]), min(x[3], y[3])
    if a >= b or lo >= hi:
        return 0.0
    same_opt = x[6] == y[6]
    per_param = min(x[4], y[4]) + (min(x[5], y[5]) if same_opt else 0.0)
    return formulas.layers_params(model, a, b) * (hi - lo) * per_param


def _covered(model: ModelSpec, old: Plan, old_state: ClusterState, new_state: ClusterState) -> bool:
    """Whether every layer is still held by some surviving whole stage of the old plan."""
    layers = [False] * model.n_layers
    for r in old.replicas:
        for s in r.stages:
            alive = all(new_state.locate(*old_state.identity(s.group, d)) for d in s.devices or ())
            if alive:
                layers[s.layers[0]: s.layers[1]] = [True] * s.n_layers
    return all(layers)


def switch_cost(old: Plan, old_state: ClusterState, new: Plan, new_state: ClusterState,
                model: ModelSpec, job: Job, settings: SwitchSettings) -> SwitchCost:
    """Cost of going from ``old`` (in ``old_state``'s names) to ``new`` (in ``new_state``'s).

    Resharding: each device of the new plan receives the state it lacks over its NIC, and
    the surviving old devices send it over theirs; the slower side bounds the time.
    Checkpoint: save (if the old state is intact) and load one copy of the full state at
    the storage bandwidth. The cheaper of the two is used; restart is paid either way.
    """
    have = _holdings(old, old_state, model, job)
    need = _holdings(new, new_state, model, job)
    assert new_state.cluster is not None
    nic = {g.name: terms.bytes_per_s(g.nic_bandwidth_gbps)
           for g in new_state.cluster.node_groups}
    recv_s, moved = 0.0, 0.0
    for dev, hs in need.items():
        lacking = sum(_bytes(model, h) for h in hs) - sum(
            _overlap(model, h, o) for h in hs for o in have.get(dev, []))
        if lacking > 0:
            part = new_state.locate(*dev)
            assert part is not None
            moved += lacking
            recv_s = max(recv_s, lacking / nic[part[0]])
    senders = [new_state.locate(*dev) for dev in have]
    send_bw = sum(nic[p[0]] for p in senders if p is not None)
    reshard = None
    if _covered(model, old, old_state, new_state) and send_bw > 0:
        reshard = max(recv_s, moved / send_bw)
    weights, _, opt_bytes = terms.state_bytes_per_param(new.precision, job.optimizer)
    full = formulas.params(model) * (weights + opt_bytes)
    storage = settings.storage_bandwidth_gbyte_s * 1e9
    ckpt = full / storage * (2.0 if reshard is not None else 1.0)  # save + load, or load only
    if reshard is not None and reshard <= ckpt:
        method: Literal["reshard", "checkpoint"] = "reshard"
        transfer, nbytes = reshard, moved
    else:
        method, transfer, nbytes = "checkpoint", ckpt, full
    return SwitchCost(total_s=settings.restart_s + transfer, restart_s=settings.restart_s,
                      transfer_s=transfer, method=method, bytes_moved=nbytes,
                      reshard_s=reshard, checkpoint_s=ckpt)
