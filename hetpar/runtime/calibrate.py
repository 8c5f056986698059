"""Measure the local devices and write a GPU file and a cluster file in the core schema.

Compute: matmul and causal attention throughput versus operation size (FLOPs per kernel, as
the simulator looks them up); memory: copy bandwidth versus bytes moved; network: all-reduce
time versus size among local ranks, fitted to the simulator's ring model (t = 2 lat + S / bw
for two ranks) so a simulation with these files reproduces what was measured.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812

from hetpar.sim import terms

COLLECTIVE_REPEATS = 15
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True, kw_only=True)
class Curve:
    """Achieved rate (FLOP/s or bytes/s) at each operation size."""

    size: tuple[float, ...]
    rate: tuple[float, ...]

    def table(self, peak: float) -> dict[str, list[float]]:
        """An EfficiencyTable dict: fraction of ``peak`` per size (clipped to (0, 1])."""
        return {"size": list(self.size),
                "fraction": [round(min(max(r / peak, 1e-6), 1.0), 6) for r in self.rate]}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_op(fn: Callable[[], Any], device: torch.device, budget_s: float = 0.2) -> float:
    """Median seconds of ``fn`` over repeats filling about ``budget_s`` (after a warm-up)."""
    fn()
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    one = max(time.perf_counter() - t0, 1e-7)
    reps = max(3, min(100_000, int(budget_s / one)))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def matmul_curve(device: torch.device, dtype: torch.dtype, sizes: list[int],
                 budget_s: float = 0.2) -> Curve:
    """Square n x n x n matmuls: 2 n^3 FLOPs each."""
    out_s, out_r = [], []
    for n in sizes:
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        t = time_op(partial(torch.matmul, a, b), device, budget_s)
        out_s.append(2.0 * n**3)
        out_r.append(2.0 * n**3 / t)
    return Curve(size=tuple(out_s), rate=tuple(out_r))


def attention_curve(device: torch.device, dtype: torch.dtype, seqs: list[int],
                    budget_s: float = 0.2, heads: int = 8, head_dim: int = 64) -> Curve:
    """Causal SDPA; FLOPs counted as the simulator does: 4 x s x s x heads x head_dim."""
    out_s, out_r = [], []
    for s in seqs:
        q, k, v = (torch.randn(1, heads, s, head_dim, device=device, dtype=dtype)
                   for _ in range(3))
        t = time_op(partial(F.scaled_dot_product_attention, q, k, v, is_causal=True), device,
                    budget_s)
        flops = 4.0 * s * s * heads * head_dim
        out_s.append(flops)
        out_r.append(flops / t)
    return Curve(size=tuple(out_s), rate=tuple(out_r))


def memory_curve(device: torch.device, sizes: list[int], budget_s: float = 0.2) -> Curve:
    """Tensor copies of ``n`` float32 elements: 8 n bytes moved (read + write)."""
    out_s, out_r = [], []
    for n in sizes:
        src = torch.randn(n, device=device)
        dst = torch.empty_like(src)
        t = time_op(partial(dst.copy_, src), device, budget_s)
        out_s.append(8.0 * n)
        out_r.append(8.0 * n / t)
    return Curve(size=tuple(out_s), rate=tuple(out_r))


def _allreduce_times(sizes: list[int], dev: torch.device) -> list[float]:
    import torch.distributed as dist

    out = []
    for n in sizes:
        # A fixed repeat count: every rank must issue the same number of collectives.
        x = torch.ones(n, device=dev)
        dist.all_reduce(x)
        times = []
        for _ in range(COLLECTIVE_REPEATS):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(x)
            _sync(dev)
            times.append(time.perf_counter() - t0)
        out.append(statistics.median(times))
    return out


def measure_rank(rank: int, store: Any, device: str, prec: str, sizes: dict[str, list[int]],
                 compute: bool, budget_s: float) -> dict[str, Any]:
    """Run on every local rank at once, so the curves include the contention of a real run."""
    import torch.distributed as dist

    if device == "cpu":
        torch.set_num_threads(1)
    dev = torch.device(device)
    out: dict[str, Any] = {}
    if compute:
        dt = DTYPES[prec]
        for key, fn in (("mm", lambda: matmul_curve(dev, dt, sizes["mm"], budget_s)),
                        ("attn", lambda: attention_curve(dev, dt, sizes["attn"], budget_s)),
                        ("mem", lambda: memory_curve(dev, sizes["mem"], budget_s))):
            dist.barrier()
            out[key] = fn()
    if dist.get_world_size() > 1:
        out["coll"] = _allreduce_times(sizes["coll"], dev)
    return out


def measure(ranks: int, device: str, prec: str, sizes: dict[str, list[int]],
            compute: bool = True, budget_s: float = 0.2) -> dict[str, Any]:
    """Curves (median rate over ranks) and the all-reduce fit, measured on ``ranks`` ranks.

    ``budget_s`` is the time spent per operation size; longer runs measure the sustained rate
    a training run gets on a shared machine rather than a burst.
    """
    from hetpar.runtime.launch import launch

    backend = "nccl" if device.startswith("cuda") else "gloo"
    res = launch(measure_rank, ranks, device, prec, sizes, compute, budget_s, timeout_s=120,
                 backend=backend)
    out: dict[str, Any] = {}
    for key in ("mm", "attn", "mem"):
        if compute:
            curves = [r[key] for r in res]
            rates = tuple(statistics.median(c.rate[i] for c in curves)
                          for i in range(len(curves[0].rate)))
            out[key] = Curve(size=curves[0].size, rate=rates)
    if ranks > 1:
        times = [max(r["coll"][i] for r in res) for i in range(len(sizes["coll"]))]
        out["coll"] = collective_fit(ranks, sizes["coll"], times)
    return out


def collective_fit(ranks: int, sizes: list[int], times: list[float]) -> dict[str, float]:
    """Fit all-reduce times of float32 ``sizes`` to t = a + bytes * b by least squares.

    Returns the simulator's ring parameters (Patarasuk & Yuan 2009): per-hop latency
    ``a / (2 (n-1))`` and bandwidth ``2 (n-1)/n / b`` bytes/s.
    """
    xs = [4.0 * n for n in sizes]
    mx, my = statistics.fmean(xs), statistics.fmean(times)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, times, strict=True)) / sum(
        (x - mx) ** 2 for x in xs)
    b = max(b, 1e-15)
    a = max(my - b * mx, 1e-7)
    hops = 2 * (ranks - 1)
    return {"latency_s": a / hops, "bandwidth_bytes_s": terms.ring_traffic("all_reduce", ranks) / b,
            "points": len(sizes)}


def host_memory_gib(ranks: int) -> float:
    """Physical memory per local rank (GiB)."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return total / ranks / 2**30
