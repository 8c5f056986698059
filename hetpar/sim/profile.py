"""Framework profiles: how the software that runs a plan changes its speed and memory.

A profile is resolved from two data files: ``catalog/frameworks/<name>.toml`` states what a
framework does (attention kernel, which collectives it overlaps, how ZeRO-3 gathers, which
GEMMs run in FP8, how many kernels a layer issues), each with its source;
``catalog/fit/simulator.toml`` holds the few free parameters fitted on published runs
(``hetpar validate RUNS --fit PATH``). The simulator takes the resolved ``FrameworkProfile``
as an argument, never module globals.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

from hetpar.errors import ConfigError
from hetpar.io import from_dict, read_document

FRAMEWORKS_DIR = Path(__file__).resolve().parent.parent / "catalog" / "frameworks"
FITTED_PATH = Path(__file__).resolve().parent.parent / "catalog" / "fit" / "simulator.toml"
Attention = Literal["flash", "fused", "unfused", "auto"]
P2PSplit = Literal["scatter-gather", "forward", "none"]
ATTENTION_KERNELS: tuple[str, ...] = ("flash", "fused", "unfused", "auto")
FP8_GEMMS: tuple[str, ...] = ("qkv", "attn_out", "mlp_up", "mlp_down", "expert_up",
                              "expert_down", "router", "head")


ExpertGemm = Literal["grouped", "per_expert"]
MOE_DISPATCHERS = ("alltoall", "deepep")
"""The MoE token dispatchers a profile may name (``hetpar.sim.moe.DISPATCHERS`` times them)."""


@dataclass(frozen=True, kw_only=True)
class FrameworkSpec:
    """What one framework does, as its data file states it (units in the field names)."""

    name: str
    description: str = ""
    attention: Attention = "auto"
    """flash: FlashAttention-style fused kernel, no s^2 tensors (Dao et al. 2022); fused:
    Megatron's fused scale-mask-softmax, scores in HBM once; unfused: separate kernels;
    auto: flash for rotary/ALiBi models, fused for learned positions (the legacy rule)."""
    attention_library: Literal["fa2", "vendor"] = "fa2"
    """Whose flash-attention kernels: FlashAttention-2 (the GPU table), or the vendor's fused
    attention (cuDNN via TransformerEngine), faster by the GPU's fused_attention_speedup."""
    tp_comm_overlap: float = 0.0
    """Share of the adjacent GEMM that hides a TP collective (0: issued synchronously)."""
    dp_grad_reduce_overlap: float = 0.0
    """Share of the last micro-batch's backward that hides the DP gradient reduction."""
    dp_param_gather_overlap: float = 0.0
    """ZeRO-1/2: share of the next forward that hides the all-gather of updated weights."""
    zero3_collectives_per_layer: int = 1
    """Separate ZeRO-3 gathers per layer and pass: 1 for a per-layer FSDP unit, the number
    of parameterised submodules for DeepSpeed's per-module fetch."""
    zero3_prefetch: float = 1.0
    """Share of compute that hides ZeRO-3 gathers / reduce-scatters (prefetch depth)."""
    zero3_regather_on_recompute: bool = False
    """Whether recomputing a layer gathers its parameters again."""
    interleaved_pipeline: bool = True
    """Whether its pipeline engine runs interleaved (virtual-stage) schedules."""
    default_interleaved: bool = False
    """Whether its usual pipeline schedule is interleaved: a run that leaves vpp blank then
    gets the fastest chunk count that fits (else 1F1B)."""
    pipeline_microbatches: Literal["", "stages"] = ""
    """How many micro-batches its pipeline engine cuts a replica's batch into when the run
    does not say: "" (no default: a run that leaves mbs blank gets the fastest that fits) or
    "stages" (one per pipeline stage, pp x stages per rank: torchtitan's
    pipeline_parallel_microbatches default, parallelisms/pipelining_utils.py)."""
    fp8_gemms: tuple[str, ...] = ("qkv", "attn_out", "mlp_up", "mlp_down", "expert_up",
                                  "expert_down")
    """GEMMs that run in FP8 under an fp8 plan; the rest (LM head, attention) stay BF16."""
    fp8_cast_passes: float = 2.0
    """HBM passes over each FP8 GEMM's input to compute amax and cast (per forward GEMM)."""
    kernels_per_layer: float = 30.0
    """Forward kernels one transformer layer issues (backward: BACKWARD_KERNEL_FACTOR x)."""
    expert_gemm: ExpertGemm = "grouped"
    """How an MoE layer's local experts run each matrix (``hetpar.sim.moe.moe_kernels``):
    "grouped", one grouped-GEMM kernel for all of them, or "per_expert", one GEMM launch per
    expert (TransformerEngine's GroupedLinear on cuBLAS)."""
    p2p_split: P2PSplit = "scatter-gather"
    """How a TP group hands activations and gradients to the next pipeline stage (the plan
    field of the same name overrides it; see specs/plan.py for the three choices)."""
    p2p_blocking: bool = False
    """Whether the pipeline engine runs a lock-step schedule whose stage-to-stage exchanges
    block both ends (DeepSpeed's PipelineEngine: TrainSchedule plus two-rank broadcasts,
    sim/lockstep.py); applies to 1F1B without virtual stages. The plan field overrides it."""
    p2p_attention_mask: bool = False
    """Whether the model code sends the (1, 1, s, s) fp16 attention mask with every forward
    activation (a plan field of the same name overrides it)."""
    interleaved_p2p_overlap: bool = False
    """Whether an interleaved schedule posts each virtual micro-batch's exchange
    asynchronously under the next chunk's compute (Megatron-Core overlap_p2p_comm), so only
    one per-micro-batch overhead per rank shows, not one per chunk."""
    vocab_divisible_by: int = 1
    """The framework pads the vocabulary to a multiple of this x TP (Megatron-LM's
    --make-vocab-size-divisible-by, default 128: megatron/training/tokenizer/tokenizer.py::
    _vocab_size_with_padding); 1: it builds the vocabulary as given. The padded rows are
    parameters, memory and LM-head FLOPs like the others."""
    moe_dispatcher: str = "alltoall"
    """How MoE tokens cross the EP group (``FrameworkProfile.moe_dispatcher``)."""
    ep_overlap: float = 0.0
    """Share of the EP all-to-all hidden (``FrameworkProfile.ep_overlap``)."""
    cuda_graphs: bool = False
    """Whether each layer replays as a CUDA graph (``FrameworkProfile.cuda_graphs``)."""
    reserved_memory_gib: float = 1.5
    """GPU memory outside PyTorch's caching allocator on every rank: the CUDA context,
    cuBLAS workspaces and NCCL's communicator buffers (each file cites its figure)."""
    allocator_fragmentation: float = 0.0
    """Memory the caching allocator holds at peak beyond the live tensors, as a fraction of
    them (each file cites why; 0: reserved equals allocated at the peak)."""
    sources: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class FittedParams:
    """The free parameters, fitted on published runs (ranges and sources in hetpar/fit.py)."""

    kernel_gap_us: float = 16.7
    """GPU idle between consecutive kernels of a layer (launch latency, stream syncs)."""
    kernel_dispatch_us: float = 20.0
    """CPU time an eager framework spends issuing one kernel (the dispatch floor)."""
    microbatch_overhead_ms: float = 1.0
    """Per micro-batch per model chunk: schedule bookkeeping, p2p handshakes (an interleaved
    rank pays it per chunk unless its framework overlaps those exchanges)."""
    iteration_overhead_ms: float = 3.0
    """Per iteration: loss reduction, logging, data loading the step does not hide."""
    collective_step_latency_us: float = 5.0
    """Latency of one ring step of a collective across nodes (NIC + NCCL protocol)."""
    gpu_efficiency: tuple[tuple[str, float, float], ...] = ()
    """(GPU name, matmul f_inf, attention f_inf) per GPU the fit moved from its file's prior
    (the [gpu_efficiency] table; hetpar/catalog/gpu_fit.py); a GPU not listed keeps its file's."""


