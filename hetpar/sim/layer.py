"""Time of one transformer layer (and the embedding / LM head) on one GPU of a TP x CP group."""

from __future__ import annotations

import math
from dataclasses import dataclass

from hetpar import formulas
from hetpar.formulas.flops import attention_share, ssm_flops_per_token
from hetpar.sim import calibration as cal
from hetpar.sim.hybrid import layer_parts, ssm_kernel_work
from hetpar.sim.moe_sync import POST_SYNC_GEMMS
from hetpar.sim.profile import DEFAULT, FrameworkProfile
from hetpar.specs.gpu import GPUSpec
from hetpar.specs.model import ModelSpec

ACT_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 2}
"""Bytes per activation element; fp8 training keeps activations in BF16 (Micikevicius 2022)."""


@dataclass(frozen=True, slots=True)
class LayerTime:
    """Seconds for one layer and one micro-batch on one GPU (communication excluded)."""

    fwd: float
    bwd_input: float
    """Backward w.r.t. activations (B in the zero-bubble papers) incl. attention backward."""
    bwd_weight: float
    """Backward w.r.t. weights (W): the weight-gradient GEMMs."""
    attn_fwd: float
    """Attention core forward, the part ring attention hides."""
    selective: float
    """What selective recompute repeats: the attention core when it is unfused (Korthikanti
    et al. 2022 Sec. 5); with fused attention, op-level selective checkpointing that keeps
    every other GEMM output and recomputes the rest plus the memory-bound ops (torchtitan)."""
    fwd_flops: float
    """Forward FLOPs of the layer on this GPU (hardware FLOPs bookkeeping)."""
    gemm: float = 0.0
    """Forward GEMM time plus the FP8 casts beside it: what a TP collective overlaps with."""
    pre_sync: float = 0.0
    """Of ``fwd``, an MoE layer's work before its dispatcher's host sync (attention block,
    router, permute: ``hetpar.sim.moe_sync.POST_SYNC_GEMMS`` names what follows it)."""


def _table_size(gpu: GPUSpec, peak: float, flops: float) -> float:
    """The size at which to read an efficiency table for a kernel run at ``peak``.

    The tables have the shape time = t0 + size / (f_inf * rate) with the rate of the GPU's
    16-bit peak (docs/catalog.md): at another peak the same fixed t0 weighs rate/peak as much,
    so a kernel of ``flops`` at ``peak`` is as efficient as one of flops * rate16 / peak at
    the 16-bit rate (TF32 GEMMs saturate at half the size, FP8 ones at twice it).
    """
    rate16 = gpu.peak_tflops.get("bf16") or gpu.peak_tflops.get("fp16")
    return flops * rate16 * 1e12 / peak if rate16 else flops


def _gemm_time(gpu: GPUSpec, peak: float, flops: float) -> float:
    return flops / (peak * gpu.matmul_efficiency(_table_size(gpu, peak, flops)))


def _mem_time(gpu: GPUSpec, nbytes: float) -> float:
    return nbytes / (gpu.memory_bandwidth * gpu.memory_efficiency(nbytes))


_CACHE: dict[tuple[object, ...], tuple[GPUSpec, FrameworkProfile, LayerTime]] = {}


def layer_time(
    model: ModelSpec, gpu: GPUSpec, precision: str, micro_batch: int, seq: int,
    tp: int, cp: int, sequence_parallel: bool, profile: FrameworkProfile = DEFAULT,
    moe: bool = False, experts: tuple[int, int, float] = (1, 0, 1.0), local: int = 0,
) -> LayerTime:
    """Cached ``_layer_time`` (GPUSpec holds dicts, so the cache keys on its identity).

    ``moe``: a mixture-of-experts layer (its top-k experts, router and any shared expert
    instead of the dense MLP; see ``formulas.layer_gemms``); ``experts``: (ep, etp, load) of
    its experts and ``local`` the experts this rank holds (``formulas.layer_gemms``).
    """
    key = (model, id(gpu), precision, micro_batch, seq, tp, cp, sequence_parallel, id(profile),
           moe, experts, local)
    hit = _CACHE.get(key)
    if hit is not None and hit[0] is gpu and hit[1] is profile:
        return hit[2]
    if len(_CACHE) > 65536:
        _CACHE.clear()
    out = _layer_time(model, gpu, precision, micro_batch, seq, tp, cp, sequence_parallel,
                      profile, moe, experts, local)
    _CACHE[key] = (gpu, profile, out)
    return out


