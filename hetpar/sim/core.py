"""``simulate``: one training iteration of a (uniform or explicit) plan on a cluster."""

from __future__ import annotations

import dataclasses
from typing import Any, cast

from hetpar import feasibility, formulas, schedules
from hetpar.errors import ConfigError, Infeasible
from hetpar.sim import axis_costs, ep_groups, expert_split, moe
from hetpar.sim.chunk import Context
from hetpar.sim.layer import ACT_BYTES, attention_precision, gemm_precision
from hetpar.sim.layout import Layout, layouts
from hetpar.sim.memory import state_bytes_per_param
from hetpar.sim.network import GroupShape, Topology, record, recorded
from hetpar.sim.profile import FrameworkProfile, resolve
from hetpar.sim.report import CommunicatorUse, Report
from hetpar.sim.structure import ReplicaResult, simulate_replica
from hetpar.specs.cluster import ClusterSpec
from hetpar.specs.collectives import NetworkModel
from hetpar.specs.job import Job, resolve_precision
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import Plan


def simulate(
    model: ModelSpec, cluster: ClusterSpec, plan: Plan, job: Job | None = None, *,
    timeline: bool = False, profile: FrameworkProfile | None = None, collectives: bool = False,
    network: NetworkModel | None = None,
) -> Report:
    """Simulate one iteration of ``plan`` (see docs/simulator.md for the model and its sources).

    A job, when given, sets the sequence length and optimizer and must agree with the plan's
    global batch; the precision is the one plan or job states (a conflict is a ConfigError).
    Raises Infeasible for plans that cannot run at all (indivisible heads, too few GPUs, ...);
    a plan that runs out of memory is simulated and flagged (``Report.oom``). ``profile`` is
    the framework behaviour (sim/profile.py); without one, the job's framework and the plan's
    attention override resolve it (neither given: the default profile). ``collectives``: also
    record each communicator's messages, so that ``Report.collectives`` can name the
    algorithm and protocol NCCL runs for them (the planner, which never asks, skips it).
    ``network``: an alternative model of the fabric (``specs/collectives.NetworkModel``; the
    robust objective's); the plan's own ``collectives`` are priced in every case.
    """
    if profile is None:
        profile = resolve(job.framework if job else None, attention=plan.attention or None)
    model = padded_model(model, plan, profile)
    seq = job.seq_len if job and job.seq_len else model.seq_len
    precision = resolve_precision(plan, job)
    if job is not None and job.global_batch != plan.batch:
        raise ConfigError(
            f"plan: global_batch ({plan.batch}) differs from job.global_batch ({job.global_batch})"
        )
    optimizer = job.optimizer if job else "adam"
    split, mask, blocking = _p2p_behaviour(plan, profile)
    # One feasibility check for simulate, plan, run, replay and failures (hetpar/feasibility.py);
    # a plan that says uneven_tp may use nonuniform TP, costed by the largest shard
    # (layer_time), and the first / last chunk of an interleaved split may hold only the
    # embedding / LM head (padded interleaving).
    feasibility.check_costed(model, plan, seq_len=seq)
    ep_groups.check_lockstep(model, cluster, plan)
    lays, topo = layouts(model, cluster, plan, network)
    costed = axis_costs.costed(plan)  # the plan-scope axes with a registered cost
    for lay in lays:
        _check_precision(topo, lay, precision)
    comms = _communicators(topo, lays) if collectives else []
    for _, shape in comms:
        record(shape)
    uneven = expert_split.plan_split(model, cluster, plan, topo, precision, seq, profile)
    results: dict[tuple[object, ...], ReplicaResult] = {}
    per_replica: list[ReplicaResult] = []
    for lay in lays:
        # an uneven expert split: the layout's busiest rank's experts (0: even)
        local = max(uneven.by_replica[i] for i in lay.replicas) if uneven else 0
        if (lay.key, local) not in results:
            ctx = Context(
                model=model, topo=topo, seq=seq, micro_batch=lay.micro_batch,
                precision=precision, optimizer=optimizer, recompute=plan.recompute,
                sequence_parallel=plan.sequence_parallel, zero=plan.zero,
                schedule=plan.schedule, vpp=plan.vpp, dp_sizes=lay.dp_sizes,
                dp_shapes=lay.dp_shapes, profile=profile,
                grad_reduce_bytes=ACT_BYTES[plan.grad_reduce_dtype] if plan.grad_reduce_dtype
                else None,
                p2p_split=split, p2p_attention_mask=mask, p2p_blocking=blocking,
                axes=costed, axis_shapes=lay.axis_shapes, experts=moe.experts_of(model, plan),
                local_experts=local, a2a_share=uneven.a2a_share if uneven else 1.0,
            )
            results[(lay.key, local)] = simulate_replica(ctx, lay)
        per_replica.append(results[(lay.key, local)])
    slow_i = max(range(len(lays)), key=lambda i: per_replica[i].time)
    slow = per_replica[slow_i]
    iteration = slow.time + profile.iteration_overhead_s
    breakdown = dict(slow.parts)
    breakdown["overhead"] += profile.iteration_overhead_s
    # Identical replicas share their memory rows, labelled with the first such replica.
    memory = tuple(
        row if row.replica == lay.replicas[0] else dataclasses.replace(row, replica=lay.replicas[0])
        for lay, res in zip(lays, per_replica, strict=True) for row in res.memory
    )
    tokens = plan.batch * seq
    num_gpus = sum(lay.num_gpus for lay in lays)
    report = Report(
        iteration_time_s=iteration,
        tokens_per_iter=tokens,
        num_gpus=num_gpus,
        model_flops_per_iter=tokens * formulas.model_flops_per_token(model, seq),
        hardware_flops_per_iter=tokens * formulas.hardware_flops_per_token(
            model, seq, plan.recompute
        ),
        peak_flops_total=sum(lay.peak_flops(topo, precision) for lay in lays),
        memory=memory,
        breakdown=breakdown,
        notes=tuple(sorted({n for lay in lays for n in lay.notes} | _uneven_notes(model, lays))),
        communicators=tuple(CommunicatorUse(axis=a, shape=sh, seen=recorded(sh))
                            for a, sh in comms) if collectives else None,
        pipeline_sends=any(lay.pp > 1 for lay in lays),
        experts=_experts(model, plan, lays[slow_i], precision, optimizer, profile, uneven),
    )
    for _, shape in comms:  # stop recording: later evaluations of other plans pay nothing
        shape.seen.clear()
    if timeline:
        from hetpar.sim.timeline import build_timeline

        events = build_timeline(report, lays, per_replica, plan, profile.iteration_overhead_s)
        report = Report(**{**_fields(report), "timeline": events})
    return report