@dataclass(frozen=True, kw_only=True)
class FrameworkProfile:
    """A framework's behaviour plus the fitted parameters, in SI units: what sim/ reads."""

    name: str = "default"
    attention: Attention = "auto"
    attention_library: str = "fa2"
    tp_overlap: float = 0.0
    dp_grad_overlap: float = 0.0
    dp_param_gather_overlap: float = 0.0
    zero3_collectives_per_layer: int = 1
    zero3_prefetch: float = 1.0
    zero3_regather_on_recompute: bool = False
    interleaved_pipeline: bool = True
    default_interleaved: bool = False
    pipeline_microbatches: str = ""
    fp8_gemms: tuple[str, ...] = FP8_GEMMS[:6]
    fp8_cast_passes: float = 2.0
    kernels_per_layer: float = 30.0
    expert_gemm: ExpertGemm = "grouped"
    p2p_split: str = "scatter-gather"
    p2p_blocking: bool = True
    """Without a named framework, 1F1B stage exchanges block both ends: Megatron-LM's
    p2p_communication._communicate waits on every request and then torch.cuda.synchronize()
    (Megatron-Core: batch_p2p_sync, default True), and DeepSpeed's PipelineEngine exchanges by
    two-rank broadcasts in its lock-step TrainSchedule; the frameworks' files override it."""
    p2p_attention_mask: bool = False
    interleaved_p2p_overlap: bool = False
    moe_dispatcher: str = "alltoall"
    """How the MoE tokens cross the EP group (``hetpar.sim.moe.DISPATCHERS``): ``alltoall``,
    one NCCL all-to-all (Megatron-Core's alltoall token dispatcher, the default), or
    ``deepep``, DeepSeek's DeepEP kernels (each token once per remote node, then NVLink)."""
    ep_overlap: float = 0.0
    """Share of the EP all-to-all hidden behind other work (Megatron-Core 0.14's
    --overlap-moe-expert-parallel-comm overlaps it with another micro-batch's compute; off by
    default, so 0: not overlapped). Not capped by the compute beside it."""
    cuda_graphs: bool = False
    """Whether each layer's forward and backward replay as captured CUDA graphs (Megatron-Core
    enable_cuda_graph, whole-layer scope): the CPU launches one graph per layer, not each
    kernel, so no dispatch floor (CUDA programming guide, "CUDA Graphs": a graph is launched
    by one call). A dropless MoE layer cannot be captured whole (its sizes come from the host,
    ``hetpar.sim.moe_sync``) and launches eagerly. Off by default."""
    kernel_gap_s: float = 16.7e-6
    kernel_dispatch_s: float = 20e-6
    backward_kernel_factor: float = 2.5
    """Backward kernels and dispatch relative to forward: input and weight gradients plus
    autograd bookkeeping (about twice the kernels, Narayanan et al. 2021 Sec. 5.1)."""
    microbatch_overhead_s: float = 1e-3
    iteration_overhead_s: float = 3e-3
    collective_step_latency_s: float = 5e-6
    vocab_divisible_by: int = 1
    """Vocabulary padding multiple per TP rank (FrameworkSpec.vocab_divisible_by)."""
    cp_overlap: float = 1.0
    """Ring attention overlaps the KV exchange with attention compute (Liu et al. 2023)."""
    reserved_memory_bytes: float = 1.5 * 2**30
    """FrameworkSpec.reserved_memory_gib in bytes (the default: NVIDIA/nccl#864, see
    catalog/frameworks/*.toml)."""
    allocator_fragmentation: float = 0.0
    """FrameworkSpec.allocator_fragmentation."""

    @property
    def layer_launch_s(self) -> float:
        """GPU gaps of one layer's forward kernels."""
        return self.kernels_per_layer * self.kernel_gap_s

    @property
    def layer_dispatch_s(self) -> float:
        """CPU time to issue one layer's forward kernels."""
        return self.kernels_per_layer * self.kernel_dispatch_s


