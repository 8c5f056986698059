"""What expert parallelism costs: dispatch / combine all-to-all, the experts' memory and load."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from hetpar import formulas, schedules
from hetpar.errors import ConfigError
from hetpar.sim import axis_costs
from hetpar.sim import network as net
from hetpar.sim.axis_costs import AxisCost, AxisLayer
from hetpar.specs import axes
from hetpar.specs.model import ModelSpec

if TYPE_CHECKING:
    from hetpar.sim.chunk import Chunk
    from hetpar.sim.profile import FrameworkProfile

# Max / mean expert load of a trained router, from Wang et al. 2024 ("Auxiliary-Loss-Free
# Load Balancing Strategy for Mixture-of-Experts", arXiv:2408.15664, Table 2: MaxVio_global
# = max load / mean load - 1 of the 3B models): 0.52 with the auxiliary balance loss, 0.04
# with the per-expert bias of DeepSeek-V3's loss-free balancing. The hottest expert bounds
# the hottest rank's load from above when a rank holds several experts.
AUX_LOSS_IMBALANCE = 1.52
LOSS_FREE_IMBALANCE = 1.04


def rank_load(model: ModelSpec, ep: int) -> float:
    """Max / mean tokens per EP rank of an MoE layer: the slowest rank paces the layer.

    1.0 at ep = 1 (every rank holds every expert). Otherwise the model's
    ``expert_load_imbalance``, else the published statistic of its router kind, capped by a
    capacity factor: an expert takes at most that multiple of the mean and drops the rest,
    which do no work (Fedus et al. 2021, Switch Transformer Sec. 2.2).
    """
    if ep == 1 or model.n_experts == 1:
        return 1.0
    load = model.expert_load_imbalance
    if load is None:
        load = LOSS_FREE_IMBALANCE if model.router_expert_bias else AUX_LOSS_IMBALANCE
    cap = model.expert_capacity_factor
    return min(load, cap) if cap is not None else load


def experts_of(model: ModelSpec, plan: object) -> tuple[int, int, float]:
    """(ep, etp, load) of ``plan``'s experts for ``formulas.layer_gemms``: at ep = 1 the
    experts split over tp as the dense MLP (etp 0: Megatron-Core's default
    expert_tensor_parallel_size = tensor_model_parallel_size)."""
    d = dict(axes.plan_degrees(plan))
    ep = d.get("ep", 1)
    if ep == 1:
        return (1, 0, 1.0)
    return (ep, d.get("etp", 1), rank_load(model, ep))


def dispatch_bytes(layer: AxisLayer) -> float:
    """Bytes one GPU sends in one dispatch (or combine) all-to-all of an MoE layer.

    Each of its tokens goes to its top-k experts (Megatron-Core ``MoEAlltoAllTokenDispatcher``:
    one all-to-all before the experts, one after). With TP the ranks hold tokens / tp each
    (Megatron-Core requires sequence parallelism with MoE and TP). The hottest rank receives
    ``rank_load`` x the mean, times ``layer.share`` under an uneven expert split (its busiest
    receiver paces the exchange). ``net.all_to_all`` sends the (n-1)/n that leaves the GPU.
    """
    m = layer.model
    if not formulas.is_moe_layer(m, layer.layer):
        return 0.0
    tokens = layer.tokens / layer.tp
    return (tokens * m.experts_per_token * m.hidden * layer.element_bytes
            * rank_load(m, layer.degree) * layer.share)


def _deepep(shape: net.GroupShape, layer: AxisLayer) -> float:
    """DeepEP's dispatch (or combine) on an EP group spanning nodes (DeepSeek-V3 report,
    arXiv:2412.19437 Sec. 3.2.2; deepseek-ai/DeepEP README, normal kernels): a token crosses
    the network once per remote node holding one of its experts, then NVLink forwards it to
    each expert's GPU there. With E experts spread evenly over the group's N nodes, a token's
    top-k (uniform, without replacement) touch N (1 - C(E - E/N, k) / C(E, k)) of them."""
    m = layer.model
    levels = [lv for lv in shape.levels if lv.size > 1]
    nbytes = dispatch_bytes(layer)
    if len(levels) < 2 or nbytes == 0:  # inside one node: the NVLink kernels, as NCCL's
        return net.all_to_all(shape, nbytes)
    tokens_bytes = nbytes / m.experts_per_token  # one copy of each token the rank sends
    n, g = shape.n, levels[0].size
    nodes, per_node, miss = n // g, m.n_experts / (n // g), 1.0
    for i in range(m.experts_per_token):
        miss *= max(0.0, m.n_experts - per_node - i) / (m.n_experts - i)
    touched = nodes * (1 - miss)
    t = nbytes * (g - 1) / g / levels[0].path.bandwidth  # the NVLink forward in each node
    below = g
    for lv in levels[1:]:  # the node copies leaving each unit of the level below
        t = max(t, tokens_bytes * touched * (n - below) / n / lv.path.bandwidth)
        below *= lv.size
    return max(lv.path.latency for lv in levels) + t


DISPATCHERS = {
    "alltoall": lambda shape, layer: net.all_to_all(shape, dispatch_bytes(layer)),
    "deepep": _deepep,
}
"""Seconds of one dispatch or combine, by ``FrameworkProfile.moe_dispatcher``."""


def dispatch_time(shape: net.GroupShape, layer: AxisLayer, profile: FrameworkProfile) -> float:
    """One dispatch or combine as the framework's dispatcher runs it (what its EP overlap
    hides, ``FrameworkProfile.ep_overlap``, is taken off per chunk: ``EP_COST.overlap``)."""
    run = DISPATCHERS.get(profile.moe_dispatcher)
    if run is None:
        raise ConfigError(f"framework {profile.name}: moe_dispatcher="
                          f"{profile.moe_dispatcher!r} unknown; allowed: {', '.join(DISPATCHERS)}")
    return run(shape, layer)


# Forward kernels an MoE layer issues beyond the dense layer's MLP (which
# FrameworkProfile.kernels_per_layer counts), read off Megatron-Core's MoE layer
# (megatron/core/transformer/moe/router.py, token_dispatcher.py MoEAlltoAllTokenDispatcher,
# moe_utils.py): the router's GEMM and its fused top-k / score, the tokens-per-expert count
# and its copy to the host (the dropless dispatcher sizes its all-to-all on the CPU), the
# permute and unpermute; across an EP group also the two all-to-alls and the sort of the
# received chunks into expert order and back. A shared expert adds its two GEMMs and
# activation.
ROUTER_KERNELS = 6
EP_EXCHANGE_KERNELS = 4
SHARED_EXPERT_KERNELS = 3


def moe_kernels(model: ModelSpec, ep: int, profile: FrameworkProfile, local: int = 0) -> float:
    """Forward kernels of one MoE layer beyond a dense layer's (``FrameworkProfile``'s
    ``kernels_per_layer``): routing, dispatch and combine, and the experts' GEMMs.

    With ``expert_gemm = "per_expert"`` each of the rank's n_experts / ep experts (``local``
    of them under an uneven split) is one GEMM launch per matrix: TransformerEngine's
    GroupedLinear runs its grouped GEMM as nvte_multi_stream_cublas_gemm, a loop issuing one
    cuBLAS GEMM per expert over 4 streams (transformer_engine/common/gemm/cublaslt_gemm.cu);
    the dense MLP's 2 GEMMs are in ``kernels_per_layer`` already. ``"grouped"``: one kernel
    per matrix, as the dense MLP.
    """
    if model.n_experts == 1:
        return 0.0
    n = float(ROUTER_KERNELS + (EP_EXCHANGE_KERNELS if ep > 1 else 0))
    if model.shared_expert_ffn_hidden:
        n += SHARED_EXPERT_KERNELS
    if profile.expert_gemm == "per_expert":
        n += 2 * ((local or model.n_experts // ep) - 1)
    return n


def routed_params(model: ModelSpec, i: int) -> float:
    """The routed experts' parameters of layer ``i`` (EP divides them; shared experts,
    router and attention stay whole)."""
    if not formulas.is_moe_layer(model, i):
        return 0.0
    return float(model.n_experts * formulas.expert_params(model))


DISPATCHER_SMS = {"deepep": 20}
"""SMs a dispatcher's kernels hold, where its framework states them: DeepEP's 20
(Megatron-Core TransformerConfig.moe_deepep_num_sms = 20, "Number of SMs to use for DeepEP";
the DeepSeek-V3 report, arXiv:2412.19437 Sec. 3.2.2, gives its kernels 20 of the H800's 132).
NCCL's all-to-all (``alltoall``) is left out: its channel count is NCCL's choice, not stated."""

def a2a_beside(one: float, attention: float, mlp: float) -> float:
    """Seconds of one MoE layer's 4 all-to-alls (``one`` each) that Megatron-Core's combined
    1F1B hides beside the other micro-batch's compute, column by column of its two streams
    (Megatron-Core model_chunk_schedule_plan.py, TransformerLayerSchedulePlan.run docstring:
    comm "combine_bwd | dispatch_fwd->dispatch_bwd | combine_fwd" beside compute "attn_fwd |
    mlp_bwd->mlp_bwd_dw->mlp_fwd | attn_bwd"); a backward is twice its forward. The attention
    node runs the router and the permute too (``LayerTime.pre_sync``)."""
    return min(one, attention) + min(2 * one, 3 * mlp) + min(one, 2 * attention)


EP_COST = AxisCost(key="ep_comm", word="ep-link", op="all_to_all", nbytes=dispatch_bytes,
                   calls=(2, 2), sharded_params=routed_params, time=dispatch_time,
                   overlap=lambda profile: profile.ep_overlap, hidden=a2a_beside,
                   overlap_sms=lambda profile: DISPATCHER_SMS.get(profile.moe_dispatcher, 0),
                   expert_view=True)
"""Dispatch and combine in the forward, their gradients in the backward (Lepikhin et al.
2021, GShard Sec. 2.2: two all-to-alls per MoE layer each way), not overlapped by default.
Megatron-Core's --overlap-moe-expert-parallel-comm runs one micro-batch's forward beside
another's backward in the steady 1F1B phase, so each one's all-to-alls run under the other's
compute (Megatron-Core MoE README, "EP A2A overlap"; DeepSeek-V3 report arXiv:2412.19437
Sec. 3.2.1, DualPipe's paired chunks): ``ep_overlap`` of what ``a2a_beside`` pairs with compute is
hidden, each hidden second paying the SMs the dispatcher holds (``DISPATCHER_SMS``,
``sim.axis_terms.comm``)."""

axis_costs.register("ep", EP_COST)


def expert_params_per_gpu(model: ModelSpec, chunk: Chunk,
                          experts: tuple[int, int, float], local: int = 0) -> float:
    """The routed experts of ``chunk`` one of its GPUs holds: / ep (``local`` / n_experts
    under an uneven split), / etp (0: tp)."""
    ep, etp, _ = experts
    routed = sum(routed_params(model, i) for i in range(*chunk.layers))
    held = routed * local / model.n_experts if local else routed / ep
    return held / (etp or chunk.tp)


def span(shape: net.GroupShape) -> str:
    """Where a group's ranks sit, innermost first: '8 x nvlink' or '8 x nvlink, 4 x ib'."""
    parts = [f"{lv.size} x {lv.path.kind.name if lv.path.kind else 'link'}"
             for lv in shape.levels if lv.size > 1]
    return ", ".join(parts) or "one GPU"


ALGORITHM = {
    "alltoall": "NCCL all-to-all (concurrent sends to every peer)",
    "deepep": "DeepEP (each token once per remote node, then NVLink)",
}
"""What ``hetpar simulate`` calls each dispatcher's algorithm."""


def summary(model: ModelSpec, plan: object, chunks: Sequence[Chunk], pp: int,
            shapes: Mapping[int, net.GroupShape], weight_bytes: float,
            dispatcher: str = "alltoall") -> dict[str, object]:
    """What ``hetpar simulate`` shows of an EP plan's experts: the all-to-all's algorithm and
    group, the experts per GPU, the slowest rank's load and the expert weights per GPU (the
    largest pipeline rank's, as the memory rows count them: routed experts / ep / etp)."""
    ep, etp, load = experts_of(model, plan)
    per_rank = [0.0] * pp
    where = schedules.placement(str(getattr(plan, "schedule", "")), pp, len(chunks) // pp)
    for j, c in enumerate(chunks):
        per_rank[where[j]] += expert_params_per_gpu(model, c, (ep, etp, load))
    worst = max(range(pp), key=lambda p: per_rank[p])
    return {
        "ep": ep, "etp": dict(axes.plan_degrees(plan)).get("etp", 1),
        "experts_per_gpu": model.n_experts // ep, "rank_load": load,
        "all_to_all": ALGORITHM[dispatcher],
        "ep_group": span(shapes[worst]),
        "expert_params_per_gpu": per_rank[worst],
        "expert_weights_gib": per_rank[worst] * weight_bytes / 2**30,
    }
