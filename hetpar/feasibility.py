"""Whether a plan can run: named predicates with one result type, asked by simulate, plan, run.

Every predicate returns a ``Verdict(name, ok, reason, kind)``; ``kind`` is the
``Infeasible.kind`` the callers raise and count. ``simulate`` raises the first failed
verdict, ``hetpar plan`` prunes by the same predicates and counts removals by name
(``SearchStats.predicates``), and ``hetpar run`` (``runtime.layout.build_layout``, so also
``--dry-run``) raises the same verdict. ``PREDICATES`` lists them in the order they apply.

Decisions (one rule each, the same in all three):
- TP splits attention heads, KV heads and the MLP width evenly. KV heads are *not* replicated
  when tp > n_kv_heads: Megatron-Core divides ``num_query_groups`` by the TP size
  (``megatron/core/transformer/attention.py``, ``divide`` asserts divisibility) and
  torchtitan shards ``n_kv_heads // tp``. The vocabulary need not divide: Megatron pads it
  (``--make-vocab-size-divisible-by``) and the simulator costs the padded shard.
- Every stage of every plan meets ``tp_shards``, uniform or explicit, unless the plan says
  ``uneven_tp = true`` (explicit replicas only): nonuniform TP (Arfeen et al. 2025), which
  the simulator costs by the largest shard and ``hetpar failures --write-plan`` writes for
  NTP; the runtime cannot execute uneven shards and refuses them (``uneven_tp_ok=False``),
  the one capability difference, named by the same predicate.
- Context parallelism splits the sequence into 2 x cp load-balanced chunks (Megatron-Core's
  ``get_batch_on_this_cp_rank``), so seq_len % (2 cp) == 0 when cp > 1.
- Every model chunk holds at least one layer (n_layers >= pp x vpp), except that the
  simulator (``empty_ends_ok``) lets the first and the last chunk of an interleaved split
  (vpp > 1) hold only the embedding and only the LM head; every pipeline stage holds a layer,
  so simulate, plan, run, replay and failures refuse pp > n_layers alike
  (``specs.stage.EMPTY_END_CHUNKS``: Megatron-Core's account_for_embedding /
  account_for_loss_in_pipeline_split, Llama 3 Sec. 3.3.2). The runtime, the exports and the
  planner do not build empty chunks and keep the strict rule, the second capability
  difference named by the same predicate.
- TP inside one scale-up domain is a *planner restriction*, not feasibility: published runs
  put TP across nodes (runs.csv rows 125-129, 143). ``scale_up_domain`` has ``hard=False``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from hetpar import schedules
from hetpar.errors import Infeasible
from hetpar.feasibility_decoder import decoder_gaps as decoder_gaps  # its old home
from hetpar.specs import axes
from hetpar.specs.cluster import ClusterSpec
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import Plan
from hetpar.specs.stage import Stage, min_layers


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """One predicate's answer for one part of a plan."""

    name: str
    ok: bool
    reason: str = ""
    kind: str = "divisibility"
    """The ``Infeasible.kind`` a failure is raised and counted as."""

    def raise_if_failed(self) -> None:
        if not self.ok:
            raise Infeasible(self.kind, self.reason)


_OK: dict[str, Verdict] = {}


def _ok(name: str) -> Verdict:
    """The passing verdict of ``name`` (one shared object: the planner asks millions of times)."""
    v = _OK.get(name)
    if v is None:
        v = _OK[name] = Verdict(name=name, ok=True)
    return v


def tp_shards(model: ModelSpec, tp: int, *, uneven_tp_ok: bool = False) -> Verdict:
    """Heads, KV heads and MLP columns split evenly over ``tp`` ranks (no KV replication)."""
    if tp > 1 and model.ssm is not None:
        return _unsplit_ssm(model, "tp", tp)
    if uneven_tp_ok:
        return _ok("tp_shards")
    for what, n in (("n_heads", model.n_heads), ("n_kv_heads", model.n_kv_heads),
                    ("ffn_hidden", model.ffn_hidden), ("moe_ffn_hidden", model.moe_ffn_hidden),
                    ("shared_expert_ffn_hidden", model.shared_expert_ffn_hidden)):
        if n is not None and n % tp:
            return Verdict(name="tp_shards", ok=False,
                           reason=f"model {what} ({n}) not divisible by tp ({tp})")
    return _ok("tp_shards")


def layers_per_chunk(model: ModelSpec, pp: int, vpp: int, *,
                     empty_ends_ok: bool = False) -> Verdict:
    """Every one of the pp x vpp model chunks holds at least one layer; ``empty_ends_ok``:
    but the first and the last chunk of an interleaved split (vpp > 1), which may hold only
    the embedding / only the LM head; a whole pipeline stage never holds no layer
    (``specs.stage.min_layers``)."""
    if model.n_layers < (min_layers(pp, vpp) if empty_ends_ok else pp * vpp):
        return Verdict(name="layers_per_chunk", ok=False,
                       reason=f"{model.n_layers} layers < pp*vpp = {pp}*{vpp} chunks")
    return _ok("layers_per_chunk")