def padded_model(model: ModelSpec, plan: Plan, profile: FrameworkProfile) -> ModelSpec:
    """``model`` with the vocabulary rows the framework builds: Megatron pads to a multiple
    of make_vocab_size_divisible_by x TP (profile.vocab_divisible_by; explicit replicas:
    their largest TP, the one whose shards every rank must hold alike)."""
    if profile.vocab_divisible_by == 1:
        return model
    tp = plan.tp if plan.uniform else max(s.tp for r in plan.replicas for s in r.stages)
    return formulas.with_padded_vocab(model, profile.vocab_divisible_by * tp)


def _communicators(topo: Topology, lays: list[Layout]) -> list[tuple[str, GroupShape]]:
    """(axis, shape) of every communicator of the plan's layouts: TP per chunk, DP per
    pipeline rank, hybrid sharding's cross-group sync, and the costed plan-scope axes."""
    out: list[tuple[str, GroupShape]] = []
    for lay in lays:
        # the first pp chunks are the stages; later (virtual) chunks reuse their devices
        out += [("tp", topo.shape(c.devices[: c.tp])) for c in lay.chunks[: lay.pp] if c.tp > 1]
        out += [("dp", s) for s in lay.dp_shapes.values()]
        out += [("dp-cross", s) for s, _ in lay.cross.values()]
        out += [(name, s) for name, per in lay.axis_shapes.items() for s in per.values()]
    seen: set[tuple[str, int]] = set()
    unique = []
    for axis, s in out:  # one entry per (axis, shape): chunks of a stage share their TP shape
        if s.n > 1 and (axis, id(s)) not in seen:
            seen.add((axis, id(s)))
            unique.append((axis, s))
    return unique


