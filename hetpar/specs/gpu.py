"""GPU type description: peak rates, memory, links, power and measured-efficiency tables."""

from __future__ import annotations

import bisect
import math
import re
from dataclasses import dataclass, field
from typing import Literal, cast

from hetpar.errors import ConfigError

Precision = Literal["fp32", "tf32", "bf16", "fp16", "fp8"]
PRECISIONS: tuple[Precision, ...] = ("fp32", "tf32", "bf16", "fp16", "fp8")


class _Unstated(str):
    """A default precision: equal to its value everywhere, but tells apart "not written"."""

    __slots__ = ()


DEFAULT_PRECISION = cast(Precision, _Unstated("bf16"))
"""What plans and jobs use when their file does not state a precision."""


def stated(precision: str) -> bool:
    """Whether a plan's or job's precision was written (not the default)."""
    return not isinstance(precision, _Unstated)


@dataclass(frozen=True, kw_only=True)
class EfficiencyTable:
    """Achieved fraction of peak versus operation size, interpolated in log(size).

    ``size`` is FLOPs per kernel for compute tables and bytes moved for the memory table.
    Below the first point the fraction scales down linearly with size (launch-bound);
    above the last point it stays flat.
    """

    size: tuple[float, ...]
    fraction: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.size) != len(self.fraction) or not self.size:
            raise ConfigError(
                f"efficiency table: size ({len(self.size)}) and fraction "
                f"({len(self.fraction)}) must be non-empty lists of equal length"
            )
        if self.size[0] <= 0:  # interpolated in log(size)
            raise ConfigError(f"efficiency table: size must be > 0, got {self.size[0]}")
        if any(b <= a for a, b in zip(self.size, self.size[1:], strict=False)):
            raise ConfigError(f"efficiency table: size must increase, got {list(self.size)}")
        if any(not 0 < f <= 1 for f in self.fraction):
            raise ConfigError(f"efficiency table: fractions must be in (0, 1], got {self.fraction}")

    def __call__(self, size: float) -> float:
        """Fraction of peak achieved by one operation of ``size``."""
        s, f = self.size, self.fraction
        if size <= s[0]:
            return f[0] * max(size, 1.0) / s[0]
        if size >= s[-1]:
            return f[-1]
        i = bisect.bisect_right(s, size)
        t = (math.log(size) - math.log(s[i - 1])) / (math.log(s[i]) - math.log(s[i - 1]))
        return f[i - 1] + t * (f[i] - f[i - 1])


@dataclass(frozen=True, kw_only=True)
class GPUSpec:
    """One GPU type. Units at the boundary: TFLOP/s, GiB, GB/s (memory), Gbit/s (links), W."""

    name: str
    vendor: str
    peak_tflops: dict[str, float]
    """Dense peak per precision (keys from PRECISIONS); a missing key = unsupported."""
    memory_gib: float
    memory_bandwidth_gbyte_s: float
    scaleup_bandwidth_gbps: float
    """Per-GPU unidirectional scale-up link bandwidth (NVLink, Infinity Fabric, or PCIe)."""
    scaleup_link: str
    power_w: float
    matmul_efficiency: EfficiencyTable
    attention_efficiency: EfficiencyTable
    memory_efficiency: EfficiencyTable
    fused_attention_speedup: float = 1.0
    """Throughput of the vendor's fused attention (cuDNN fused attention, FlashAttention-3
    class kernels) over the FlashAttention-2 kernels ``attention_efficiency`` describes; 1.0
    where no faster kernel exists. Used by frameworks whose attention library is "vendor"."""
    p2p: bool = True
    """PCIe peer-to-peer between two cards of this type. False on GeForce cards, whose driver
    offers none: NCCL then stages every byte through host memory (its SHM transport, link
    kind ``shm``); an NVLink bridge still gives the bridged pair peer access."""
    sm_count: int | None = None
    """Streaming multiprocessors (None: not stated; then a communication kernel running beside
    compute is charged no SMs, ``AxisCost.overlap_sms``)."""
    compute_capability: str = ""
    """CUDA compute capability, ``"8.0"`` (NVIDIA's CUDA GPUs table,
    developer.nvidia.com/cuda-gpus). NCCL's tuner caps a channel's bandwidth by architecture
    (Volta 7.x, Ampere 8.x, Hopper 9.x, Blackwell 10.x+; hetpar.net.channels); empty (AMD, or
    not stated): no per-channel cap."""
    sources: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.compute_capability and not re.fullmatch(r"\d+\.\d+", self.compute_capability):
            raise ConfigError(f"gpu {self.name!r}: compute_capability="
                              f"{self.compute_capability!r} not allowed; allowed: MAJOR.MINOR "
                              "(\"8.0\") or empty")
        bad = sorted(set(self.peak_tflops) - set(PRECISIONS))
        if bad:
            raise ConfigError(
                f"gpu {self.name!r}: peak_tflops key {bad[0]!r} unknown; "
                f"allowed: {', '.join(PRECISIONS)}"
            )
        for p, v in self.peak_tflops.items():
            if not v > 0:
                raise ConfigError(f"gpu {self.name!r}: peak_tflops.{p} must be > 0, got {v}")
        for k in ("memory_gib", "memory_bandwidth_gbyte_s", "scaleup_bandwidth_gbps", "power_w",
                  "fused_attention_speedup"):
            if getattr(self, k) <= 0:
                raise ConfigError(f"gpu {self.name!r}: {k} must be > 0, got {getattr(self, k)}")

    def __hash__(self) -> int:
        # a GPU is part of a node group's value (a slowed GPU): hashable like the rest of a
        # ClusterSpec; equal GPUs have equal names, memories and peaks
        return hash((self.name, self.memory_gib, self.memory_bandwidth_gbyte_s,
                     tuple(sorted(self.peak_tflops.items()))))

    def peak_flops(self, precision: str) -> float:
        """Dense peak in FLOP/s for ``precision``, or ConfigError if unsupported."""
        if precision not in self.peak_tflops:
            raise ConfigError(
                f"gpu {self.name!r}: precision {precision!r} not supported; "
                f"allowed: {', '.join(self.peak_tflops)}"
            )
        return self.peak_tflops[precision] * 1e12

    @property
    def memory_bytes(self) -> float:
        return self.memory_gib * 2**30

    @property
    def memory_bandwidth(self) -> float:
        """HBM bandwidth in bytes/s."""
        return self.memory_bandwidth_gbyte_s * 1e9

    @property
    def scaleup_bandwidth(self) -> float:
        """Scale-up link bandwidth in bytes/s per direction."""
        return self.scaleup_bandwidth_gbps * 1e9 / 8
