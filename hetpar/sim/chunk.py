"""Per-chunk costs of one micro-batch: layers, TP / CP collectives, dispatch idle, ZeRO-3."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import astuple, dataclass, field

from hetpar import formulas, schedules
from hetpar.sim import axis_terms
from hetpar.sim import network as net
from hetpar.sim.axis_costs import Charged
from hetpar.sim.layer import ACT_BYTES, embedding_time, head_time, layer_time
from hetpar.sim.memory import state_bytes_per_param
from hetpar.sim.moe import moe_kernels, routed_params
from hetpar.sim.moe_sync import forward_idle, host_sync
from hetpar.sim.network import Device, Topology
from hetpar.sim.profile import DEFAULT, FrameworkProfile
from hetpar.specs.model import ModelSpec

PARTS = ("compute", "recompute", "tp_comm", "cp_comm", "pp_comm", "dp_comm", "overhead")
"""The built-in per-rank terms; ``Context.parts`` adds each costed plan-scope axis's key."""


@dataclass(frozen=True, slots=True)
class Chunk:
    """One model chunk placed on devices: layers [start, end) on a tp x cp group."""

    layers: tuple[int, int]
    group: str
    tp: int
    cp: int
    devices: tuple[Device, ...]
    """tp-major: devices[c * tp + t] is TP rank t of CP rank c."""

    @property
    def n_layers(self) -> int:
        return self.layers[1] - self.layers[0]


@dataclass(frozen=True, kw_only=True)
class Context:
    """Everything about the plan and job that every chunk cost needs."""

    model: ModelSpec
    topo: Topology
    seq: int
    micro_batch: int
    precision: str
    optimizer: str
    recompute: str
    sequence_parallel: bool
    zero: int
    schedule: str
    vpp: int
    dp_sizes: dict[int, int] = field(default_factory=dict)
    """Per pipeline rank, the size of the ZeRO-3 sharding group (for FSDP traffic)."""
    dp_shapes: dict[int, net.GroupShape] = field(default_factory=dict)
    grad_reduce_bytes: float | None = None
    """Bytes per gradient element in the DP all-reduce (None = the gradients' own size)."""
    p2p_split: str = "scatter-gather"
    """Plan.p2p_split: how TP ranks split the stage-to-stage activations and gradients."""
    p2p_attention_mask: bool = False
    p2p_blocking: bool = False
    """Plan.p2p_blocking: transfers also count on the receiving chunk's time."""
    profile: FrameworkProfile = DEFAULT
    """The framework's behaviour and the fitted overheads (sim/profile.py)."""
    axes: tuple[tuple[Charged, int], ...] = ()
    """The plan-scope axes with a cost and a degree > 1 (``sim.axis_costs.costed``)."""
    axis_shapes: dict[str, dict[int, net.GroupShape]] = field(default_factory=dict)
    """Per such axis, per pipeline rank, the shape of its group (``Layout.axis_shapes``)."""
    experts: tuple[int, int, float] = (1, 0, 1.0)
    """(ep, etp, load) of the MoE layers' experts (``formulas.layer_gemms``)."""
    local_experts: int = 0
    """Experts per MoE layer this layout's busiest rank holds under an uneven split
    (``sim.expert_split``); 0: the even n_experts / ep."""
    a2a_share: float = 1.0
    """Max / mean tokens an EP rank receives under that split (``Split.a2a_share``)."""

    @property
    def parts(self) -> tuple[str, ...]:
        """The per-rank terms: ``PARTS`` and every costed axis's breakdown key."""
        if not self.axes:
            return PARTS
        return PARTS + tuple(a.cost.key for a, _ in self.axes)


@dataclass(frozen=True, slots=True)
class ChunkCost:
    """Seconds per micro-batch of one chunk, and their split by PARTS."""

    fwd: float
    bwd: float
    wgt: float
    parts: dict[str, float]
    params_per_gpu: float
    fsdp_comm: float = 0.0
    """ZeRO-3 gathers and reduce-scatters per micro-batch on the DP links, hidden or not
    (what a pipeline send sharing those links runs beside, ``replica._contended``)."""


