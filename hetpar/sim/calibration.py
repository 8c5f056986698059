"""Layer physics that is neither a GPU nor a framework property: memory passes, byte sizes.

Overheads, overlaps and link efficiency moved to the framework profiles (sim/profile.py,
catalog/frameworks/*.toml) and the fitted parameters (catalog/fit/simulator.toml, written by
``hetpar validate RUNS --fit PATH``); the GPU efficiency tables (catalog/gpus/*.toml) hold
the per-device part.
"""

from __future__ import annotations

from typing import Final

FP32_GEMMS_ON_TF32: Final = True
"""fp32 training runs its GEMMs on TF32 tensor cores where the GPU has them. The published
fp32 runs (Sailor, GH200) reach 70-100 TFLOP/s per GPU, above the 67 TFLOP/s non-tensor FP32
peak, so their GEMMs cannot have run on the FP32 pipes; False models strict FP32."""

# The bytes outside the tensors (reserved memory, allocator fragmentation) are framework
# data: FrameworkSpec.reserved_memory_gib / allocator_fragmentation, cited in each file.

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
