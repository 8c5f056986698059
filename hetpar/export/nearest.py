"""The nearest uniform plan to an explicit one, and shared rules for what a framework keeps."""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable
from dataclasses import replace

from hetpar import feasibility, schedules
from hetpar.errors import ConfigError, Infeasible
from hetpar.specs import axes
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import Plan
from hetpar.specs.stage import Replica, split_layers

DEFAULT_ORDER = "tp-cp-dp-pp"


def _most_common(values: Iterable[int]) -> int:
    """The most frequent value; ties go to the larger (the safer choice for memory)."""
    counts = Counter(values)
    return max(counts, key=lambda v: (counts[v], v))


def to_uniform(plan: Plan, model: ModelSpec) -> tuple[Plan, list[str]]:
    """``plan`` as uniform degrees, with one warning per thing an explicit plan loses.

    Frameworks describe one replica shape repeated dp times, so per-stage TP/CP degrees,
    replicas of different shapes (NTP), uneven batch shares and uneven layer splits are
    replaced by their most common value or an even split.
    """
    if plan.uniform:
        return plan, []
    reps = plan.replicas
    lost: list[str] = []
    pps = [plan.pp_of(r) for r in reps]
    stages = [s for r in reps for s in r.stages]
    tp, cp, pp = (
        _most_common(s.tp for s in stages),
        _most_common(s.cp for s in stages),
        _most_common(pps),
    )
    if len({s.tp for s in stages}) > 1:
        lost.append(f"per-stage TP degrees {sorted({s.tp for s in stages})} -> tp={tp} everywhere")
    if len({s.cp for s in stages}) > 1:
        lost.append(f"per-stage CP degrees {sorted({s.cp for s in stages})} -> cp={cp} everywhere")
    if len(set(pps)) > 1:
        lost.append(f"replicas of different pipeline depths {sorted(set(pps))} -> pp={pp}")
    if len({_shape(plan, r) for r in reps}) > 1:
        lost.append(
            f"{len(reps)} replicas of different shapes (NTP) -> {len(reps)} identical replicas"
        )
    dp, micro = len(reps), _most_common(r.micro_batch for r in reps)
    total = plan.batch
    if len({r.batch for r in reps}) > 1:
        lost.append(f"uneven batch shares {[r.batch for r in reps]} -> even shares")
    if len({r.micro_batch for r in reps}) > 1:
        lost.append(f"micro-batch sizes {sorted({r.micro_batch for r in reps})} -> {micro}")
    while total % (dp * micro) and micro > 1:
        micro -= 1
    if total % (dp * micro):
        lost.append(f"global batch {total} not divisible by dp={dp}: -> {total - total % dp}")
        total -= total % dp
    even = split_layers(model.n_layers, pp * plan.vpp)
    odd = [r for r in reps if [s.layers for s in r.stages] != even]
    if odd:
        sizes = [b - a for a, b in (s.layers for s in odd[0].stages)]
        lost.append(f"layer split {sizes} -> even split {[b - a for a, b in even]}")
    out = replace(
        plan, replicas=(), tp=tp, cp=cp, pp=pp, dp=dp, micro_batch=micro, global_batch=total
    )
    if out.num_gpus() != plan.num_gpus():
        lost.append(f"the nearest uniform plan uses {out.num_gpus()} GPUs, not {plan.num_gpus()}")
    return out, lost


def _shape(plan: Plan, r: Replica) -> tuple[object, ...]:
    return tuple((s.tp, s.cp, s.layers) for s in r.stages) + (r.batch, r.micro_batch)


def placement_rules(plan: Plan) -> tuple[Plan, list[str]]:
    """Drop what no framework configuration carries: placement, rank order, failure policy."""
    lost = []
    if plan.group is not None:
        lost.append(f"node group {plan.group!r}: launch on that group's hosts yourself")
    if plan.on_failure != "ntp":
        lost.append(f"on_failure={plan.on_failure!r} is a hetpar runtime policy (not exported)")
    if plan.order != DEFAULT_ORDER:  # Megatron, torchtitan and DeepSpeed all nest tp innermost
        lost.append(f"rank order {plan.order!r} -> {DEFAULT_ORDER!r} (the frameworks' order)")
    return replace(plan, group=None, on_failure="ntp", order=DEFAULT_ORDER), lost