def _layer_time(
    model: ModelSpec, gpu: GPUSpec, precision: str, micro_batch: int, seq: int,
    tp: int, cp: int, sequence_parallel: bool, profile: FrameworkProfile, moe: bool,
    experts: tuple[int, int, float] = (1, 0, 1.0), local: int = 0,
) -> LayerTime:
    """Forward / backward times of one layer for one micro-batch on one GPU.

    Backward costs 2x the forward FLOPs (one GEMM for the input gradient, one for the weight
    gradient per forward GEMM; Narayanan et al. 2021 Sec. 5.1). Memory-bound work is bytes over
    HBM bandwidth x memory_efficiency(bytes). The dispatch floor (profile.layer_dispatch_s)
    is applied by the caller, to compute and communication together.
    """
    seq_local = seq // cp
    tokens = micro_batch * seq_local
    attn_peak = gpu.peak_flops(attention_precision(gpu, precision))
    # uneven=True: plans that need divisible heads were already checked (feasibility.check_plan); an
    # explicit replica at a reduced TP degree (NTP) is paced by its largest shard.
    # A hybrid model's layer is its parts' mean (sim/hybrid.py::layer_parts): every chunk is
    # costed at the model's mix of attention, state-space and MLP parts
    t_gemm, gemms, cast_bytes, t_pre = 0.0, list[float](), 0.0, 0.0
    for part, share in layer_parts(model, moe):
        layer_gemms = formulas.layer_gemms(model, tokens, tp, moe, uneven=True,
                                           experts=experts, kind=part, local=local)
        gemms += [share * g.flops for g in layer_gemms]
        # A grouped GEMM (the experts') runs at the efficiency of one expert's size: few
        # tokens per expert make small, slow matmuls (the efficiency table is by one GEMM's
        # FLOPs).
        times = [g.repeat * _gemm_time(gpu, gemm_peak(gpu, precision, g.name, profile),
                                       g.flops / g.repeat) for g in layer_gemms]
        t_gemm += share * sum(times)
        t_pre += share * sum(t for g, t in zip(layer_gemms, times, strict=True)
                             if g.name not in POST_SYNC_GEMMS)
        if precision == "fp8":
            cast_bytes += share * fp8_cast_bytes(layer_gemms, profile)
    # Attention over the full sequence of keys (ring attention brings the other CP shards);
    # its efficiency is one attending layer's, its time the share of layers that attend.
    a_flops = formulas.attention_core_flops(model, tokens, seq, tp)
    attending = attention_share(model)
    one = a_flops / attending if attending else 0.0
    t_attn = attending * one / (attn_peak * gpu.attention_efficiency(
        _table_size(gpu, attn_peak, one)))
    kind = attention_kind(model, precision, profile)
    if kind == "flash" and profile.attention_library == "vendor":
        t_attn /= gpu.fused_attention_speedup
    t_cast = _mem_time(gpu, cast_bytes) if precision == "fp8" else 0.0
    t_elem = _mem_time(gpu, elementwise_bytes(model, precision, tokens, tp, sequence_parallel,
                                              moe))
    t_elem += t_cast
    if kind != "flash":
        # Unfused attention writes the scores, softmax and dropout to HBM and reads them back.
        per = ACT_BYTES[precision]
        # Megatron-LM's fused scale-mask-softmax only takes 16-bit inputs; fp32 runs the
        # scale, mask, softmax and dropout as separate kernels.
        passes = cal.SOFTMAX_PASSES if kind == "fused" else cal.UNFUSED_SOFTMAX_PASSES
        heads = math.ceil(model.n_heads / tp)
        score_bytes = passes * micro_batch * heads * seq_local * seq * per
        t_attn += attending * _mem_time(gpu, score_bytes)
    t_elem += ssm_kernel_time(model, gpu, precision, tokens)
    if moe:
        t_pre += t_attn + _mem_time(gpu, elementwise_bytes(
            model, precision, tokens, tp, sequence_parallel, moe, pre_sync=True))
    fwd = t_gemm + t_attn + t_elem
    bwd_input = t_gemm + 2 * t_attn + 2 * t_elem
    if kind == "flash":
        selective = (1.0 - cal.SAC_SAVED_FRACTION) * t_gemm + t_elem
    else:
        selective = t_attn
    return LayerTime(
        fwd=fwd, bwd_input=bwd_input, bwd_weight=t_gemm, attn_fwd=t_attn, selective=selective,
        fwd_flops=sum(gemms) + a_flops + tokens * ssm_flops_per_token(model), gemm=t_gemm + t_cast,
        pre_sync=t_pre,
    )