def empty_chunk(stages: Sequence[Stage]) -> Verdict:
    """``layers_per_chunk`` for explicit replicas: none of their stages is empty."""
    for st in stages:
        if st.n_layers == 0:
            return Verdict(name="layers_per_chunk", ok=False,
                           reason=f"a pipeline stage has no layers {list(st.layers)}")
    return _ok("layers_per_chunk")


def schedule_fit(schedule: str, pp: int, vpp: int, microbatches: int) -> Verdict:
    """The schedule's own limits (``Traits``): chunk shape, least pp, micro-batch multiple."""
    why = schedules.traits(schedule).problem(schedule, pp, vpp, microbatches)
    if why is None:
        return _ok("schedule")
    return Verdict(name="schedule", ok=False, reason=why, kind="schedule")


def _unsplit_ssm(model: ModelSpec, axis: str, degree: int) -> Verdict:
    # the simulator has no cost of a split selective scan: TP of the mixer's heads and groups
    # (Megatron-Core's MambaMixer) and CP of its recurrence over the sequence are not modelled
    return Verdict(name="tp_shards" if axis == "tp" else "context_split", ok=False,
                   reason=f"{axis}={degree} cannot split the ssm layers of model {model.name!r} "
                   f"({model.ssm.kind if model.ssm else ''} mixer): hetpar models state-space "
                   f"layers unsplit ({axis}=1)")


def context_split(seq_len: int, cp: int, model: ModelSpec | None = None) -> Verdict:
    """Load-balanced CP: the sequence splits into 2 x cp equal chunks; never over the
    recurrence of a ``model``'s state-space layers."""
    if cp > 1 and model is not None and model.ssm is not None:
        return _unsplit_ssm(model, "cp", cp)
    if cp > 1 and seq_len % (2 * cp):
        return Verdict(name="context_split", ok=False,
                       reason=f"seq_len ({seq_len}) not divisible by 2*cp ({2 * cp}) "
                       "(load-balanced CP)")
    return _ok("context_split")


def scale_up_domain(tp: int, domain_size: int, group: str) -> Verdict:
    """Planner restriction: a TP group sits inside one scale-up domain (TP traffic on NVLink)."""
    if tp <= domain_size and domain_size % tp == 0:
        return _ok("scale_up_domain")
    return Verdict(name="scale_up_domain", ok=False, kind="placement",
                   reason=f"tp={tp} does not fit the {domain_size}-GPU scale-up domain "
                   f"of group {group!r}")


def memory(need_bytes: float, capacity_bytes: float, where: str) -> Verdict:
    """The rank's parameters, gradients, optimizer states and activations fit its GPU."""
    if need_bytes <= capacity_bytes:
        return _ok("memory")
    return Verdict(name="memory", ok=False, kind="memory",
                   reason=f"{where} needs {need_bytes / 2**30:.1f} GiB > "
                   f"{capacity_bytes / 2**30:.1f} GiB")


def expert_split(model: ModelSpec, ep: int, degrees: Mapping[str, int]) -> Verdict:
    """EP (row ``ep``): ep divides the experts and the ranks it is carved from, dp x cp (x tp
    when etp = 1), torchtitan's rule (``distributed/parallel_dims.py``; ``placement.experts``)."""
    dp, cp, tp, etp = (degrees.get(k, 1) for k in ("dp", "cp", "tp", "etp"))
    room = dp * cp * (tp if etp == 1 else 1)
    shown = f"dp({dp}) x cp({cp})" + (f" x tp({tp})" if etp == 1 else "")
    why = ("" if ep == 1 else
           f"ep={ep} needs a mixture-of-experts model; {model.name} is dense (n_experts = 1)"
           if model.n_experts == 1 else
           f"ep={ep} does not divide n_experts={model.n_experts}" if model.n_experts % ep else
           f"ep={ep} does not divide {shown} = {room} (etp={etp})" if room % ep else "")
    return Verdict(name="expert_split", ok=False, reason=why) if why else _ok("expert_split")


def expert_tp(model: ModelSpec, etp: int, degrees: Mapping[str, int]) -> Verdict:
    """ETP (row ``etp``): 1 or the plan's tp (``placement.experts.check_experts``), dividing
    the expert width (Megatron-Core's expert_tensor_parallel_size)."""
    tp = degrees.get("tp", 1)
    why = ("" if etp == 1 else f"etp={etp} must be 1 or the tp degree ({tp})" if etp != tp else
           f"etp={etp} does not divide the expert width {model.expert_ffn}"
           if model.expert_ffn % etp else "")
    return Verdict(name="expert_tp", ok=False, reason=why) if why else _ok("expert_tp")


