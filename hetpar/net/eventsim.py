"""A tiny discrete-event network simulator: transfers with dependencies over fair-shared links.

Used to check the closed-form collective costs: a collective is written out as individual
transfers (who sends how many bytes to whom after which other transfers arrived), each routed
over links; at every start or finish the rates are recomputed max-min fairly.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

from hetpar.net.contention import fair_rates


@dataclass
class Transfer:
    """``nbytes`` over ``route`` (links), starting once every transfer in ``after`` arrived."""

    route: tuple[Hashable, ...]
    nbytes: float
    latency: float
    after: tuple[int, ...] = ()
    left: float = field(init=False, default=0.0)
    done_at: float = field(init=False, default=math.nan)


def run(transfers: Sequence[Transfer], capacity: dict[Hashable, float]) -> float:
    """Simulate; return the time the last transfer arrives.

    A transfer's bytes flow once its dependencies arrived; it arrives ``latency`` after its
    last byte left (store-and-forward per message, as NCCL's per-step handshake).
    """
    for t in transfers:
        t.left = t.nbytes
    ready_at = {i: 0.0 for i, t in enumerate(transfers) if not t.after}
    flowing: set[int] = set()
    sent_at: dict[int, float] = {}
    now = 0.0
    while len(sent_at) < len(transfers):
        for i, at in list(ready_at.items()):
            if at <= now + 1e-15:
                flowing.add(i)
                del ready_at[i]
        rates = fair_rates([transfers[i].route for i in sorted(flowing)], capacity)
        rate = dict(zip(sorted(flowing), rates, strict=True))
        finish = min((transfers[i].left / rate[i] for i in flowing), default=math.inf)
        nxt = min(ready_at.values(), default=math.inf)
        step = min(finish, nxt - now)
        assert step < math.inf, "deadlock: nothing flows and nothing becomes ready"
        now += step
        for i in list(flowing):
            transfers[i].left -= rate[i] * step
            if transfers[i].left <= 1e-9 * max(transfers[i].nbytes, 1.0):
                flowing.discard(i)
                sent_at[i] = now
                transfers[i].done_at = now + transfers[i].latency
                _release(transfers, i, ready_at, sent_at)
    return max(t.done_at for t in transfers)


def _release(transfers: Sequence[Transfer], i: int, ready_at: dict[int, float],
             sent_at: dict[int, float]) -> None:
    """Make ready every transfer whose dependencies have now all been sent (at their arrival)."""
    for j, t in enumerate(transfers):
        if j in sent_at or j in ready_at or i not in t.after:
            continue
        if all(d in sent_at for d in t.after):
            ready_at[j] = max(transfers[d].done_at for d in t.after)


Route = Callable[[int, int], tuple[Hashable, ...]]


def ring_transfers(ranks: Sequence[int], nbytes: float, phases: int, route: Route,
                   latency: Callable[[int, int], float]) -> list[Transfer]:
    """A ring reduce-scatter (phases=1) or all-reduce (2) over ``ranks`` in that order.

    Step s: every rank sends one 1/n chunk to its successor, after receiving step s-1.
    """
    n = len(ranks)
    out: list[Transfer] = []
    prev: dict[int, int] = {}
    for _ in range(phases * (n - 1)):
        cur: dict[int, int] = {}
        for j in range(n):
            a, b = ranks[j], ranks[(j + 1) % n]
            dep = (prev[ranks[(j - 1) % n]],) if prev else ()
            out.append(Transfer(route(a, b), nbytes / n, latency(a, b), after=dep))
            cur[a] = len(out) - 1
        prev = cur
    return out


def double_tree_transfers(n: int, nbytes: float, chunks: int, route: Route,
                          latency: float) -> list[Transfer]:
    """All-reduce on two binary trees (Sanders et al. 2009), each carrying half the bytes in
    ``chunks`` pipelined pieces: reduce towards the root, then broadcast back down.
    Tree 1 is the in-order tree on 0..n-1; tree 2 is it shifted by one rank, so the leaves
    of one tree are the inner nodes of the other.
    """
    out: list[Transfer] = []
    for shift in (0, 1):
        parent = _inorder_parents(n)
        rank = [(i + shift) % n for i in range(n)]
        kids: dict[int, list[int]] = {i: [] for i in range(n)}
        for c, p in parent.items():
            kids[p].append(c)
        root = next(i for i in range(n) if i not in parent)
        piece = nbytes / 2 / chunks
        last_up: dict[int, int] = {}
        last_down: dict[int, int] = {}
        for _ in range(chunks):
            # a link sends its chunks in order (FIFO), so chunk c also waits for chunk c-1
            up: dict[int, int] = {}
            for v in _postorder(root, kids):
                if v == root:
                    continue
                dep = tuple(up[c] for c in kids[v]) + _prev(last_up, v)
                out.append(Transfer(route(rank[v], rank[parent[v]]), piece, latency, after=dep))
                up[v] = last_up[v] = len(out) - 1
            down: dict[int, int] = {}
            for v in reversed(_postorder(root, kids)):
                for c in kids[v]:
                    dep = (down[v],) if v in down else tuple(up[k] for k in kids[root])
                    dep += _prev(last_down, c)
                    out.append(Transfer(route(rank[v], rank[c]), piece, latency, after=dep))
                    down[c] = last_down[c] = len(out) - 1
    return out


def _prev(last: dict[int, int], v: int) -> tuple[int, ...]:
    return (last[v],) if v in last else ()


def _inorder_parents(n: int) -> dict[int, int]:
    parent: dict[int, int] = {}

    def build(lo: int, hi: int) -> int:
        mid = (lo + hi) // 2
        if lo < mid:
            parent[build(lo, mid - 1)] = mid
        if mid < hi:
            parent[build(mid + 1, hi)] = mid
        return mid

    build(0, n - 1)
    return parent


def _postorder(root: int, kids: dict[int, list[int]]) -> list[int]:
    out: list[int] = []
    stack = [(root, False)]
    while stack:
        v, seen = stack.pop()
        if seen:
            out.append(v)
            continue
        stack.append((v, True))
        stack.extend((c, False) for c in kids[v])
    return out
