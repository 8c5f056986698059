"""Per-chunk and per-rank costs of one data-parallel replica (one pipeline)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import astuple, dataclass, field

from hetpar import formulas
from hetpar.sim import axis_terms
from hetpar.sim import network as net
from hetpar.sim.layer import ACT_BYTES, embedding_time, head_time, layer_time
from hetpar.sim.memory import state_bytes_per_param
from hetpar.sim.network import Device, Topology
from hetpar.sim.pipeline import RankTimes
from hetpar.sim.profile import DEFAULT, FrameworkProfile
from hetpar.specs.axes import AxisDef
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
    axes: tuple[tuple[AxisDef, int], ...] = ()
    """The plan-scope axes with a cost and a degree > 1 (``specs.axes.costed``)."""
    axis_shapes: dict[str, dict[int, net.GroupShape]] = field(default_factory=dict)
    """Per such axis, per pipeline rank, the shape of its group (``Layout.axis_shapes``)."""

    @property
    def parts(self) -> tuple[str, ...]:
        """The per-rank terms: ``PARTS`` and every costed axis's breakdown key."""
        if not self.axes:
            return PARTS
        return PARTS + tuple(a.cost.key for a, _ in self.axes if a.cost)


@dataclass(frozen=True, slots=True)
class ChunkCost:
    """Seconds per micro-batch of one chunk, and their split by PARTS."""

    fwd: float
    bwd: float
    wgt: float
    parts: dict[str, float]
    params_per_gpu: float


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
                 axes: Sequence[tuple[AxisDef, int]] = ()) -> float:
    """Parameters of the chunk held by one of its GPUs (TP shards the matrices; a costed
    plan-scope axis divides its ``sharded_params`` by its degree)."""
    n = formulas.layers_params(model, ch.layers[0], ch.layers[1])
    cut = axis_terms.held_elsewhere(model, ch.layers, axes) if axes else 0.0
    if first:
        n += formulas.embedding_params(model)
    if last:  # the final norm, any h -> e projection and the LM head
        n += formulas.output_params(model)
        if pp == 1 and model.tied_embeddings:  # one stage holds the tied table once
            n -= formulas.word_embedding_params(model)
    return (n - cut) / ch.tp if cut else n / ch.tp


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
                    ctx.sequence_parallel, prof, moe)
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
    bwd_k = prof.backward_kernel_factor
    idle_f = max(0.0, prof.layer_dispatch_s - (lt.fwd + 2 * tp1 + cp_f)) + prof.layer_launch_s
    idle_b = max(0.0, prof.layer_dispatch_s * bwd_k
                 - (lt.bwd_input + lt.bwd_weight + 2 * tp1 + cp_b)) + 2 * prof.layer_launch_s
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
    # 2 TP collectives forward, 2 backward (Megatron's f/g operators), 2 more when the
    # forward is recomputed
    tp_f, tp_b = n * 2 * lc.tp, n * (4 if ctx.recompute == "full" else 2) * lc.tp
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
    params = chunk_params(m, ch, first, last, pp, ctx.axes)
    # Prefetched gathers run on the DP links beside everything the layer spends wall time on:
    # compute, the exposed TP / CP collectives, and the dispatch floor and kernel gaps (the
    # gather was issued ahead, so it proceeds while the GPU waits for the CPU's launches).
    busy = (comp_f + comp_b + comp_w + recompute + tp_f + tp_b
            + n * (lc.cp_f + lc.cp_b + lc.idle_f + lc.idle_b))
    fsdp = _fsdp_exposed(ctx, index % pp, params, n, busy)
    parts = {
        "compute": comp_f + comp_b + comp_w, "recompute": recompute, "tp_comm": tp_f + tp_b,
        "cp_comm": n * (lc.cp_f + lc.cp_b), "pp_comm": 0.0, "dp_comm": fsdp,
        "overhead": n * (lc.idle_f + lc.idle_b),
    }
    fwd = comp_f + tp_f + n * (lc.cp_f + lc.idle_f) + fsdp / 3
    bwd = comp_b + recompute + tp_b + n * (lc.cp_b + lc.idle_b) + 2 * fsdp / 3
    if ctx.axes:
        comm = axis_terms.comm(ctx.axes, ctx.axis_shapes, index % pp, ctx.model, ch.layers,
                               tokens, ch.tp, ACT_BYTES[ctx.precision], ctx.recompute)
        for key, (af, ab) in comm.items():
            parts[key] = af + ab
            fwd, bwd = fwd + af, bwd + ab
    return ChunkCost(fwd=fwd, bwd=bwd, wgt=comp_w, parts=parts, params_per_gpu=params)