PREDICATES: dict[str, Callable[..., Verdict]] = {
    "tp_shards": tp_shards,
    "layers_per_chunk": layers_per_chunk,
    "schedule": schedule_fit,
    "context_split": context_split,
    "scale_up_domain": scale_up_domain,
    "memory": memory,
    "expert_split": expert_split,
    "expert_tp": expert_tp,
}
HARD = ("tp_shards", "layers_per_chunk", "schedule", "context_split", "memory",
        "expert_split", "expert_tp")
"""Predicates whose failure means the plan cannot run; ``scale_up_domain`` only steers.
A registered ``plan``-scope axis adds its predicate to ``PREDICATES`` (hard as well)."""


def axis_verdicts(model: ModelSpec, degrees: Mapping[str, int]) -> Iterator[Verdict]:
    """The verdict of every ``plan``-scope axis of ``specs/axes.py`` (none are built in):
    ``PREDICATES[axis.predicate](model, degree, degrees)``, ``degrees`` holding the plan's
    largest degree of every axis (tp, cp, dp, pp and the plan-scope ones)."""
    for a in axes.of_scope("plan"):
        yield PREDICATES[a.predicate](model, degrees.get(a.name, 1), degrees)


def degrees_of(plan: Plan) -> dict[str, int]:
    """The largest degree of every axis over ``plan``'s replicas (the degree, if uniform)."""
    if plan.uniform:
        out = {"tp": plan.tp, "cp": plan.cp, "dp": plan.dp, "pp": plan.pp}
    else:
        stages = [st for rep in plan.replicas for st in rep.stages]
        out = {"tp": max(st.tp for st in stages), "cp": max(st.cp for st in stages),
               "dp": len(plan.replicas), "pp": max(plan.pp_of(r) for r in plan.replicas)}
    out.update(axes.plan_degrees(plan))
    return out


def plan_verdicts(
    model: ModelSpec, plan: Plan, *, seq_len: int | None = None, uneven_tp_ok: bool = False,
    empty_ends_ok: bool = False,
) -> Iterator[Verdict]:
    """The structural verdicts (all but memory) of a uniform or explicit plan, in order.

    For explicit plans every replica is checked with its own pp, micro-batch count and
    per-stage TP/CP; ``uneven_tp_ok`` admits nonuniform TP in explicit replicas,
    ``empty_ends_ok`` a uniform plan's first and last chunk without layers.
    """
    seq = seq_len or model.seq_len
    if plan.uniform:
        m = plan.batch // (plan.dp * plan.micro_batch)  # Plan checked the divisibility
        yield tp_shards(model, plan.tp)
        yield layers_per_chunk(model, plan.pp, plan.vpp, empty_ends_ok=empty_ends_ok)
        yield schedule_fit(plan.schedule, plan.pp, plan.vpp, m)
        yield context_split(seq, plan.cp, model)
        yield from _plan_axes(model, plan)
        return
    # Replicas repeat a few shapes (hundreds of replicas on 1,024 GPUs): ask once per value.
    stages = [st for rep in plan.replicas for st in rep.stages]
    for tp in sorted({st.tp for st in stages}):
        yield tp_shards(model, tp, uneven_tp_ok=uneven_tp_ok)
    yield empty_chunk(stages)
    for pp, m in sorted({(plan.pp_of(rep), rep.num_microbatches) for rep in plan.replicas}):
        yield schedule_fit(plan.schedule, pp, plan.vpp, m)
    for cp in sorted({st.cp for st in stages}):
        yield context_split(seq, cp, model)
    yield from _plan_axes(model, plan)


def _plan_axes(model: ModelSpec, plan: Plan) -> Iterator[Verdict]:
    if axes.of_scope("plan"):  # none built in: the common case asks nothing
        yield from axis_verdicts(model, degrees_of(plan))


def check_plan(
    model: ModelSpec, plan: Plan, *, seq_len: int | None = None, uneven_tp_ok: bool = False,
    empty_ends_ok: bool = False,
) -> None:
    """Raise Infeasible with the first failed structural verdict of ``plan``."""
    for v in plan_verdicts(model, plan, seq_len=seq_len, uneven_tp_ok=uneven_tp_ok,
                           empty_ends_ok=empty_ends_ok):
        v.raise_if_failed()


def check_costed(model: ModelSpec, plan: Plan, *, seq_len: int | None = None) -> None:
    """``check_plan`` as every study that costs a plan asks it: simulate, replay (its start
    plan and every plan a policy switches to), failures (the plan under study) and the
    planner's final simulation. Uneven TP only where the plan says so (``Plan.uneven_tp``),
    empty end chunks only inside an interleaved stage (``specs.stage.min_layers``)."""
    check_plan(model, plan, seq_len=seq_len, uneven_tp_ok=plan.uneven_tp, empty_ends_ok=True)


def placement_verdicts(plan: Plan, cluster: ClusterSpec) -> Iterator[Verdict]:
    """``scale_up_domain`` for every stage of an expanded plan (planner restriction)."""
    for rep in plan.replicas:
        for st in rep.stages:
            yield scale_up_domain(st.tp, cluster.group(st.group).domain_size, st.group)
