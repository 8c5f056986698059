"""The dropless MoE dispatcher's host sync: where it cuts a layer's forward, and what it costs."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hetpar.sim.profile import FrameworkProfile
    from hetpar.specs.model import ModelSpec

# A dropless MoE layer's dispatcher needs the tokens each rank sends and receives (and each
# local expert's count, which TransformerEngine's grouped GEMM takes as host integers) on the
# CPU, so the CPU waits for the GPU once per forward:
# - Megatron-Core MoEAlltoAllTokenDispatcher.preprocess: "Token dropless and enable ep. A
#   synchronization is needed before expert parallel AlltoAll communication to get the
#   `input_splits` and `output_splits` CPU values" (cuda_sync_point "before_ep_alltoall";
#   "before_finish" without EP); only drop-and-pad (moe_pad_expert_input_to_capacity) knows
#   every size in advance and does not sync.
# - DeepEP's normal dispatch (csrc/deep_ep.cpp, Buffer::intranode_dispatch / internode_dispatch:
#   "Synchronize total received tokens and tokens per expert", a host loop on the counters the
#   notify kernel writes to mapped memory) waits the same way, unless the caller passes
#   num_worst_tokens ("No CPU sync, just allocate the worst case").
# The backward reuses the forward's splits: no sync there.
POST_SYNC_GEMMS = frozenset({"expert_up", "expert_down", "shared_up", "shared_down",
                             "shared_gate", "mlp_up", "mlp_down"})
"""The GEMMs an MoE layer runs after the sync: the experts (the shared expert runs beside
the dispatched tokens, Megatron-Core MoELayer.forward); attention and the router run before."""

PRE_SYNC_DENSE_SHARE = 0.5
"""Of a layer's dense kernels (``FrameworkProfile.kernels_per_layer``), the share issued before
the sync: the attention block and the MLP's norm (9 of the 18 that megatron-core.toml lists:
norm + cast, QKV GEMM, RoPE, attention, cast, output GEMM, bias-dropout-add, its TP collective,
the MLP norm + cast)."""

PRE_SYNC_MOE_KERNELS = 5
"""Of ``hetpar.sim.moe.ROUTER_KERNELS`` (6), those before the sync: the router GEMM, its fused
top-k / score, the tokens-per-expert count, its copy to the host and the permute (the
unpermute follows the experts)."""


def host_sync(model: ModelSpec) -> bool:
    """Whether an MoE layer of ``model`` waits for the host each forward: dropless routing
    (no ``expert_capacity_factor``; a stated capacity factor means drop-and-pad, whose sizes
    are static)."""
    return model.n_experts > 1 and model.expert_capacity_factor is None


def forward_idle(profile: FrameworkProfile, dispatch: float, gpu: float, pre_gpu: float) -> float:
    """GPU idle of one dropless MoE layer's forward (kernel gaps not included).

    Without a sync the CPU issues a layer's ``dispatch`` seconds of launches ahead of the GPU's
    ``gpu`` seconds of work and the GPU waits max(0, dispatch - gpu). The sync splits the
    layer in two such windows: before it (``pre_gpu`` of GPU work), and after it, where the CPU
    starts with an empty queue, so the GPU waits at least for the first launch.
    """
    pre = (profile.kernels_per_layer * PRE_SYNC_DENSE_SHARE + PRE_SYNC_MOE_KERNELS) \
        * profile.kernel_dispatch_s
    return (max(0.0, pre - pre_gpu)
            + max(profile.kernel_dispatch_s, (dispatch - pre) - (gpu - pre_gpu)))