def schedule_rules(plan: Plan) -> tuple[Plan, list[str]]:
    """A schedule the plan cannot use becomes 1f1b, vpp=1; with pp == 1 the schedule is moot.

    Validity is what hetpar.schedules.build accepts (e.g. interleaved needs vpp >= 2 and
    a micro-batch count divisible by pp, as Megatron-LM does).
    """
    fallback = schedules.DEFAULT
    if plan.pp == 1 and (plan.schedule != fallback or plan.vpp != 1):
        note = f"schedule {plan.schedule!r} (vpp={plan.vpp}) has no effect with pp=1 -> {fallback}"
        return replace(plan, schedule=fallback, vpp=1), [note]
    m = plan.batch // (plan.dp * plan.micro_batch)
    try:
        schedules.build(plan.schedule, plan.pp, m, plan.vpp)
    except Infeasible as e:
        note = f"schedule {plan.schedule!r} cannot run this plan ({e.reason}) -> {fallback}, vpp=1"
        return replace(plan, schedule=fallback, vpp=1), [note]
    return plan, []


def sp_rules(plan: Plan) -> tuple[Plan, list[str]]:
    """Sequence parallelism splits along the TP group, so it needs tp > 1."""
    if plan.sequence_parallel and plan.tp == 1:
        return replace(plan, sequence_parallel=False), ["sequence_parallel needs tp > 1 -> off"]
    return plan, []


def inline(plan: Plan) -> str:
    """A uniform ``plan`` as the inline text ``--plan`` reads, for errors naming a plan."""
    text = (f"tp={plan.tp},pp={plan.pp},dp={plan.dp},cp={plan.cp},vpp={plan.vpp},"
            f"schedule={plan.schedule},gbs={plan.batch},mbs={plan.micro_batch},"
            f"zero={plan.zero},precision={plan.precision},recompute={plan.recompute}")
    text += ",sp=true" if plan.sequence_parallel else ""
    return text + "".join(f",{a}={d}" for a, d in plan.axes)


def with_degree(plan: Plan, axis: str, degree: int) -> Plan:
    """``plan`` with plan-scope ``axis`` at ``degree`` (1: left out, as ``Plan.axes`` keeps)."""
    kept = tuple((a, d) for a, d in plan.axes if a != axis)
    split = plan.split_at(degree) if axis == "ep" else plan.experts_per_rank
    return replace(plan, axes=kept + ((axis, degree),), experts_per_rank=split)


def unexported_axes(plan: Plan, model: ModelSpec, carries: Collection[str] | None,
                    label: str) -> None:
    """Refuse a ``plan``-scope axis (``specs/axes.py``) at a degree no target carries, or
    that this target does not carry (``carries``: its axes; None: every exported one), in
    one line naming the axis and the nearest plan (the axis at 1, made uniform)."""
    for a, d in axes.plan_degrees(plan):
        if d == 1:
            continue
        near = inline(to_uniform(with_degree(plan, a, 1), model)[0])
        if not axes.get(a).exported:
            raise ConfigError(f"export: {a}={d} is not exported by any target; allowed: 1; "
                              f"nearest plan: {near}")
        if carries is not None and a not in carries:
            raise ConfigError(f"export: {a}={d} is not carried by {label}; allowed: 1; "
                              f"nearest plan: {near}")


def uneven_experts(plan: Plan, model: ModelSpec, label: str) -> None:
    """Refuse an uneven expert split (``Plan.experts_per_rank``) in one line naming the field
    and the nearest plan (the even split): every target places n_experts / ep experts on each
    EP rank (Megatron-Core moe_layer.py ``num_local_experts = num_moe_experts // ep_size``;
    DeepSpeed moe/layer.py ``num_experts // self.ep_size``; torchtitan shards the experts'
    first dimension evenly over its ep mesh)."""
    split = plan.experts_per_rank
    if split == "even" or (isinstance(split, tuple) and len(set(split)) == 1):
        return
    shown = split if isinstance(split, str) else "/".join(map(str, split))
    near = inline(to_uniform(replace(plan, experts_per_rank="even"), model)[0])
    raise ConfigError(f"export: experts_per_rank={shown} is not carried by {label}, which "
                      f"places n_experts / ep experts on every EP rank; allowed: even; "
                      f"nearest plan: {near}")


