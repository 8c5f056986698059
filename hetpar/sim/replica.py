"""Per-rank costs of one data-parallel replica (one pipeline): chunk sums and p2p hand-overs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from hetpar import schedules
from hetpar.net.contention import overlap_delay, share_link
from hetpar.sim import network as net
from hetpar.sim.chunk import Chunk, ChunkCost, Context, chunk_cost
from hetpar.sim.layer import ACT_BYTES
from hetpar.sim.pipeline import RankTimes


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
    where = schedules.placement(ctx.schedule, pp, len(chunks) // pp)
    costs = _chunk_costs(ctx, chunks, pp, where)
    per = ChunkTimes(fwd=[c.fwd for c in costs], bwd=[c.bwd for c in costs],
                     wgt=[c.wgt for c in costs])
    parts = [dict.fromkeys(ctx.parts, 0.0) for _ in range(pp)]
    params = [0.0] * pp
    for j, (ch, c) in enumerate(zip(chunks, costs, strict=True)):
        r = where[j]
        params[r] += c.params_per_gpu
        for k, v in c.parts.items():
            parts[r][k] += v
        # no send where consecutive chunks share a rank (a V's turn on its last rank)
        if j + 1 < len(chunks) and pp > 1 and where[j + 1] != r:
            nxt = where[j + 1]
            tf, tb = _p2p(ctx, ch, chunks[j + 1])
            if ctx.zero >= 3:
                tf, tb = _contended(ctx, ch, chunks[j + 1], (r, nxt),
                                    (c, costs[j + 1]), (tf, tb))
            per.act_send.append(tf)
            per.grad_send.append(tb)
            per.fwd[j] += tf
            per.bwd[j + 1] += tb
            parts[r]["pp_comm"] += tf
            parts[nxt]["pp_comm"] += tb
            if ctx.p2p_blocking:
                # the receiver waits in RecvActivation / RecvGrad before it computes
                per.fwd[j + 1] += tf
                per.bwd[j] += tb
                parts[nxt]["pp_comm"] += tf
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
        parts[where[j]]["overhead"] += ctx.profile.microbatch_overhead_s
    own: list[list[int]] = [[] for _ in range(pp)]
    for j, r in enumerate(where):
        own[r].append(j)
    ranks = [
        RankTimes(sum(per.fwd[j] for j in js), sum(per.bwd[j] for j in js),
                  sum(per.wgt[j] for j in js))
        for js in own
    ]
    return ranks, parts, params, per


def _chunk_costs(ctx: Context, chunks: Sequence[Chunk], pp: int,
                 where: Sequence[int]) -> list[ChunkCost]:
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
            ch.group, shapes, id(ctx.dp_shapes.get(where[j])) if ctx.zero >= 3 else 0)
        if ctx.axes:  # costed axes price layer by layer, on each rank's own group
            key = (*key, ch.layers, where[j])
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


def _contended(ctx: Context, a: Chunk, b: Chunk, ranks: tuple[int, int],
               costs: tuple[ChunkCost, ChunkCost], sends: tuple[float, float]
               ) -> tuple[float, float]:
    """The sends a -> b (activation) and b -> a (gradient) of one micro-batch, late where
    they share a link with the ZeRO-3 traffic that the sending rank's DP group runs during
    that pass (one of its gathers in the forward, the other two thirds in the backward:
    chunk_cost's split); max-min fair sharing, ``net.contention.overlap_delay``."""
    topo = ctx.topo
    links = topo.send_busy(a.devices[0], b.devices[0])
    out = list(sends)
    for i, (rank, share) in enumerate(((ranks[0], 1 / 3), (ranks[1], 2 / 3))):
        dp = ctx.dp_shapes.get(rank)
        fsdp = costs[i].fsdp_comm * share
        if fsdp > 0 and dp is not None and share_link(links, topo.busy(dp)):
            out[i] += overlap_delay(out[i], fsdp)
    return out[0], out[1]