def ssm_kernel_time(model: ModelSpec, gpu: GPUSpec, precision: str, tokens: int) -> float:
    """Forward time of the conv and scan kernels, the layers' mean: the slower of their FLOPs
    at the FP32 peak (Mamba's scan runs on CUDA cores, Gu & Dao 2023 Sec. 3.3.2; Mamba-2's
    chunks on tensor cores: precision's peak, Dao & Gu 2024 Sec. 6) and their HBM bytes
    (sim/hybrid.py::ssm_kernel_work): a roofline (Williams et al. 2009)."""
    if model.ssm is None:
        return 0.0
    share, flops, nbytes = ssm_kernel_work(model, tokens, ACT_BYTES[precision])
    fp32 = model.ssm.kind == "mamba"
    peak = gpu.peak_flops("fp32" if fp32 else gemm_precision(gpu, precision))
    return share * max(flops / peak, _mem_time(gpu, nbytes))


def elementwise_bytes(
    model: ModelSpec, precision: str, tokens: int, tp: int, sequence_parallel: bool,
    moe: bool = False, pre_sync: bool = False,
) -> float:
    """Forward HBM traffic of the memory-bound ops of one layer on one rank.

    Norms, residual adds and dropouts touch (tokens x hidden) tensors, split over TP only with
    sequence parallelism (Korthikanti et al. 2022 Sec. 4.2.2); the MLP activation touches
    (tokens x ffn / tp) elements. In an MoE layer a token fills its top-k experts' columns and
    the shared expert's (formulas.mlp_width); the router's softmax over E scores and the shared
    expert's 1-wide gate are left out (E, 1 << ffn elements per token). ``pre_sync``: only
    what an MoE layer runs before its dispatcher's host sync: the attention block's passes, the
    MLP norm (3 of the 4 replicated passes) and the permute (half of permute and unpermute).
    """
    per = ACT_BYTES[precision]
    hid_share = tp if sequence_parallel else 1
    ffn = formulas.mlp_width(model, moe) * (2 if model.mlp == "swiglu" else 1)
    # Routed tokens are permuted into expert order before the experts and back after them
    # (Megatron-Core moe_utils.permute / unpermute, around the token dispatcher's
    # all-to-all): each reads and writes a token once per expert it goes to and once whole,
    # 2 x (top-k + 1) x hidden elements per token on the tokens a rank holds.
    permute = 2 * (model.experts_per_token + 1) * model.hidden / hid_share if (
        moe and model.n_experts > 1) else 0.0
    if pre_sync:
        return per * tokens * (0.75 * cal.REPLICATED_PASSES * model.hidden / hid_share
                               + cal.SPLIT_PASSES * model.hidden / tp + permute / 2)
    return per * tokens * (
        cal.REPLICATED_PASSES * model.hidden / hid_share
        + cal.SPLIT_PASSES * model.hidden / tp
        + cal.MLP_ELEMENTWISE_PASSES * ffn / tp
        + permute
    )


def flash_attention(
    model: ModelSpec, precision: str, profile: FrameworkProfile = DEFAULT
) -> bool:
    """Whether attention runs as one fused kernel (FlashAttention, Dao et al. 2022)."""
    return attention_kind(model, precision, profile) == "flash"


