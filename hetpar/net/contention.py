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



def overlap_delay(a_s: float, b_s: float) -> float:
    """Seconds two transfers that start together on one link each finish later than alone.

    Max-min fair on one link (``fair_rates``: two flows each get half) is processor sharing:
    both move at half rate until the one needing less link time (``min``) is done, so it ends
    at 2 x min, and the other at a + b; each is late by min(a, b) (Kleinrock 1976, Vol. II
    Sec. 4.4, processor sharing).
    """
    return min(max(a_s, 0.0), max(b_s, 0.0))


def share_link(a: frozenset[Hashable], b: frozenset[Hashable]) -> bool:
    """Whether two communicators' link sets (``NetworkView.links``) have a link in common."""
    return not a.isdisjoint(b)
