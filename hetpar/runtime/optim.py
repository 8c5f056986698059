"""Adam on flat tensors, elementwise, so a sharded (ZeRO) update equals the full one exactly."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, kw_only=True)
class AdamConfig:
    """Adam hyper-parameters (Kingma & Ba 2015); no weight decay so parity stays exact."""

    lr: float = 1e-2
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8


class AdamState:
    """First and second moments for one tensor (or one shard of a flat buffer)."""

    def __init__(self, like: torch.Tensor) -> None:
        self.m = torch.zeros_like(like)
        self.v = torch.zeros_like(like)


def adam_update(p: torch.Tensor, g: torch.Tensor, st: AdamState, step: int,
                cfg: AdamConfig) -> None:
    """One Adam step in place on ``p`` (``step`` counts from 1), Algorithm 1 of Kingma & Ba."""
    with torch.no_grad():
        st.m.mul_(cfg.beta1).add_(g, alpha=1 - cfg.beta1)
        st.v.mul_(cfg.beta2).addcmul_(g, g, value=1 - cfg.beta2)
        mhat = st.m / (1 - cfg.beta1**step)
        vhat = st.v / (1 - cfg.beta2**step)
        p.sub_(cfg.lr * mhat / (vhat.sqrt() + cfg.eps))