def framework_names() -> list[str]:
    """The bundled frameworks (file stems of catalog/frameworks)."""
    return sorted(p.stem for p in FRAMEWORKS_DIR.glob("*.toml"))


@lru_cache(maxsize=64)
def load_framework(name: str) -> FrameworkSpec:
    """A framework by name; ConfigError listing the allowed names otherwise."""
    path = FRAMEWORKS_DIR / f"{name}.toml"
    if not name or "/" in name or not path.is_file():
        raise ConfigError(
            f"framework {name!r} unknown; allowed: {', '.join(framework_names())}"
        )
    spec = from_dict(FrameworkSpec, read_document(path), path.name)
    if spec.vocab_divisible_by < 1:
        raise ConfigError(f"{path.name}: vocab_divisible_by must be >= 1, got "
                          f"{spec.vocab_divisible_by}")
    if spec.moe_dispatcher not in MOE_DISPATCHERS or not 0 <= spec.ep_overlap <= 1:
        raise ConfigError(f"{path.name}: moe_dispatcher={spec.moe_dispatcher!r}, ep_overlap="
                          f"{spec.ep_overlap} not allowed; allowed: "
                          f"{', '.join(MOE_DISPATCHERS)}, 0..1")
    if spec.reserved_memory_gib < 0 or not 0 <= spec.allocator_fragmentation < 1:
        raise ConfigError(f"{path.name}: reserved_memory_gib={spec.reserved_memory_gib}, "
                          f"allocator_fragmentation={spec.allocator_fragmentation} not allowed; "
                          "allowed: >= 0, 0..<1")
    bad = sorted(set(spec.fp8_gemms) - set(FP8_GEMMS))
    if bad:
        raise ConfigError(f"{path.name}: fp8_gemms {bad[0]!r} unknown; allowed: "
                          f"{', '.join(FP8_GEMMS)}")
    return spec