def _fsdp_exposed(
    ctx: Context, rank: int, params: float, n_layers: int, compute: float
) -> float:
    """ZeRO-3: all-gather the weights in forward and backward (and again when a recomputed
    forward re-fetches them), reduce-scatter the gradients, every micro-batch, prefetched
    behind compute (Rajbhandari et al. 2020 Sec. 5.3; Zhao et al. 2023 for FSDP).

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
    return max(0.0, t - prof.zero3_prefetch * compute)


@dataclass(frozen=True, kw_only=True)
class ChunkTimes:
    """Per chunk (model order), seconds per micro-batch incl. its p2p sends and overheads."""

    fwd: list[float]
    bwd: list[float]
    wgt: list[float]
    act_send: list[float] = field(default_factory=list)
    """Per chunk boundary j -> j + 1: seconds to hand over the activation (one micro-batch)."""
    grad_send: list[float] = field(default_factory=list)
    """Per chunk boundary j -> j + 1: seconds to hand the gradient back from j + 1 to j."""


def rank_times(
    ctx: Context, chunks: Sequence[Chunk], pp: int
) -> tuple[list[RankTimes], list[dict[str, float]], list[float], ChunkTimes]:
    """Per pipeline rank: times per micro-batch, their parts, and parameters per GPU.

    Each rank sends its activations to the next chunk's rank after a forward and the gradient
    back after a backward (blocking p2p, as Megatron-LM's 1F1B); with TP the message is split
    over the TP ranks (Narayanan et al. 2021 Sec. 4.1 scatter/gather). Also returns the same
    times per chunk, for the event-driven timeline.
    """
    costs = _chunk_costs(ctx, chunks, pp)
    per = ChunkTimes(fwd=[c.fwd for c in costs], bwd=[c.bwd for c in costs],
                     wgt=[c.wgt for c in costs])
    parts = [dict.fromkeys(ctx.parts, 0.0) for _ in range(pp)]
    params = [0.0] * pp
    for j, (ch, c) in enumerate(zip(chunks, costs, strict=True)):
        r = j % pp
        params[r] += c.params_per_gpu
        for k, v in c.parts.items():
            parts[r][k] += v
        if j + 1 < len(chunks) and pp > 1:
            tf, tb = _p2p(ctx, ch, chunks[j + 1])
            per.act_send.append(tf)
            per.grad_send.append(tb)
            per.fwd[j] += tf
            per.bwd[j + 1] += tb
            parts[r]["pp_comm"] += tf
            parts[(j + 1) % pp]["pp_comm"] += tb
            if ctx.p2p_blocking:
                # the receiver waits in RecvActivation / RecvGrad before it computes
                per.fwd[j + 1] += tf
                per.bwd[j] += tb
                parts[(j + 1) % pp]["pp_comm"] += tf
                parts[r]["pp_comm"] += tb
    # The per-micro-batch overhead (schedule bookkeeping, a p2p handshake) is paid per chunk:
    # an interleaved schedule runs each of a rank's vpp chunks as its own virtual micro-batch
    # with its own forward_step call and blocking p2p exchange (Megatron-LM
    # core/pipeline_parallel/schedules.py forward_backward_pipelining_with_interleaving:
    # total_num_microbatches = num_microbatches * num_model_chunks, one
    # send_forward_backward_recv_forward_backward each; Narayanan et al. SC'21 Sec. 2.2.2:
    # interleaving multiplies the communication by v). A framework that overlaps those
    # exchanges (Megatron-Core overlap_p2p_comm, which NeMo's MegatronCommOverlapCallback
    # turns on whenever vpp > 1) shows it once per micro-batch per rank.
    once = ctx.profile.interleaved_p2p_overlap
    for j in range(min(pp, len(chunks)) if once else len(chunks)):
        per.fwd[j] += ctx.profile.microbatch_overhead_s
        parts[j % pp]["overhead"] += ctx.profile.microbatch_overhead_s
    ranks = [
        RankTimes(sum(per.fwd[r::pp]), sum(per.bwd[r::pp]), sum(per.wgt[r::pp]))
        for r in range(pp)
    ]
    return ranks, parts, params, per


def _chunk_costs(ctx: Context, chunks: Sequence[Chunk], pp: int) -> list[ChunkCost]:
    """Chunk costs, computing each structurally distinct chunk once (uniform plans repeat)."""
    memo: dict[tuple[object, ...], ChunkCost] = {}
    out = []
    n = len(chunks)
    moe = ctx.model.n_experts > 1
    for j, ch in enumerate(chunks):
        # Topology caches its GroupShapes, so identity stands for equality (and hashes fast).
        shapes = (0, 0)
        if ch.tp * ch.cp > 1:
            shapes = (id(ctx.topo.shape(ch.devices[: ch.tp])),
                      id(ctx.topo.shape(ch.devices[:: ch.tp])))
        key: tuple[object, ...] = (
            ch.n_layers, ch.layers if moe else None, j == 0, j == n - 1, ch.tp, ch.cp,
            ch.group, shapes, id(ctx.dp_shapes.get(j % pp)) if ctx.zero >= 3 else 0)
        if ctx.axes:  # costed axes price layer by layer, on each rank's own group
            key = (*key, ch.layers, j % pp)
        c = memo.get(key)
        if c is None:
            c = memo[key] = chunk_cost(ctx, ch, j, n, pp)
        out.append(c)
    return out


def _p2p(ctx: Context, a: Chunk, b: Chunk) -> tuple[float, float]:
    """(forward, backward) seconds of one micro-batch's hand-over from chunk a to chunk b.

    The forward send is charged to a, the gradient sent back to b. Under ``forward`` split
    (DeepSpeed) a's TP group all-gathers the activation on b's side and again on a's side
    before its backward (PartitionedTensor.full()), and sends the gradient whole.
    """
    tokens = ctx.micro_batch * (ctx.seq // a.cp)
    full = tokens * ctx.model.hidden * ACT_BYTES[ctx.precision]
    split = ctx.p2p_split
    fwd = full / a.tp if split != "none" else full
    bwd = full / a.tp if split == "scatter-gather" else full
    if ctx.p2p_attention_mask:
        # Megatron-LM v1.1.5 get_ltor_masks_and_position_ids builds one (1, 1, s, s) mask
        # for the micro-batch (its batch dimension is 1 unless reset_attention_mask)
        fwd += (ctx.seq // a.cp) * ctx.seq * 2.0
    path = ctx.topo.p2p_path(a.devices[0], b.devices[0])
    tf, tb = net.p2p(path, fwd), net.p2p(path, bwd)
    if split == "forward" and a.tp > 1:
        tf += net.all_gather(ctx.topo.shape(b.devices[: b.tp]), full)
        tb += net.all_gather(ctx.topo.shape(a.devices[: a.tp]), full)
    return tf, tb