def attention_kind(model: ModelSpec, precision: str, profile: FrameworkProfile) -> str:
    """The attention kernel a run uses: the framework's (or the plan's override).

    FlashAttention (Dao et al. 2022, 2023) and Megatron-LM's fused scale-mask-softmax both
    need 16-bit inputs, so fp32 runs fall back to separate kernels. ``auto`` (no framework
    named) keeps the legacy rule: rotary/ALiBi models (Llama and later) use flash attention,
    models with learned absolute positions (GPT-2/3, OPT) Megatron's fused softmax.
    """
    kind = profile.attention
    if kind == "auto":
        kind = "flash" if model.position != "learned" else "fused"
    if ACT_BYTES[precision] != 2:
        return "unfused"
    return kind


def gemm_peak(gpu: GPUSpec, precision: str, name: str, profile: FrameworkProfile) -> float:
    """Peak of one GEMM: FP8 for the GEMMs the framework's FP8 recipe covers, else BF16.

    TransformerEngine's recipe runs the linear layers of each transformer layer in FP8 and
    keeps the LM head, attention core (unless FP8 attention) and everything else in BF16
    (Micikevicius et al. 2022, "FP8 formats for deep learning"; TE docs, fp8_autocast).
    """
    if precision == "fp8" and name not in profile.fp8_gemms:
        return gpu.peak_flops(attention_precision(gpu, precision))
    return gpu.peak_flops(gemm_precision(gpu, precision))


def member_time(gpu: GPUSpec, precision: str, g: formulas.Gemm,
                profile: FrameworkProfile = DEFAULT) -> float:
    """Seconds of one member of ``g`` (one expert of a grouped GEMM) as ``layer_time`` times
    it: at the efficiency of that member's FLOPs."""
    return _gemm_time(gpu, gemm_peak(gpu, precision, g.name, profile), g.flops / g.repeat)


def fp8_cast_bytes(gemms: tuple[formulas.Gemm, ...], profile: FrameworkProfile) -> float:
    """Forward HBM bytes of the FP8 scaling of the recipe's GEMM inputs.

    Delayed scaling reads each BF16 input once for its amax and writes the FP8 copy (2 + 1
    bytes per element), ``fp8_cast_passes`` times per input (TE fuses the cast into the
    preceding norm where it can, which the framework file's pass count says).
    """
    total = 0.0
    for g in gemms:
        if g.name in profile.fp8_gemms:
            total += profile.fp8_cast_passes * 1.5 * g.m * g.k
    return total


def gemm_precision(gpu: GPUSpec, precision: str) -> str:
    """Precision whose peak the GEMMs run at.

    fp32 training on tensor-core GPUs runs its GEMMs in TF32 (cuBLAS math mode that PyTorch
    and Megatron enable); the published fp32 runs exceed the non-tensor FP32 peak, which
    confirms it. fp8 runs its GEMMs in FP8 (Transformer Engine) and the rest in BF16.
    """
    if precision == "fp32" and cal.FP32_GEMMS_ON_TF32 and "tf32" in gpu.peak_tflops:
        return "tf32"
    return precision


def attention_precision(gpu: GPUSpec, precision: str) -> str:
    """Precision whose peak the attention core runs at (BF16 under fp8 training)."""
    if precision == "fp8":
        return "bf16" if "bf16" in gpu.peak_tflops else "fp16"
    return gemm_precision(gpu, precision)


def head_time(
    model: ModelSpec, gpu: GPUSpec, precision: str, tokens: int, tp: int,
    profile: FrameworkProfile = DEFAULT,
) -> tuple[float, float]:
    """(forward, backward) seconds of the LM head GEMM plus the cross-entropy on one rank.

    The logits GEMM is 2 x tokens x hidden x vocab / tp FLOPs (vocab-parallel, Megatron); the
    softmax cross-entropy reads and writes the fp32 logits (memory-bound).
    """
    peak = gemm_peak(gpu, precision, "head", profile)
    flops = formulas.head_gemm(model, tokens, tp).flops
    t = _gemm_time(gpu, peak, flops)
    t_loss = _mem_time(gpu, 3 * 4.0 * tokens * model.vocab / tp)
    return t + t_loss, 2 * t + t_loss


def embedding_time(model: ModelSpec, gpu: GPUSpec, precision: str, tokens: int) -> float:
    """Forward seconds of the embedding lookup (memory-bound gather of tokens x hidden)."""
    return _mem_time(gpu, 2.0 * ACT_BYTES[precision] * tokens * model.hidden)
