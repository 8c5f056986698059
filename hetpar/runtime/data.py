"""Seeded synthetic token data: a noisy affine Markov chain, so losses fall as the model learns."""

from __future__ import annotations

import torch

from hetpar.specs.model import ModelSpec

MULT, ADD, KEEP = 7, 3, 0.9


def global_batch(model: ModelSpec, step: int, batch: int, seq_len: int, seed: int = 0,
                 device: torch.device | str = "cpu") -> torch.Tensor:
    """Tokens of shape (batch, seq_len + 1) for ``step``; the same on every rank and run.

    Each sequence follows ``x[t+1] = (7 x[t] + 3) mod V`` with probability 0.9 and restarts
    from a uniform random token otherwise, which a small model can partly learn. Vectorised:
    ``x[t] = 7^k x[r] + 3 (7^(k-1) + ... + 1) mod V`` with ``r`` the last restart, ``k = t - r``.
    """
    g = torch.Generator().manual_seed(seed * 7919 + step)
    v, n = model.vocab, seq_len + 1
    noise = torch.randint(0, v, (batch, n), generator=g)
    restart = torch.rand((batch, n), generator=g) >= KEEP
    restart[:, 0] = True
    pos = torch.arange(n).expand(batch, n)
    last = torch.where(restart, pos, torch.zeros_like(pos)).cummax(dim=1).values
    k = pos - last
    mult, add = [1], [0]
    for _ in range(n):  # 7^k mod V and the geometric sum of 3 * 7^i mod V, by recurrence
        mult.append(mult[-1] * MULT % v)
        add.append((add[-1] * MULT + ADD) % v)
    start = noise.gather(1, last)
    out = (torch.tensor(mult)[k] * start + torch.tensor(add)[k]) % v
    return out.to(device)


def replica_rows(batches: list[int], replica: int) -> tuple[int, int]:
    """Rows [start, end) of the global batch that ``replica`` trains on (shares in order)."""
    start = sum(batches[:replica])
    return start, start + batches[replica]
