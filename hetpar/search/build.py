"""Turn a costed candidate into a hetpar Plan: batch shares, chunk ranges, device layout."""

from __future__ import annotations

from hetpar.errors import Infeasible
from hetpar.placement import LAYOUTS
from hetpar.search.candidates import Candidate, Knobs
from hetpar.search.split import batch_shares, chunk_ranges
from hetpar.search.structures import Slot, layout_offsets
from hetpar.specs.cluster import ClusterSpec
from hetpar.specs.expand import expand
from hetpar.specs.job import Job
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import Plan
from hetpar.specs.stage import Replica, Stage, split_layers

ORDER = LAYOUTS
"""The uniform Plan ``order`` of each layout of ``layout_offsets`` (``placement.LAYOUTS``)."""


def plan_name(c: Candidate) -> str:
    """A short human-readable name for the plan of candidate ``c``."""
    s, k = c.structure, c.knobs
    if s.uniform is not None:
        tp, pp, dp = s.uniform
        body = f"tp{tp} pp{pp} dp{dp}"
    else:
        body = " + ".join(f"{cc.count}x[" + ",".join(_runs(cc.ranks)) + "]" for cc in s.classes)
    sp = "/group" if k.zero_scope == "group" else ""
    sp += " sp" if k.sequence_parallel else ""
    sp += " pp-inner" if s.layout == "pp-inner" else ""
    return (
        f"{s.family}: {body} cp{k.cp}{k.axes_label(' ')} mb{k.micro_batch} {k.schedule}"
        f"{f' v{k.vpp}' if k.vpp > 1 else ''} rc={k.recompute} zero{k.zero}{sp}"
    )


def _runs(ranks: tuple) -> list[str]:
    out: list[str] = []
    prev, n = None, 0
    for slot in (*ranks, None):
        cur = None if slot is None else (slot.group, slot.tp)
        if cur == prev:
            n += 1
            continue
        if prev is not None:
            out.append(f"{prev[0]}/tp{prev[1]}" + (f"*{n}" if n > 1 else ""))
        prev, n = cur, 1
    return out


