"""Count the bytes each rank's collectives send, per level (inside a node, across nodes)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

Log = list[tuple[str, tuple[int, ...], float]]


def _first(args: tuple[Any, ...], kw: dict[str, Any], *names: str) -> torch.Tensor:
    return args[0] if args else next(kw[n] for n in names if n in kw)


def _second(args: tuple[Any, ...], kw: dict[str, Any], *names: str) -> torch.Tensor:
    return args[1] if len(args) > 1 else next(kw[n] for n in names if n in kw)


def _nbytes(t: torch.Tensor) -> float:
    return float(t.numel() * t.element_size())


# Bytes one rank sends in each collective, as a ring (all-reduce, reduce-scatter, all-gather;
# Patarasuk & Yuan 2009) or a direct exchange (all-to-all; Thakur et al. 2005) moves them.
SENT: dict[str, Callable[[tuple[Any, ...], dict[str, Any], int], float]] = {
    "all_reduce": lambda a, kw, k: 2 * (k - 1) / k * _nbytes(_first(a, kw, "tensor")),
    "reduce_scatter_tensor": lambda a, kw, k: (k - 1) * _nbytes(_first(a, kw, "output")),
    "reduce_scatter_single": lambda a, kw, k: (k - 1) * _nbytes(_first(a, kw, "output")),
    "all_gather_into_tensor": lambda a, kw, k: (k - 1) / k * _nbytes(
        _first(a, kw, "output_tensor")),
    "all_gather_single": lambda a, kw, k: (k - 1) / k * _nbytes(
        _first(a, kw, "output_tensor")),
    "all_gather": lambda a, kw, k: (k - 1) * _nbytes(_second(a, kw, "tensor")),
    "all_to_all_single": lambda a, kw, k: (k - 1) / k * _nbytes(_second(a, kw, "input")),
}


def count(log: Log) -> None:
    """Wrap ``torch.distributed``'s collectives in this (forked) process so that each call
    on a named group appends (op, group ranks, bytes sent) to ``log`` once it succeeded
    (a reduce-scatter the backend lacks, retried as all-to-all, counts once). Calls on the
    default group (the loss all-reduce) and calls made inside another counted call are
    left out."""
    depth = [0]
    for name, sent in SENT.items():
        real = getattr(dist, name)

        def wrapped(*args: Any, _real: Any = real, _name: str = name,
                    _sent: Any = sent, **kw: Any) -> Any:
            group = kw.get("group")
            depth[0] += 1
            try:
                out = _real(*args, **kw)
            finally:
                depth[0] -= 1
            if group is not None and depth[0] == 0:
                ranks = tuple(dist.get_process_group_ranks(group))
                log.append((_name, ranks, _sent(args, kw, len(ranks))))
            return out

        setattr(dist, name, wrapped)


def per_level(log: Log, nodes: tuple[int, ...]) -> dict[str, float]:
    """Bytes sent inside one node and across nodes, summed over ``log``."""
    out = {"inside": 0.0, "across": 0.0}
    for _, ranks, sent in log:
        out["inside" if len({nodes[r] for r in ranks}) == 1 else "across"] += sent
    return out
