"""Contention inside the iteration: traffic beside the overlapped gradient sync on a shared link."""

from __future__ import annotations

from collections.abc import Mapping

from hetpar.net.contention import overlap_delay, share_link
from hetpar.sim.chunk import Context, tp_collectives
from hetpar.sim.layout import Layout
from hetpar.sim.replica import ChunkTimes


def sync_contention(ctx: Context, lay: Layout, r: int, parts: Mapping[str, float],
                    per: ChunkTimes, hidden_sync: float) -> tuple[float, float]:
    """(TP, pipeline) seconds by which rank ``r``'s last backward runs late because its
    traffic shares a link with the data-parallel sync that overlaps that backward.

    A framework that overlaps the gradient sync with the backward (``dp_grad_overlap``)
    reduces buckets while the last micro-batch's backward still issues its TP collectives
    and sends its input gradient to the previous stage. Where those use a link the DP
    communicator also uses (``Topology.busy``: a GPU's NVLink ports or PCIe link, a PCIe
    switch uplink, host memory, a shared NIC), the two share it max-min fairly and the
    backward's transfers are late by ``overlap_delay`` of the two link times. Which
    communicators share which link is read once per shape (cached), not per event.
    """
    dp = lay.dp_shapes.get(r)
    if hidden_sync <= 0 or dp is None or dp.n <= 1:
        return 0.0, 0.0
    topo = ctx.topo
    dp_links = topo.busy(dp)
    ch = lay.chunks[r]
    tp = 0.0
    if ch.tp > 1 and share_link(topo.busy(topo.shape(ch.devices[: ch.tp])), dp_links):
        fwd, bwd = tp_collectives(ctx.recompute)
        tp = parts["tp_comm"] * bwd / (fwd + bwd) / ctx.vpp  # one chunk's last backward
    pp = 0.0
    if r >= 1 and per.grad_send and share_link(
            topo.send_busy(ch.devices[0], lay.chunks[r - 1].devices[0]), dp_links):
        pp = per.grad_send[r - 1]
    late = overlap_delay(tp + pp, hidden_sync)
    if late <= 0:
        return 0.0, 0.0
    return late * tp / (tp + pp), late * pp / (tp + pp)
