"""Concurrent flows that share links: max-min fair rates (progressive filling)."""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence


def fair_rates(
    routes: Sequence[Sequence[Hashable]], capacity: Mapping[Hashable, float]
) -> list[float]:
    """Bytes/s of each flow when flows share links max-min fairly (Bertsekas & Gallager 1992,
    Sec. 6.5.2): raise every unfrozen flow's rate together until some link is full, freeze
    the flows on it, repeat. TCP and NCCL's channels approach this share on a common link.
    """
    rates = [0.0] * len(routes)
    left = dict(capacity)
    active = {i for i, r in enumerate(routes) if r}
    for i, r in enumerate(routes):
        if not r:
            rates[i] = math.inf
    while active:
        users: dict[Hashable, list[int]] = {}
        for i in active:
            for link in routes[i]:
                users.setdefault(link, []).append(i)
        link, inc = min(((lk, left[lk] / len(fs)) for lk, fs in users.items()),
                        key=lambda x: x[1])
        for i in active:
            rates[i] += inc
        for lk, fs in users.items():
            left[lk] -= inc * len(fs)
        done = {i for i in users[link]}
        done |= {i for lk, fs in users.items() if left[lk] <= 1e-9 * capacity[lk] for i in fs}
        active -= done
    return rates

