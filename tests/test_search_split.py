"""Layer-split DP, its closed-form fast path, batch shares and chunk ranges vs brute force."""

import itertools

import numpy as np
import pytest

from hetpar.search.exhaustive import compositions
from hetpar.search.split import (
    RankCost,
    batch_shares,
    chunk_ranges,
    split_layers_dp,
    split_layers_exact,
    split_linear,
)


def brute(ranks, a, b, least):
    n = len(ranks[0].layer_times)
    best = None
    for counts in compositions(n, len(ranks), least):
        if any(c > r.max_layers for c, r in zip(counts, ranks, strict=True)):
            continue
        start, times = 0, []
        for c, r in zip(counts, ranks, strict=True):
            times.append(sum(r.layer_times[start:start + c]) + r.extra_s)
            start += c
        obj = a * max(times) + b * sum(times)
        best = obj if best is None else min(best, obj)
    return best


def random_ranks(rng, uniform_layers):
    p = int(rng.integers(1, 5))
    n = int(rng.integers(p, 14))
    ranks = []
    for r in range(p):
        if uniform_layers:
            times = (float(rng.uniform(0.5, 3.0)),) * n
        else:  # e.g. MoE layers every other layer: per-layer costs differ
            times = tuple(float(x) for x in rng.uniform(0.5, 3.0, n))
        extra = float(rng.uniform(0, 2)) if r in (0, p - 1) else 0.0
        cap = int(rng.integers(1, n + 1))
        ranks.append(RankCost(layer_times=times, extra_s=extra, max_layers=cap))
    return ranks


@pytest.mark.parametrize("uniform_layers", [True, False])
def test_split_matches_brute_force(uniform_layers):
    rng = np.random.default_rng(7)
    checked = 0
    for _ in range(300):
        ranks = random_ranks(rng, uniform_layers)
        a, b = float(rng.integers(1, 12)), float(rng.choice([0.0, 1.0, 0.5]))
        least = int(rng.integers(1, 3))
        want = brute(ranks, a, b, least)
        got = split_layers_exact(ranks, a, b, least)
        if want is None:
            assert got is None
            continue
        checked += 1
        assert got is not None
        assert got.objective == pytest.approx(want, rel=1e-9)
        assert sum(got.layers) == len(ranks[0].layer_times)
        assert all(least <= c <= r.max_layers for c, r in zip(got.layers, ranks, strict=True))
    assert checked > 100


def test_linear_fast_path_equals_dp():
    rng = np.random.default_rng(11)
    for _ in range(300):
        ranks = random_ranks(rng, True)
        a, b = float(rng.integers(1, 30)), 1.0
        x, y = split_linear(ranks, a, b, 1), split_layers_dp(ranks, a, b, 1)
        assert (x is None) == (y is None)
        if x is not None and y is not None:
            assert x.objective == pytest.approx(y.objective, rel=1e-9)


def test_faster_rank_gets_more_layers_not_rounding():
    # 80 layers on a 1.0 s/layer rank and a 0.7 s/layer last rank that also runs the head
    # (2 s). Splitting in proportion to speed and rounding gives 33/47 (max 34.9 s); the
    # exact optimum is 34/46 (max(34, 0.7*46 + 2) = 34.2 s).
    slow = RankCost(layer_times=(1.0,) * 80)
    fast = RankCost(layer_times=(0.7,) * 80, extra_s=2.0)
    s = split_layers_exact([slow, fast], a=1.0, b=0.0)
    assert s is not None and s.layers == (34, 46)
    assert s.max_time == pytest.approx(34.2)


def test_memory_cap_forces_layers_elsewhere():
    slow = RankCost(layer_times=(1.0,) * 10, max_layers=10)
    fast = RankCost(layer_times=(0.1,) * 10, max_layers=3)
    s = split_layers_exact([slow, fast], a=1.0, b=0.0)
    assert s is not None and s.layers == (7, 3)
    assert split_layers_exact([RankCost(layer_times=(1.0,) * 10, max_layers=4)] * 2) is None


def test_batch_shares_are_optimal():
    rng = np.random.default_rng(3)
    for _ in range(100):
        d = int(rng.integers(1, 4))
        units = int(rng.integers(d, 12))
        slopes = rng.uniform(0.5, 3.0, d)
        offs = rng.uniform(0, 5.0, d)
        fns = [lambda k, s=s, o=o: s * k + o for s, o in zip(slopes, offs, strict=True)]
        counts, worst = batch_shares(fns, units)
        assert sum(counts) == units and min(counts) >= 1
        best = min(
            max(f(k) for f, k in zip(fns, ks, strict=True))
            for ks in itertools.product(range(1, units + 1), repeat=d) if sum(ks) == units
        )
        assert worst == pytest.approx(best)
    assert batch_shares([lambda k: k, lambda k: k], 1) is None


def test_chunk_ranges_interleave_ranks():
    # rank 0 has 5 layers, rank 1 has 3, two chunks each: model order r0c0 r1c0 r0c1 r1c1.
    assert chunk_ranges([5, 3], 2) == [(0, 3), (3, 5), (5, 7), (7, 8)]
    assert chunk_ranges([4], 1) == [(0, 4)]


def test_a_structure_hashes_as_its_fields_once_and_pickles_without_it() -> None:
    import pickle

    from hetpar.search.structures import ReplicaClass, Slot, Structure

    c = ReplicaClass(count=2, ranks=(Slot("a", 1), Slot("b", 2)))
    s = Structure(family="split", classes=(c,))
    assert hash(c) == hash((2, c.ranks, "dp-inner"))  # the hash dataclass would generate
    assert hash(s) == hash(("split", (c,), None, "dp-inner"))
    back = pickle.loads(pickle.dumps(s))
    assert back == s and "_hash" not in back.__dict__ and "_hash" in s.__dict__