def _experts(model: ModelSpec, plan: Plan, lay: Layout, precision: str, optimizer: str,
             profile: FrameworkProfile,
             split: expert_split.Split | None = None) -> dict[str, Any] | None:
    """The slowest layout's experts as ``hetpar simulate`` shows them (None without EP)."""
    if "ep" not in lay.axis_shapes:
        return None
    weight_bytes = state_bytes_per_param(precision, optimizer)[0]
    out = moe.summary(model, plan, lay.chunks, lay.pp, lay.axis_shapes["ep"], weight_bytes,
                      profile.moe_dispatcher)
    if split is not None:  # uneven: the counts, and this layout's busiest rank's experts
        local = max(split.by_replica[i] for i in lay.replicas)
        scale = local * len(split.counts) / model.n_experts  # of the even share
        out["experts_per_rank"] = list(split.counts)
        out["experts_per_gpu"] = local
        for k in ("expert_params_per_gpu", "expert_weights_gib"):
            out[k] = float(cast(float, out[k])) * scale
    return out


def _p2p_behaviour(plan: Plan, profile: FrameworkProfile) -> tuple[str, bool, bool]:
    """(p2p split, mask sent, lock-step blocking): a value the plan states wins over the
    framework's (None in the plan = the framework decides, catalog/frameworks/*.toml)."""
    split = plan.p2p_split if plan.p2p_split is not None else profile.p2p_split
    mask = plan.p2p_attention_mask if plan.p2p_attention_mask is not None \
        else profile.p2p_attention_mask
    lockstep_ok = schedules.traits(plan.schedule).lockstep and plan.vpp == 1
    if plan.p2p_blocking and not lockstep_ok:
        which = ", ".join(n for n in schedules.names() if schedules.traits(n).lockstep)
        raise ConfigError(
            f"plan: p2p_blocking times DeepSpeed's TrainSchedule (schedule {which}, vpp 1); "
            f"got schedule={plan.schedule!r}, vpp={plan.vpp}"
        )
    # A framework's lock-step engine is DeepSpeed's TrainSchedule (a schedule whose traits
    # say ``lockstep``); another schedule is timed by the event-driven executor instead.
    blocking = plan.p2p_blocking if plan.p2p_blocking is not None \
        else profile.p2p_blocking and lockstep_ok
    return split, mask, blocking


def _fields(obj: object) -> dict[str, Any]:
    return {k: getattr(obj, k) for k in obj.__dataclass_fields__}  # type: ignore[attr-defined]


def _uneven_notes(model: ModelSpec, lays: list[Layout]) -> set[str]:
    """Say so when an explicit stage's TP does not divide the heads: it is simulated as
    nonuniform TP (NTP, paced by its largest shard), which `hetpar run` and exports refuse."""
    out = set()
    for t in sorted({c.tp for lay in lays for c in lay.chunks}):
        # the widths feasibility.tp_shards checks (expert widths of Qwen-MoE included)
        widths = {"n_heads": model.n_heads, "ffn_hidden": model.ffn_hidden,
                  "moe_ffn_hidden": model.moe_ffn_hidden,
                  "shared_expert_ffn_hidden": model.shared_expert_ffn_hidden}
        bad = [f"{k}={v}" for k, v in widths.items() if v is not None and v % t]
        if bad:
            out.add(f"stage tp={t} does not divide {' / '.join(bad)}: simulated as nonuniform "
                    "TP (the largest shard paces it); `hetpar run` and framework exports need "
                    "divisible shapes")
    return out


def _check_precision(topo: Topology, lay: Layout, precision: str) -> None:
    """A precision the GPU has no peak for is a plan that does not fit that hardware."""
    for group in {c.group for c in lay.chunks}:
        gpu = topo.gpu(group)
        need = {gemm_precision(gpu, precision), attention_precision(gpu, precision)}
        missing = sorted(need - set(gpu.peak_tflops))
        if missing:
            raise Infeasible(
                "precision", f"{gpu.name} has no {missing[0]} peak for a {precision} plan; "
                f"supported: {', '.join(gpu.peak_tflops)}"
            )