def expert_room(plan: Plan, model: ModelSpec, room: int, label: str, why: str) -> None:
    """Refuse ep unless it divides the experts and ``room`` (the ranks ``label`` carves the
    expert-parallel group from, ``why`` naming them), in one line naming ep and the nearest
    plan: the largest ep below it that divides both."""
    ep = plan.degree("ep")
    if room % ep == 0 and model.n_experts % ep == 0:
        return
    near = max(d for d in range(1, ep + 1) if room % d == 0 and model.n_experts % d == 0)
    raise ConfigError(
        f"export: ep={ep} does not fit {label}: it must divide n_experts={model.n_experts} "
        f"and {why} = {room}; nearest plan: {inline(with_degree(plan, 'ep', near))}"
    )


def common(plan: Plan, model: ModelSpec, carries: Collection[str] | None = None,
           *, label: str) -> tuple[Plan, list[str]]:
    """The rules every target applies, in order (``carries``: the plan-scope axes it writes;
    ``label``: the target and version refusals name; required, so that no refusal says
    "this target")."""
    unexported_axes(plan, model, carries, label)
    uneven_experts(plan, model, label)
    if model.layer_kinds is not None:  # no target here writes a hybrid or Mamba model yet
        raise ConfigError(f"export: model {model.name!r} has layer_kinds "
                          f"{sorted(set(model.layer_kinds))}; the exports write attention+mlp "
                          "layers only (Megatron-LM's hybrid models are not exported)")
    lost: list[str] = []
    for rule in (lambda p: to_uniform(p, model), placement_rules, schedule_rules, sp_rules):
        plan, more = rule(plan)
        lost += more
    return plan, lost


def launch_shape(world: int, gpus_per_node: int | None) -> tuple[int, int]:
    """(nodes, processes per node) for ``world`` ranks: the most per node that divides world.

    At most ``gpus_per_node`` (from the cluster) or 8 per node.
    """
    cap = gpus_per_node or 8
    per = max(d for d in range(1, min(world, cap) + 1) if world % d == 0)
    return world // per, per


def divisible_plan(plan: Plan, n_layers: int, vpp: bool = True) -> str:
    """The inline plan nearest to ``plan`` on the same GPUs whose pipeline parts divide the
    layers evenly (closest pp, then closest vpp), for errors that name the nearest plan."""
    world = plan.pp * plan.dp
    best: tuple[tuple[int, int, int], int, int] | None = None
    for p in (d for d in range(1, world + 1) if world % d == 0):
        for v in range(1, (plan.vpp if vpp and p > 1 else 1) + 1):
            if n_layers % (p * v) or plan.batch % ((world // p) * plan.micro_batch):
                continue
            key = (abs(p - plan.pp), abs(v - plan.vpp), -p)
            if best is None or key < best[0]:
                best = (key, p, v)
    if best is None:
        return "none on these GPUs (the global batch does not divide over the replicas)"
    _, p, v = best
    schedule = schedules.default_for(v)
    return (f"tp={plan.tp},pp={p},dp={world // p},cp={plan.cp},vpp={v},schedule={schedule},"
            f"gbs={plan.batch},mbs={plan.micro_batch},zero={plan.zero},"
            f"precision={plan.precision},recompute={plan.recompute}"
            + "".join(f",{a}={d}" for a, d in _refit_ep(plan, world // p).axes))


def _refit_ep(plan: Plan, dp: int) -> Plan:
    """``plan``'s plan-scope axes with ``dp`` replicas: ep lowered to the largest degree that
    still divides the ranks it is carved from (dp x cp, x tp when etp = 1; the
    ``expert_split`` rule) and its own degree (so, the experts)."""
    ep = plan.degree("ep")
    room = dp * plan.cp * (plan.tp if plan.degree("etp") == 1 else 1)
    fit = max(d for d in range(1, ep + 1) if room % d == 0 and ep % d == 0)
    return with_degree(plan, "ep", fit) if fit != ep else plan


def even_tp(plan: Plan, model: ModelSpec) -> None:
    """Raise Infeasible unless the plan's TP splits heads, KV heads and MLP evenly, in every
    stage of an explicit plan too (unless it states ``uneven_tp``): the tp_shards rule
    simulate and run apply, which Megatron-LM and torchtitan also require (the DeepSpeed
    target instead leaves such a plan to the user's train.py, whose AutoTP may pad)."""
    tps = {plan.tp} if plan.uniform else {s.tp for r in plan.replicas for s in r.stages}
    for tp in sorted(tps):  # an explicit tp=3 stage was exported as the nearest tp=2 plan
        feasibility.tp_shards(model, tp, uneven_tp_ok=plan.uneven_tp).raise_if_failed()