def read_fitted(path: Path = FITTED_PATH) -> FittedParams:
    """The bundled fit (the [fit] table of catalog/fit/simulator.toml)."""
    from hetpar.catalog.gpu_fit import parse

    data = read_document(path)
    params = from_dict(FittedParams, data.get("fit", {}), path.name)
    return dataclasses.replace(
        params, gpu_efficiency=parse(data.get("gpu_efficiency", {}), path.name))


@lru_cache(maxsize=1)
def bundled_fit() -> FittedParams:
    return read_fitted()


def resolve(
    framework: str | None = None, *, attention: str | None = None,
    fitted: FittedParams | None = None,
) -> FrameworkProfile:
    """The profile the simulator uses: a framework (None: the default, legacy behaviour),
    an optional attention override from the plan, and the fitted parameters."""
    if attention and attention not in ATTENTION_KERNELS:
        raise ConfigError(
            f"attention {attention!r} unknown; allowed: {', '.join(ATTENTION_KERNELS)}"
        )
    return _resolve(framework or "", attention or "", fitted or bundled_fit())


@lru_cache(maxsize=256)
def _resolve(framework: str, attention: str, fit: FittedParams) -> FrameworkProfile:
    base = FrameworkProfile(
        kernel_gap_s=fit.kernel_gap_us * 1e-6, kernel_dispatch_s=fit.kernel_dispatch_us * 1e-6,
        microbatch_overhead_s=fit.microbatch_overhead_ms * 1e-3,
        iteration_overhead_s=fit.iteration_overhead_ms * 1e-3,
        collective_step_latency_s=fit.collective_step_latency_us * 1e-6,
    )
    if framework:
        f = load_framework(framework)
        base = dataclasses.replace(
            base, name=f.name, attention=f.attention, attention_library=f.attention_library,
            tp_overlap=f.tp_comm_overlap,
            dp_grad_overlap=f.dp_grad_reduce_overlap,
            dp_param_gather_overlap=f.dp_param_gather_overlap,
            zero3_collectives_per_layer=f.zero3_collectives_per_layer,
            zero3_prefetch=f.zero3_prefetch,
            zero3_regather_on_recompute=f.zero3_regather_on_recompute,
            interleaved_pipeline=f.interleaved_pipeline,
            default_interleaved=f.default_interleaved,
            pipeline_microbatches=f.pipeline_microbatches, fp8_gemms=f.fp8_gemms,
            fp8_cast_passes=f.fp8_cast_passes, kernels_per_layer=f.kernels_per_layer,
            expert_gemm=f.expert_gemm,
            p2p_split=f.p2p_split, p2p_blocking=f.p2p_blocking,
            p2p_attention_mask=f.p2p_attention_mask,
            interleaved_p2p_overlap=f.interleaved_p2p_overlap,
            vocab_divisible_by=f.vocab_divisible_by,
            moe_dispatcher=f.moe_dispatcher, ep_overlap=f.ep_overlap,
            cuda_graphs=f.cuda_graphs,
            reserved_memory_bytes=f.reserved_memory_gib * 2**30,
            allocator_fragmentation=f.allocator_fragmentation,
        )
    if attention:
        base = dataclasses.replace(base, attention=attention)  # type: ignore[arg-type]
    return base


DEFAULT = FrameworkProfile()
"""The profile of callers that name no framework (same as ``resolve()`` before any fit)."""
