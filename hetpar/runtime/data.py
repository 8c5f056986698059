"""Seeded synthetic token data: a noisy affine Markov chain, so losses fall as the model learns."""

from __future__ import annotations

import torch

from hetpar.specs.model import ModelSpec


def global_batch(model: ModelSpec, step: int, batch: int, seq_len: int, seed: int = 0,
                 device: torch.device | str = "cpu") -> torch.Tensor:
    """Tokens of shape (batch, seq_len + 1) for ``step``; the same on every rank and run.

    Each sequence follows ``x[t+1] = (7 x[t] + 3) mod V`` with probability 0.9 and a uniform
    random token otherwise, which a small model can partly learn.
    """
    g = torch.Generator().manual_seed(seed * 7919 + step)
    v = model.vocab
    noise = torch.randint(0, v, (batch, seq_len + 1), generator=g)
    keep = torch.rand((batch, seq_len + 1), generator=g) < 0.9
    out = torch.empty_like(noise)
    out[:, 0] = noise[:, 0]
    for t in range(seq_len):
        nxt = (out[:, t] * 7 + 3) % v
        out[:, t + 1] = torch.where(keep[:, t + 1], nxt, noise[:, t + 1])
    return out.to(device)


def replica_rows(batches: list[int], replica: int) -> tuple[int, int]:
    """Rows [start, end) of the global batch that ``replica`` trains on (shares in order)."""
    start = sum(batches[:replica])
    return start, start + batches[replica]