def _tp_comm(ctx: Context, ch: Chunk, tokens: int) -> float:
    """One TP all-reduce (or all-gather + reduce-scatter with SP: same bytes) of b s h."""
    if ch.tp == 1:
        return 0.0
    shape = ctx.topo.shape(ch.devices[: ch.tp])
    nbytes = tokens * ctx.model.hidden * ACT_BYTES[ctx.precision]
    return net.all_reduce(shape, nbytes)


def _cp_comm(ctx: Context, ch: Chunk, tokens: int) -> float:
    """Ring attention: cp - 1 steps, each passing this rank's K and V shard (Liu et al. 2023)."""
    if ch.cp == 1:
        return 0.0
    shape = ctx.topo.shape(ch.devices[:: ch.tp])
    path = shape.outer or shape.inner
    kv = ctx.model.n_kv_heads * ctx.model.dim_head
    nbytes = tokens * 2 * kv / min(ch.tp, ctx.model.n_kv_heads) * ACT_BYTES[ctx.precision]
    return (ch.cp - 1) * net.p2p(path, nbytes)


def chunk_params(model: ModelSpec, ch: Chunk, first: bool, last: bool, pp: int,
                 axes: Sequence[tuple[Charged, int]] = (),
                 experts: tuple[int, int, float] = (1, 0, 1.0), local: int = 0) -> float:
    """Parameters of the chunk held by one of its GPUs (TP shards the matrices; a costed
    plan-scope axis divides its ``sharded_params`` by its degree; routed experts split over
    etp, not tp: ``experts`` = (ep, etp, load), etp 0 = tp; ``local``: the experts it holds
    of an uneven split, 0: n_experts / ep)."""
    n = formulas.layers_params(model, ch.layers[0], ch.layers[1])
    cut = axis_terms.held_elsewhere(model, ch.layers, axes) if axes else 0.0
    if first:
        n += formulas.embedding_params(model)
    if last:  # the final norm, any h -> e projection and the LM head
        n += formulas.output_params(model)
        if pp == 1 and model.tied_embeddings:  # one stage holds the tied table once
            n -= formulas.word_embedding_params(model)
    held = (n - cut) / ch.tp if cut else n / ch.tp
    ep, etp, _ = experts
    if etp and etp != ch.tp:  # the routed experts are whole on each of the tp ranks
        routed = sum(routed_params(model, i) for i in range(*ch.layers))
        held += routed / ep * (1 / etp - 1 / ch.tp)
    if local:  # an uneven split: local / n_experts of the routed experts, not 1 / ep
        routed = sum(routed_params(model, i) for i in range(*ch.layers))
        held += routed * (local / model.n_experts - 1 / ep) / (etp or ch.tp)
    return held


def tp_collectives(recompute: str) -> tuple[int, int]:
    """TP collectives per layer in the forward and the backward: 2 each (Megatron's f/g
    operators, Shoeybi et al. 2019 Fig. 4), 2 more in the backward when it recomputes the
    forward."""
    return 2, 4 if recompute == "full" else 2


@dataclass(frozen=True, slots=True)
class LayerCost:
    """Seconds of one layer for one micro-batch on one GPU, communication included."""

    fwd: float
    bwd_input: float
    bwd_weight: float
    tp: float
    """One TP collective (a layer issues 2 forward and 2 backward)."""
    cp_f: float
    cp_b: float
    idle_f: float
    idle_b: float
    recompute: float
    """The extra forward work recompute adds to the backward (without its collectives)."""


def layer_cost(ctx: Context, ch: Chunk) -> LayerCost:
    """Compute, exposed TP / CP communication and dispatch idle of one layer of ``ch``: the
    mean over its layers, dense and mixture-of-experts (formulas.is_moe_layer) alike."""
    n, k = ch.n_layers, formulas.moe_layers_in(ctx.model, *ch.layers)
    if k == 0 or k == n:
        return _layer_cost(ctx, ch, k > 0)
    dense, moe = (astuple(_layer_cost(ctx, ch, e)) for e in (False, True))
    return LayerCost(*(((n - k) * d + k * e) / n for d, e in zip(dense, moe, strict=True)))


