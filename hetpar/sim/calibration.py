"""Framework physics that is not a property of one GPU: overheads, overlaps, byte sizes.

Every number here was fitted once against the whole development set of published runs
(``hetpar validate ../shared/validation/runs.csv``), never per row or per source; the GPU
efficiency tables (catalog/gpus/*.toml) hold the per-device part of the calibration.
"""

from __future__ import annotations

from typing import Final

# --- host-side (framework) overheads -------------------------------------------------------
ITERATION_OVERHEAD_S: Final = 0.003
"""Fixed per-iteration cost the step does not hide (loss reduction, logging, data loading).
Small: the Sailor single-micro-batch runs (rows 225 vs 226) leave only a few ms for it."""

LAYER_DISPATCH_S: Final = 0.6e-3
"""CPU time an eager-mode framework spends issuing one transformer layer's forward kernels.
A layer never runs faster than its dispatch (backward: ``BACKWARD_DISPATCH_FACTOR`` x this);
this is what makes small models and small micro-batches slower than their FLOPs suggest."""

BACKWARD_DISPATCH_FACTOR: Final = 2.5
"""Backward dispatch relative to forward: about twice the kernels (input and weight gradients)
plus autograd bookkeeping; fitted together with LAYER_DISPATCH_S on the small-model runs."""

LAYER_LAUNCH_S: Final = 0.5e-3
"""Gaps between a layer's kernels that even a GPU-bound layer pays, per forward (backward:
twice): kernel launch latency, stream synchronisation around collectives and allocator calls
of an eager framework (tens of kernels per layer at ~10-20 us each). Unlike the dispatch floor
it adds to the GPU time, so it also shows on mid-sized layers."""

MICROBATCH_OVERHEAD_S: Final = 1.0e-3
"""Per micro-batch per pipeline rank: schedule bookkeeping, p2p handshakes, loss scaling."""

FP32_GEMMS_ON_TF32: Final = True
"""fp32 training runs its GEMMs on TF32 tensor cores where the GPU has them. The published
fp32 runs (Sailor, GH200) reach 70-100 TFLOP/s per GPU, above the 67 TFLOP/s non-tensor FP32
peak, so their GEMMs cannot have run on the FP32 pipes; False models strict FP32."""

# --- overlap of communication with computation ----------------------------------------------
TP_OVERLAP: Final = 0.0
"""Fraction of tensor-parallel collectives hidden behind GEMMs (Megatron-LM as used in the
published runs issues them synchronously; set >0 for frameworks with comm/GEMM overlap)."""

DP_OVERLAP: Final = 0.0
"""How much of the last micro-batch's backward (per stage) hides the DP gradient all-reduce.
Megatron-LM's data parallelism as used in the published runs reduces after the backward
(Korthikanti et al. 2022 state no overlap); PyTorch DDP-style bucketing would be 1.0.
ZeRO-3/FSDP is governed by FSDP_OVERLAP instead."""

FSDP_OVERLAP: Final = 1.0
"""Fraction of a micro-batch's compute that hides ZeRO-3/FSDP parameter all-gathers and
gradient reduce-scatters (prefetch of the next layer's shard, Zhao et al. 2023, PyTorch FSDP)."""

CP_OVERLAP: Final = 1.0
"""Ring attention overlaps the KV exchange with attention compute (Liu et al. 2023)."""

# --- network ----------------------------------------------------------------------------
NET_EFFICIENCY: Final = 0.8
"""Achieved fraction of link bandwidth by NCCL ring/tree collectives (bus bandwidth over
line rate, NCCL-tests on InfiniBand and NVLink typically 75-85%)."""

# --- bytes --------------------------------------------------------------------------------
WORKSPACE_BYTES: Final = 1.5 * 2**30
"""CUDA context, cuBLAS/NCCL workspaces and communication buffers per GPU."""

FRAGMENTATION: Final = 0.05
"""Allocator fragmentation as a fraction of the tensors that live in memory."""

REPLICATED_PASSES: Final = 12.0
"""Forward memory-bound traffic per layer on (tokens x hidden) tensors that TP replicates
(split only by sequence parallelism): two norms (read + write) and two fused
bias-dropout-residual adds (read two, write one, a mask), as in Megatron-LM's layer
(Korthikanti et al. 2022 Sec. 4.2 list the same tensors)."""

SPLIT_PASSES: Final = 8.0
"""Forward memory-bound traffic on (tokens x hidden / tp) tensors: Q/K/V and context
layout copies and the rotary or bias adds around the attention core."""

MLP_ELEMENTWISE_PASSES: Final = 4.0
"""Forward memory-bound traffic of the MLP activation in units of (tokens x ffn) elements."""

SOFTMAX_PASSES: Final = 5.0
"""Forward passes over the (heads x s x s) score matrix when attention is not fused
(Megatron-LM's fused scale-mask-softmax reads and writes it once, dropout reads it and writes
it and a mask); flash attention has none."""

UNFUSED_SOFTMAX_PASSES: Final = 13.0
"""The same passes when scale, mask, softmax and dropout are separate kernels (fp32: each a
read and a write, plus fp32 softmax intermediates and the dropout mask)."""

SAC_SAVED_FRACTION: Final = 0.5
"""Selective recompute with fused attention (no score matrix to drop) is op-level selective
checkpointing: torchtitan's policy saves every other matmul output and recomputes the rest."""
