"""One replica structure's iteration: pipeline makespan, exposed DP sync, optimizer, memory."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache

from hetpar import formulas, schedules
from hetpar.sim import lockstep, moe
from hetpar.sim import network as net
from hetpar.sim.chunk import Context
from hetpar.sim.contend import sync_contention
from hetpar.sim.ep_groups import EDP
from hetpar.sim.layout import Layout
from hetpar.sim.memory import MemoryRow, RankLoad, rank_memory, state_bytes_per_param
from hetpar.sim.pipeline import RankTimes, in_flight_layers, makespan
from hetpar.sim.replica import ChunkTimes, rank_times
from hetpar.specs.model import ModelSpec

EXACT_MAX_ACTIONS = 20000
"""Explicit plans with at most this many (rank, micro-batch, chunk) slots use the executor."""


@dataclass(frozen=True, kw_only=True)
class ReplicaResult:
    """One simulated replica structure (shared by every replica with the same key)."""

    time: float
    """Pipeline makespan plus its exposed gradient sync and optimizer step."""
    pipeline: float
    tail: float
    critical_rank: int
    parts: dict[str, float]
    memory: tuple[MemoryRow, ...]
    rank_times: tuple[tuple[float, float, float], ...]
    tail_parts: tuple[float, float]
    """(exposed DP sync, optimizer) of the rank that finishes last."""
    chunk_times: ChunkTimes
    rank_tails: tuple[tuple[float, float], ...]
    """Per rank: (gradient sync seconds, optimizer seconds) after its last backward."""
    num_microbatches: int
    lockstep: lockstep.Times | None = None
    """(fwd, bwd, act, grad) per stage when the pipeline ran lock-step (sim/lockstep.py)."""



def simulate_replica(ctx: Context, lay: Layout) -> ReplicaResult:
    """Pipeline makespan, gradient sync, optimizer and memory of one replica structure."""
    pp, m = lay.pp, lay.batch // lay.micro_batch
    ranks, parts, params, per_chunk = rank_times(ctx, lay.chunks, pp)
    # Stages of equal structure (layer counts within one, as an even split gives) use the
    # closed form (speed); stages that differ in width, GPU type or by more than one layer
    # are timed exactly by the event-driven executor when that stays cheap.
    widths = {(c.tp, c.cp, c.group) for c in lay.chunks}
    layers = [c.n_layers for c in lay.chunks]
    uneven = len(widths) > 1 or max(layers) - min(layers) > 1
    exact = uneven and pp * m * ctx.vpp <= EXACT_MAX_ACTIONS
    steps = None
    if ctx.p2p_blocking and pp > 1:
        steps = _lockstep(ranks, per_chunk)
        pipe = lockstep.makespan(*steps, m)
    else:
        pipe = makespan(ctx.schedule, ranks, m, ctx.vpp, exact=exact)
    crit = max(range(pp), key=lambda r: ranks[r].total)
    wb, gb, ob = state_bytes_per_param(ctx.precision, ctx.optimizer)
    rb = ctx.grad_reduce_bytes or gb
    tied = _tied_sync(ctx, lay, gb)
    experts = _expert_params(ctx, lay, pp)
    last = schedules.placement(ctx.schedule, pp, len(lay.chunks) // pp)[-1]
    tail, tail_parts = 0.0, (0.0, 0.0)
    slack = 0.0
    late_shown = pipe_late = 0.0
    tails = []
    memo: dict[tuple[object, ...], tuple[float, float]] = {}
    for r in range(pp):
        # Rank r's last backward ends before rank 0's by the backward of ranks < r (its
        # slack); dp_grad_overlap x its last micro-batch's backward hides part of the sync
        # (buckets fire as gradients are ready, PyTorch DDP / Megatron overlap_grad_reduce).
        key = (params[r], id(lay.dp_shapes.get(r)), lay.reshard.get(r), lay.chunks[r].group,
               lay.dp_sizes.get(r), id(lay.cross.get(r)), experts[r])  # hybrid: per-rank groups
        if key not in memo:
            memo[key] = (_dp_sync(ctx, lay, r, params[r] * rb, params[r] * wb, experts[r] * rb),
                         _optimizer_time(ctx, lay, r, params[r], wb, gb, ob, experts[r]))
        sync, opt = memo[key]
        prof = ctx.profile
        window = prof.dp_grad_overlap * (ranks[r].bwd + ranks[r].wgt) / ctx.vpp
        exposed = max(0.0, sync - window)
        gather = 0.0
        if ctx.zero in (1, 2) and prof.dp_param_gather_overlap > 0:
            # Megatron-Core overlap_param_gather: the updated weights' all-gather runs under
            # the next iteration's forward, bucket by bucket as the layers need them.
            gather = _param_gather(ctx, lay, r, params[r] * wb)
            exposed = max(0.0, exposed - min(gather, prof.dp_param_gather_overlap
                                             * ranks[r].fwd))
        # traffic of the last backward that shares a link with the overlapped sync is late;
        # a gather that runs under the next forward is not beside this backward
        late_tp, late_pp = sync_contention(ctx, lay, r, parts[r], per_chunk,
                                           min(max(0.0, sync - gather), window))
        # The tied-embedding reduce pairs the first and last ranks, so the last one waits
        # for rank 0's final backward: no slack hides its tail.
        hidden = slack
        if tied and r in (0, last):
            sync, exposed = sync + tied, exposed + tied
            hidden = 0.0 if r == last else slack
        tails.append((sync, opt))
        # a late gradient send holds up the previous stage's last backward, and so the
        # chain down to rank 0 that ends the pipeline: no slack hides it
        pipe_late = max(pipe_late, late_pp)
        if exposed + late_tp + opt - hidden > tail:
            # what shows beyond the pipeline: the slack hides the sync first, then the TP
            # collectives it made late, then the step
            shown_tp = min(late_tp, max(0.0, exposed + late_tp - hidden))
            shown_sync = max(0.0, exposed + late_tp - hidden) - shown_tp
            tail = exposed + late_tp + opt - hidden
            tail_parts = (shown_sync + shown_tp, tail - shown_sync - shown_tp)
            late_shown = shown_tp
        slack += (ranks[r].bwd + ranks[r].wgt) / ctx.vpp
    total = dict.fromkeys(ctx.parts, 0.0)
    for k in ctx.parts:
        total[k] = m * parts[crit][k]
    total["bubble"] = max(0.0, pipe - m * ranks[crit].total)
    total["tp_comm"] += late_shown
    total["pp_comm"] += pipe_late
    total["dp_comm"] += max(0.0, tail_parts[0] - late_shown)
    pipe += pipe_late
    total["optimizer"] = tail_parts[1]
    memory = _memories(ctx, lay, m, params, experts)
    return ReplicaResult(
        time=pipe + tail, pipeline=pipe, tail=tail, critical_rank=crit, parts=total,
        memory=memory, rank_times=tuple((x.fwd, x.bwd, x.wgt) for x in ranks),
        tail_parts=tail_parts, chunk_times=per_chunk, rank_tails=tuple(tails),
        num_microbatches=m, lockstep=steps,
    )


def _lockstep(ranks: list[RankTimes], per: ChunkTimes) -> lockstep.Times:
    """Inputs of DeepSpeed's lock-step TrainSchedule (sim/lockstep.py): rank times without
    the transfers that blocking p2p put on both ends, and the transfers per boundary."""
    act, grad, pp = per.act_send, per.grad_send, len(ranks)
    fwd = [ranks[r].fwd - (act[r] if r < pp - 1 else 0.0) - (act[r - 1] if r else 0.0)
           for r in range(pp)]
    bwd = [ranks[r].bwd + ranks[r].wgt - (grad[r] if r < pp - 1 else 0.0)
           - (grad[r - 1] if r else 0.0) for r in range(pp)]
    return tuple(fwd), tuple(bwd), tuple(act), tuple(grad)


def _expert_params(ctx: Context, lay: Layout, pp: int) -> list[float]:
    """Per pipeline rank, the routed expert parameters per GPU an EP plan reduces over its
    expert-data-parallel group (0 without EP)."""
    out = [0.0] * pp
    if EDP in lay.axis_shapes:
        where = schedules.placement(ctx.schedule, pp, len(lay.chunks) // pp)
        for j, ch in enumerate(lay.chunks):
            out[where[j]] += moe.expert_params_per_gpu(ctx.model, ch, ctx.experts,
                                                       ctx.local_experts)
    return out


def _dp_sync(ctx: Context, lay: Layout, rank: int, grad_bytes: float, w_bytes: float,
             expert_bytes: float = 0.0) -> float:
    """Gradient synchronisation of one rank over its DP group after the last backward.

    ZeRO-0: all-reduce; ZeRO-1/2: reduce-scatter of gradients + all-gather of updated
    weights (Rajbhandari et al. 2020); ZeRO-3 synchronises every micro-batch instead.
    Replicas with a different TP degree reshard first (one pass over the gradient bytes on
    the scale-up link). With EP the routed experts' ``expert_bytes`` (of ``grad_bytes``) are
    all-reduced over the expert-data-parallel group instead, the ranks holding the same
    experts (torchtitan's ``edp`` mesh dimension; Megatron-Core's expert data parallel group).
    """
    shape = lay.dp_shapes.get(rank, net.LOCAL)
    t = _cross_sync(lay, rank, grad_bytes)
    if ctx.zero >= 3:
        return t
    if expert_bytes:
        edp = lay.axis_shapes[EDP][rank]
        # their share of the weights' all-gather (ZeRO-1/2) follows the same group
        w_share = w_bytes * expert_bytes / grad_bytes
        t += (net.all_reduce(edp, expert_bytes) if ctx.zero == 0 else
              net.reduce_scatter(edp, expert_bytes) + net.all_gather(edp, w_share))
        grad_bytes, w_bytes = grad_bytes - expert_bytes, w_bytes - w_share
    if shape.n <= 1:
        return t
    if ctx.zero == 0:
        t += net.all_reduce(shape, grad_bytes)
    else:
        t += net.reduce_scatter(shape, grad_bytes) + net.all_gather(shape, w_bytes)
    if lay.reshard.get(rank, False):
        t += grad_bytes / shape.inner.bandwidth
    return t


def _cross_sync(lay: Layout, rank: int, grad_bytes: float) -> float:
    """Hybrid sharding (zero_scope = 'group'): after the reduce-scatter inside each node
    group, the ranks holding the same shard all-reduce it across the groups (PyTorch FSDP
    HYBRID_SHARD's all-reduce over the replicate group); every shard crosses at once, each
    rank over its own link, so one such all-reduce of the largest shard paces them."""
    hit = lay.cross.get(rank)
    if hit is None:
        return 0.0
    shape, smallest = hit
    return net.all_reduce(shape, grad_bytes / smallest)


def _tied_sync(ctx: Context, lay: Layout, grad_bytes: float) -> float:
    """All-reduce of the tied word-embedding gradient between the first and the last pipeline
    rank, after the pipeline drains and before the data-parallel reduce (DeepSpeed
    PipelineEngine ``_exec_reduce_tied_grads`` -> ``PipelineModule.allreduce_tied_weight_
    gradients``, on the 16-bit ``.grad``; Megatron-LM ``_allreduce_word_embedding_grads``,
    Narayanan et al. 2021). Vocabulary-parallel: each TP rank reduces its V/tp x h shard."""
    if lay.pp <= 1 or not ctx.model.tied_embeddings:
        return 0.0
    first, end = lay.chunks[0], lay.chunks[-1]
    shape = ctx.topo.shape([first.devices[0], end.devices[0]])
    nbytes = ctx.model.vocab * ctx.model.hidden / first.tp * grad_bytes
    return net.all_reduce(shape, nbytes)


def _param_gather(ctx: Context, lay: Layout, rank: int, w_bytes: float) -> float:
    """The all-gather of updated weights in a ZeRO-1/2 gradient sync."""
    shape = lay.dp_shapes.get(rank, net.LOCAL)
    return net.all_gather(shape, w_bytes) if shape.n > 1 else 0.0


def _optimizer_time(
    ctx: Context, lay: Layout, rank: int, params: float, wb: float, gb: float, ob: float,
    experts: float = 0.0,
) -> float:
    """Adam step: memory-bound read of grads + states, write of states + weights, on this
    rank's (ZeRO-sharded) share of the parameters (the routed ``experts`` over edp)."""
    d = lay.dp_sizes.get(rank, 1) if ctx.zero >= 1 else 1
    de = _edp_size(lay, rank) if ctx.zero >= 1 else 1
    gpu = ctx.topo.gpu(lay.chunks[rank].group)
    nbytes = ((params - experts) / d + experts / de) * (gb + 2 * ob + wb)
    return nbytes / (gpu.memory_bandwidth * gpu.memory_efficiency(nbytes))


def _memories(ctx: Context, lay: Layout, m: int, params: list[float],
              experts: list[float]) -> tuple[MemoryRow, ...]:
    """Memory of every pipeline rank (ranks with equal loads computed once)."""
    out: list[MemoryRow] = []
    memo: dict[tuple[object, ...], MemoryRow] = {}
    last = (len(lay.chunks) - 1) % lay.pp
    for r in range(lay.pp):
        chunks = lay.chunks[r :: lay.pp]
        flight = in_flight_layers(ctx.schedule, lay.pp, m, ctx.vpp, r,
                                  tuple(c.n_layers for c in lay.chunks))
        n_layers = sum(c.n_layers for c in chunks)
        key = (params[r], flight, n_layers, r == 0, r == last, chunks[0].tp, chunks[0].cp,
               chunks[0].group, lay.dp_sizes.get(r, 1), experts[r])
        row = memo.get(key)
        if row is None:
            gpu = ctx.topo.gpu(chunks[0].group)
            load = RankLoad(
                n_layers=n_layers, first=r == 0, last=r == last, tp=chunks[0].tp,
                cp=chunks[0].cp, in_flight_layers=flight,
                params=params[r],
                layer_params=_max_layer_params(ctx.model, ctx.experts[0], _edp_size(lay, r)),
                expert_params=experts[r], expert_dp=_edp_size(lay, r),
            )
            row = memo[key] = rank_memory(
                ctx.model, load, replica=0, rank=r, capacity=gpu.memory_bytes,
                precision=ctx.precision, optimizer=ctx.optimizer, zero=ctx.zero,
                # ZeRO shards over data x context parallel ranks, which hold the same
                # weights (Megatron-Core's data-parallel-with-CP group; torchtitan's
                # dp_shard_cp mesh).
                dp=lay.dp_sizes.get(r, 1) * chunks[0].cp, recompute=ctx.recompute,
                sequence_parallel=ctx.sequence_parallel, micro_batch=ctx.micro_batch,
                seq=ctx.seq, profile=ctx.profile,
            )
        out.append(row if row.rank == r else dataclasses.replace(row, rank=r))
    return tuple(out)


def _edp_size(lay: Layout, rank: int) -> int:
    """Ranks of pipeline rank ``rank``'s expert-data-parallel group (1 without EP)."""
    shapes = lay.axis_shapes.get(EDP)
    return shapes[rank].n if shapes else 1


@lru_cache(maxsize=1024)
def _max_layer_params(model: ModelSpec, ep: int = 1, edp: int = 1) -> float:
    """Parameters of the largest layer ZeRO-3 gathers on a GPU to run it (every layer: dense
    and MoE layers mix). With expert parallelism a GPU holds only its routed experts (/ ep)
    and gathers them over the expert-data-parallel group, not at all where that group is one
    rank (torchtitan's parallelize_llama: the experts' fully_shard runs on the edp mesh, the
    rest of the block on dp; Megatron-FSDP shards expert parameters over expt_dp likewise)."""
    if ep == 1:
        return float(max(formulas.layer_params(model, i) for i in range(model.n_layers)))
    def gathered(i: int) -> float:
        routed = moe.routed_params(model, i)
        return formulas.layer_params(model, i) - routed + (routed / ep if edp > 1 else 0.0)
    return max(gathered(i) for i in range(model.n_layers))
