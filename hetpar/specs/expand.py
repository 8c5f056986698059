"""``expand``: a plan in explicit-replica form, every stage's devices assigned on the cluster."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from hetpar.errors import ConfigError, Infeasible
from hetpar.specs.cluster import ClusterSpec
from hetpar.specs.model import ModelSpec
from hetpar.specs.stage import Replica, Stage, min_layers, padded_split

if TYPE_CHECKING:  # plan.py re-exports expand, so this module cannot import it at load time
    from hetpar.specs.plan import Plan


def device_index(coords: dict[str, int], degrees: dict[str, int], order: list[str]) -> int:
    """Index (in the pool of devices) of the rank at ``coords``: ``order`` innermost first."""
    index, stride = 0, 1
    for axis in order:
        index += coords[axis] * stride
        stride *= degrees[axis]
    return index


def expand(plan: Plan, model: ModelSpec, cluster: ClusterSpec) -> Plan:
    """Return ``plan`` in explicit-replica form with every stage's devices assigned.

    A uniform plan's ranks are laid on the chosen group(s) in ``plan.order``; an explicit
    plan gets devices for stages that lack them, in order, and is checked against the cluster.
    """
    if plan.uniform:
        replicas = _expand_uniform(plan, model, cluster)
        return replace(plan, tp=1, pp=1, dp=1, cp=1, replicas=replicas, global_batch=plan.batch)
    return replace(plan, replicas=_assign_devices(plan, model, cluster))


def _expand_uniform(plan: Plan, model: ModelSpec, cluster: ClusterSpec) -> tuple[Replica, ...]:
    groups = [cluster.group(plan.group)] if plan.group else list(cluster.node_groups)
    pool = [(g.name, i) for g in groups for i in range(g.num_gpus)]
    need = plan.num_gpus()
    if need > len(pool):
        raise Infeasible(
            "devices",
            f"plan needs tp*cp*dp*pp = {plan.tp}*{plan.cp}*{plan.dp}*{plan.pp} = {need} GPUs, "
            f"cluster has {len(pool)}",
        )
    chunks = plan.pp * plan.vpp
    if model.n_layers < min_layers(plan.pp, plan.vpp):
        raise Infeasible(
            "divisibility", f"{model.n_layers} layers < pp*vpp = {plan.pp}*{plan.vpp} chunks"
        )
    ranges = padded_split(model.n_layers, chunks)
    degrees = {"tp": plan.tp, "cp": plan.cp, "dp": plan.dp, "pp": plan.pp}
    order = plan.order.split("-")
    replicas = []
    for d in range(plan.dp):
        stages = []
        for j, rng in enumerate(ranges):
            p = j % plan.pp
            devs = [
                pool[device_index({"tp": t, "cp": c, "dp": d, "pp": p}, degrees, order)]
                for c in range(plan.cp)
                for t in range(plan.tp)
            ]
            names = {n for n, _ in devs}
            if len(names) > 1:
                raise Infeasible(
                    "placement",
                    f"a stage of tp*cp = {plan.tp * plan.cp} spans node groups {sorted(names)}",
                )
            stages.append(
                Stage(
                    layers=rng,
                    group=devs[0][0],
                    tp=plan.tp,
                    cp=plan.cp,
                    devices=tuple(i for _, i in devs),
                )
            )
        replicas.append(
            Replica(stages=tuple(stages), batch=plan.batch // plan.dp, micro_batch=plan.micro_batch)
        )
    return tuple(replicas)


def _assign_devices(plan: Plan, model: ModelSpec, cluster: ClusterSpec) -> tuple[Replica, ...]:
    used: dict[str, set[int]] = {g.name: set() for g in cluster.node_groups}
    owner: dict[tuple[str, int], str] = {}
    for i, r in enumerate(plan.replicas):
        for j, s in enumerate(r.stages):
            cluster.group(s.group)
            if s.devices is None or j >= plan.pp_of(r):
                continue  # a later virtual stage runs on its pipeline rank's devices
            for d in s.devices:
                # one device, one stage: two replicas pinned to a device would be simulated
                # as if each had its own (the runtime's layout refuses the same plan)
                if (s.group, d) in owner:
                    raise ConfigError(f"plan: device {d} of node group {s.group!r} is pinned by "
                                      f"{owner[s.group, d]} and replica {i} stage {j}")
                owner[s.group, d] = f"replica {i} stage {j}"
            used[s.group].update(s.devices)
    out = []
    for r in plan.replicas:
        _check_replica_layers(plan, r, model)
        pp = plan.pp_of(r)
        stages: list[Stage] = []
        for j, s in enumerate(r.stages):
            if j >= pp:
                s = replace(s, devices=stages[j % pp].devices, group=stages[j % pp].group)
            elif s.devices is None:
                g = cluster.group(s.group)
                free = [i for i in range(g.num_gpus) if i not in used[s.group]][: s.width]
                if len(free) < s.width:
                    raise Infeasible("devices", f"node group {s.group!r} has too few free GPUs")
                used[s.group].update(free)
                s = replace(s, devices=tuple(free))
            g = cluster.group(s.group)
            assert s.devices is not None
            if max(s.devices) >= g.num_gpus or min(s.devices) < 0:
                raise ConfigError(
                    f"plan: stage devices {list(s.devices)} outside node group "
                    f"{s.group!r} (0..{g.num_gpus - 1})"
                )
            stages.append(s)
        out.append(replace(r, stages=tuple(stages)))
    return tuple(out)


def check_layers(plan: Plan, model: ModelSpec) -> None:
    """The checks ``expand`` makes of an explicit plan's layers, in its order (ConfigError)."""
    for r in plan.replicas:
        _check_replica_layers(plan, r, model)


def _check_replica_layers(plan: Plan, r: Replica, model: ModelSpec) -> None:
    if len(r.stages) % plan.vpp:
        raise ConfigError(
            f"plan: a replica has {len(r.stages)} stages, not a multiple of vpp={plan.vpp}"
        )
    pos = 0
    for s in r.stages:
        if s.layers[0] != pos:
            raise ConfigError(
                f"plan: stage layers {list(s.layers)} do not continue from layer {pos}"
            )
        pos = s.layers[1]
    if pos != model.n_layers:
        raise ConfigError(
            f"plan: a replica's stages cover {pos} layers, model has {model.n_layers}"
        )