def shares(c: Candidate, unit: int, global_batch: int) -> list[tuple[int, int]]:
    """Per replica (class-major): its class index and its micro-batches, equalising times;
    equal with expert parallelism (an EP group's replicas run one micro-batch count:
    ``sim.ep_groups.check_lockstep``; the uneven expert split balances them instead)."""
    reps = [ci for ci, cc in enumerate(c.classes) for _ in range(cc.cls.count)]
    units = global_batch // c.knobs.micro_batch // unit
    if dict(c.knobs.axes).get("ep", 1) > 1:
        if units % len(reps):
            raise Infeasible("divisibility", f"ep > 1 needs equal batch shares: {units} "
                             f"share units over {len(reps)} replicas")
        return [(ci, units // len(reps) * unit) for ci in reps]
    fns = [lambda k, cc=c.classes[ci]: cc.replica_time(k * unit) for ci in reps]
    res = batch_shares(fns, units)
    if res is None:
        raise Infeasible(
            "divisibility", f"global batch gives {units} share units < {len(reps)} replicas"
        )
    return [(ci, k * unit) for ci, k in zip(reps, res[0], strict=True)]


def build_plan(
    c: Candidate,
    model: ModelSpec,
    job: Job,
    unit: int,
    per_rep: list[tuple[int, int]] | None = None,
    *,
    cluster: ClusterSpec | None = None,
) -> Plan:
    """The hetpar Plan of candidate ``c``: uniform when it is uniform, else explicit.

    ``per_rep`` (class index, micro-batches) per replica overrides the solved shares. A
    uniform structure whose replicas cannot share the batch equally (80 replicas, 1024
    sequences) becomes the same layout with uneven shares, which needs ``cluster``.
    """
    k, s = c.knobs, c.structure
    name = plan_name(c)
    if s.uniform is not None:
        tp, pp, dp = s.uniform
        even = (job.global_batch // k.micro_batch) % (dp * unit) == 0 and per_rep is None
        base = k.plan(precision=job.precision, name=name, tp=tp, pp=pp, dp=dp, cp=k.cp,
                      order=ORDER[s.layout],
                      global_batch=job.global_batch if even else dp * k.micro_batch)
        if even:
            return base
        assert cluster is not None, "uneven uniform shares need the cluster"
        if per_rep is None:
            per_rep = shares(c, unit, job.global_batch)
        return uneven_uniform(base, s.classes, per_rep, model, cluster, job.global_batch)
    if per_rep is None:
        per_rep = shares(c, unit, job.global_batch)
    if _is_uniform(c, per_rep, model):
        cc = c.classes[0]
        return k.plan(precision=job.precision, name=name, tp=cc.cls.ranks[0].tp,
                      pp=cc.cls.pp, dp=cc.cls.count, cp=k.cp, global_batch=job.global_batch,
                      group=cc.cls.ranks[0].group, order=ORDER[cc.cls.layout])
    replicas = _replicas(c, per_rep)
    return k.plan(precision=job.precision, name=name, replicas=tuple(replicas),
                  global_batch=job.global_batch)


def _is_uniform(c: Candidate, per_rep: list[tuple[int, int]], model: ModelSpec) -> bool:
    if len(c.classes) != 1 or len({m for _, m in per_rep}) != 1:
        return False
    cc = c.classes[0]
    if len({(r.group, r.tp) for r in cc.cls.ranks}) != 1:
        return False
    pp, vpp = cc.cls.pp, c.knobs.vpp
    equal = split_layers(model.n_layers, pp * vpp)
    return chunk_ranges(cc.split.layers, vpp) == equal


def _replicas(c: Candidate, per_rep: list[tuple[int, int]]) -> list[Replica]:
    """Explicit replicas with devices from ``layout_offsets`` (TP innermost, so a TP block
    never straddles a scale-up domain: TP divides the domain size by the tier rule)."""
    k = c.knobs
    offsets = layout_offsets([cc.cls for cc in c.classes], k.cp)
    out: list[Replica] = []
    seen: dict[int, int] = {}
    for ci, m in per_rep:
        cc = c.classes[ci]
        i = seen.get(ci, 0)
        seen[ci] = i + 1
        stages = []
        for j, rng in enumerate(chunk_ranges(cc.split.layers, k.vpp)):
            r = j % cc.cls.pp
            slot = cc.cls.ranks[r]
            first = offsets[(ci, i, r)]
            devices = tuple(range(first, first + slot.tp * k.cp))
            stages.append(Stage(layers=rng, group=slot.group, tp=slot.tp, cp=k.cp, devices=devices))
        out.append(
            Replica(stages=tuple(stages), batch=m * k.micro_batch, micro_batch=k.micro_batch)
        )
    return out


def uneven_uniform(
    base: Plan,
    classes: tuple,
    per_rep: list[tuple[int, int]],
    model: ModelSpec,
    cluster: ClusterSpec,
    global_batch: int,
) -> Plan:
    """Uniform plan ``base`` laid out by ``expand`` with per-replica micro-batch counts
    ``per_rep`` (class index, micro-batches; class-major as ``shares`` returns them)."""
    index = {c.ranks: ci for ci, c in enumerate(classes)}
    queue: dict[int, list[int]] = {}
    for ci, m in per_rep:
        queue.setdefault(ci, []).append(m)
    replicas = []
    for rep in expand(base, model, cluster).replicas:
        ci = index[tuple(Slot(group=st.group, tp=st.tp) for st in rep.stages[: base.pp])]
        m = queue[ci].pop(0)
        replicas.append(Replica(stages=rep.stages, batch=m * base.micro_batch,
                                micro_batch=base.micro_batch))
    return Knobs.of(base).plan(precision=base.precision, name=base.name,
                               replicas=tuple(replicas), global_batch=global_batch)