def _layer_cost(ctx: Context, ch: Chunk, moe: bool) -> LayerCost:
    gpu = ctx.topo.gpu(ch.group)
    tokens = ctx.micro_batch * (ctx.seq // ch.cp)
    prof = ctx.profile
    lt = layer_time(ctx.model, gpu, ctx.precision, ctx.micro_batch, ctx.seq, ch.tp, ch.cp,
                    ctx.sequence_parallel, prof, moe, ctx.experts if moe else (1, 0, 1.0),
                    ctx.local_experts if moe else 0)
    # A TP collective overlapped with its neighbouring GEMM (Megatron-Core tp_comm_overlap
    # splits the GEMM and pipelines the chunks' all-gather / reduce-scatter with it, Wang et
    # al. 2022 "Overlap communication with dependent computation") shows only beyond that
    # GEMM; a layer's 2 collectives per pass each have about half its GEMM time beside them.
    tp1 = max(0.0, _tp_comm(ctx, ch, tokens) - prof.tp_overlap * lt.gemm / 2)
    cp1 = _cp_comm(ctx, ch, tokens)
    # Ring attention hides the KV exchange behind attention compute; backward moves K, V
    # and their gradients against twice the compute.
    cp_f = max(0.0, cp1 - prof.cp_overlap * lt.attn_fwd)
    cp_b = max(0.0, 2 * cp1 - prof.cp_overlap * 2 * lt.attn_fwd)
    # A layer's kernels (compute and collectives) never run faster than the framework issues
    # them (the CPU dispatch floor: kernels x dispatch time), and the gaps between kernels
    # add to the GPU time (kernels x gap); both from the profile.
    # An MoE layer issues more (moe.moe_kernels: routing, dispatch, one GEMM per expert).
    bwd_k = prof.backward_kernel_factor
    kernels = prof.kernels_per_layer + (moe_kernels(ctx.model, ctx.experts[0], prof,
                                                    ctx.local_experts) if moe else 0.0)
    graphed = prof.cuda_graphs and not (moe and host_sync(ctx.model))  # one launch a layer
    dispatch = 0.0 if graphed else kernels * prof.kernel_dispatch_s
    launch = kernels * prof.kernel_gap_s
    idle_f = max(0.0, dispatch - (lt.fwd + 2 * tp1 + cp_f)) + launch
    if moe and host_sync(ctx.model):  # the dropless dispatcher waits for the host once
        idle_f = forward_idle(prof, dispatch, lt.fwd + 2 * tp1 + cp_f,
                              lt.pre_sync + tp1 + cp_f) + launch
    idle_b = max(0.0, dispatch * bwd_k
                 - (lt.bwd_input + lt.bwd_weight + 2 * tp1 + cp_b)) + 2 * launch
    recompute = 0.0
    if ctx.recompute == "full":
        recompute = lt.fwd + idle_f
    elif ctx.recompute == "selective":
        recompute = lt.selective
    return LayerCost(fwd=lt.fwd, bwd_input=lt.bwd_input, bwd_weight=lt.bwd_weight, tp=tp1,
                     cp_f=cp_f, cp_b=cp_b, idle_f=idle_f, idle_b=idle_b, recompute=recompute)


def chunk_cost(ctx: Context, ch: Chunk, index: int, n_chunks: int, pp: int) -> ChunkCost:
    """Forward, input-backward and weight-backward seconds of one chunk for one micro-batch."""
    gpu = ctx.topo.gpu(ch.group)
    m, n = ctx.model, ch.n_layers
    tokens = ctx.micro_batch * (ctx.seq // ch.cp)
    lc = layer_cost(ctx, ch)
    comp_f, comp_b, comp_w = n * lc.fwd, n * lc.bwd_input, n * lc.bwd_weight
    per_f, per_b = tp_collectives(ctx.recompute)
    tp_f, tp_b = n * per_f * lc.tp, n * per_b * lc.tp
    first, last = index == 0, index == n_chunks - 1
    if first:
        e = embedding_time(m, gpu, ctx.precision, tokens)
        comp_f += e
        comp_b += e
    if last:
        hf, hb = head_time(m, gpu, ctx.precision, tokens, ch.tp, ctx.profile)
        comp_f += hf
        comp_b += hb
    recompute = n * lc.recompute
    params = chunk_params(m, ch, first, last, pp, ctx.axes, ctx.experts, ctx.local_experts)
    # Prefetched gathers run on the DP links beside everything the layer spends wall time on:
    # compute, the exposed TP / CP collectives, and the dispatch floor and kernel gaps (the
    # gather was issued ahead, so it proceeds while the GPU waits for the CPU's launches).
    busy = (comp_f + comp_b + comp_w + recompute + tp_f + tp_b
            + n * (lc.cp_f + lc.cp_b + lc.idle_f + lc.idle_b))
    rank = schedules.placement(ctx.schedule, pp, n_chunks // pp)[index]
    fsdp_comm = _fsdp_comm(ctx, rank, params, n)
    fsdp = max(0.0, fsdp_comm - ctx.profile.zero3_prefetch * busy)
    parts = {
        "compute": comp_f + comp_b + comp_w, "recompute": recompute, "tp_comm": tp_f + tp_b,
        "cp_comm": n * (lc.cp_f + lc.cp_b), "pp_comm": 0.0, "dp_comm": fsdp,
        "overhead": n * (lc.idle_f + lc.idle_b),
    }
    fwd = comp_f + tp_f + n * (lc.cp_f + lc.idle_f) + fsdp / 3
    bwd = comp_b + recompute + tp_b + n * (lc.cp_b + lc.idle_b) + 2 * fsdp / 3
    if ctx.axes:
        moe = m.n_experts > 1  # what another micro-batch's collectives run beside: one layer
        lt = layer_time(m, gpu, ctx.precision, ctx.micro_batch, ctx.seq, ch.tp, ch.cp,
                        ctx.sequence_parallel, ctx.profile, moe,
                        ctx.experts if moe else (1, 0, 1.0),
                        ctx.local_experts if moe else 0)
        comm = axis_terms.comm(ctx.axes, ctx.axis_shapes, rank, m, ch.layers, tokens, ch.tp,
                               ACT_BYTES[ctx.precision], ctx.recompute, ctx.profile,
                               beside=(lt.pre_sync, lt.fwd - lt.pre_sync), sm_count=gpu.sm_count,
                               share=ctx.a2a_share)
        for key, (af, ab) in comm.items():
            parts[key] = af + ab
            fwd, bwd = fwd + af, bwd + ab
    return ChunkCost(fwd=fwd, bwd=bwd, wgt=comp_w, parts=parts, params_per_gpu=params,
                     fsdp_comm=fsdp_comm)


def _fsdp_comm(ctx: Context, rank: int, params: float, n_layers: int) -> float:
    """ZeRO-3: all-gather the weights in forward and backward (and again when a recomputed
    forward re-fetches them), reduce-scatter the gradients, every micro-batch; the caller
    hides the prefetched part behind compute (Rajbhandari et al. 2020 Sec. 5.3; Zhao et al.
    2023 for FSDP).

    Each pass issues ``zero3_collectives_per_layer`` collectives per layer. NCCL runs
    all-gather and reduce-scatter as rings only (NCCL docs: trees serve all-reduce), so each
    pays n - 1 step latencies; at a data-parallel degree of 1,000+ that latency, not the
    bytes, bounds DeepSpeed's per-module fetches.
    """
    d = ctx.dp_sizes.get(rank, 1)
    if ctx.zero < 3 or d <= 1:
        return 0.0
    prof = ctx.profile
    shape = ctx.dp_shapes[rank]
    wb, gb, _ = state_bytes_per_param(ctx.precision, ctx.optimizer)
    gathers = 3 if prof.zero3_regather_on_recompute and ctx.recompute == "full" else 2
    t = gathers * net.all_gather(shape, params * wb) + net.reduce_scatter(shape, params * gb)
    steps = (shape.n - 1) if shape.outer is not None else 0
    t += (gathers + 1) * prof.zero3_collectives_per_layer * max(n_layers, 1) * steps * (
        prof.collective_step_latency_s)
    return t
