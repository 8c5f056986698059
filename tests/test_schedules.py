from __future__ import annotations

import itertools
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetpar.errors import ConfigError, Infeasible
from hetpar.schedules import (
    Action,
    ChunkTimes,
    Schedule,
    build,
    execute,
    in_flight,
    names,
    register,
    registry,
    traits,
)
from hetpar.schedules.registry import _REGISTRY

BUILTINS = names()  # every schedule bundled (registered at import) is checked below
halves = st.integers(1, 8).map(lambda k: k / 2)  # exact in binary: closed forms compare exactly


@st.composite
def schedules(draw: st.DrawFn) -> Schedule:
    name = draw(st.sampled_from(BUILTINS))
    tr = traits(name)
    pp, m = max(draw(st.integers(1, 8)), tr.min_pp), draw(st.integers(1, 24))
    vpp = {"single": 1, "v": 2}.get(tr.chunks) or draw(st.integers(2, 4))
    m = -(-m // tr.microbatch_unit(pp)) * tr.microbatch_unit(pp)
    return build(name, pp, m, vpp)


def unit_times(s: Schedule, f: float = 1.0, b: float = 1.0, w: float = 0.0) -> ChunkTimes:
    n = s.num_chunks
    return ChunkTimes(forward=[f] * n, backward=[b] * n, weight=[w] * n)


def test_builtins_registered() -> None:
    assert {"1f1b", "gpipe", "interleaved", "zb-h1"} <= set(BUILTINS)


@pytest.mark.parametrize("name", BUILTINS)
def test_traits_agree_with_what_the_builder_accepts(name: str) -> None:
    """A schedule's declared limits are exactly the combinations its builder can express."""
    tr = traits(name)
    for pp, m, vpp in itertools.product((1, 2, 3, 4), (1, 2, 3, 4, 6, 8), (1, 2, 3)):
        why = tr.problem(name, pp, vpp, m)
        try:
            _REGISTRY[name].builder(pp, m, vpp)
        except Infeasible:
            assert why is not None, (name, pp, m, vpp)
        else:
            assert why is None, (name, pp, m, vpp, why)


@settings(max_examples=150, deadline=None)
@given(schedules())
def test_each_action_exactly_once_on_its_rank(s: Schedule) -> None:
    kinds = "FBW" if s.splits_backward else "FB"
    seen = Counter((a.kind, a.chunk, a.microbatch) for acts in s.ranks for a in acts)
    expected = {
        (k, c, mb) for k in kinds for c in range(s.num_chunks) for mb in range(s.num_microbatches)
    }
    assert set(seen) == expected
    assert max(seen.values()) == 1
    for r, acts in enumerate(s.ranks):
        assert all(s.rank_of(a.chunk) == r for a in acts)


@settings(max_examples=150, deadline=None)
@given(schedules())
def test_rank_order_respects_local_dependencies(s: Schedule) -> None:
    for acts in s.ranks:
        pos = {(a.kind, a.chunk, a.microbatch): i for i, a in enumerate(acts)}
        for (kind, c, mb), i in pos.items():
            if kind == "B":
                assert pos[("F", c, mb)] < i
                if ("B", c + 1, mb) in pos:  # the next chunk lives on this rank (pp == 1)
                    assert pos[("B", c + 1, mb)] < i
            elif kind == "W":
                assert pos[("B", c, mb)] < i
            elif ("F", c - 1, mb) in pos:
                assert pos[("F", c - 1, mb)] < i


@settings(max_examples=100, deadline=None)
@given(schedules(), st.data())
def test_execute_respects_every_dependency(s: Schedule, data: st.DataObject) -> None:
    n = s.num_chunks
    fwd = data.draw(st.lists(halves, min_size=n, max_size=n))
    bwd = data.draw(st.lists(halves, min_size=n, max_size=n))
    wgt = data.draw(st.lists(halves, min_size=n, max_size=n))
    p2p = data.draw(halves)
    t = execute(s, ChunkTimes(forward=fwd, backward=bwd, weight=wgt), p2p=p2p)
    def hop(c: int) -> float:  # boundary c -> c + 1: nothing to send within one rank
        return 0.0 if s.rank_of(c) == s.rank_of(c + 1) else p2p

    when = {(a.kind, a.chunk, a.microbatch): (b, e) for acts in t.ranks for a, b, e in acts}
    for (kind, c, mb), (start, _) in when.items():
        if kind == "F" and c > 0:
            assert start >= when[("F", c - 1, mb)][1] + hop(c - 1)
        if kind == "B":
            assert start >= when[("F", c, mb)][1]
            if c + 1 < n:
                assert start >= when[("B", c + 1, mb)][1] + hop(c)
        if kind == "W":
            assert start >= when[("B", c, mb)][1]
    for acts in t.ranks:  # one action at a time, in the schedule's order
        assert all(acts[i][2] <= acts[i + 1][1] for i in range(len(acts) - 1))
    assert t.makespan == max(e for _, e in when.values())
    assert min(t.idle) >= 0 and t.bubble >= 0


@settings(max_examples=150, deadline=None)
@given(schedules())
def test_in_flight_bounds(s: Schedule) -> None:
    peaks, m = in_flight(s), s.num_microbatches
    if s.name == "gpipe":
        assert peaks == (m,) * s.pp
    elif s.name in ("1f1b", "zb-h1"):
        assert peaks == tuple(min(s.pp - r, m) for r in range(s.pp))
    elif s.name in ("zb-1p", "zb-2p"):  # held until W, within the memory limit (Qi et al.)
        limit = s.pp if s.name == "zb-1p" else 2 * s.pp
        held = in_flight(s, until="W")
        assert max(held) <= min(limit, m) and held[0] == min(limit, m)
    elif s.name == "zbv":  # pp micro-batches of both half chunks: 1F1B's peak (Qi et al.)
        held = in_flight(s, until="W")
        assert max(held) == 2 * min(s.pp, m)
        if m >= 2 * s.pp - 1:  # the order's full warm-up: every rank at that peak
            assert held == (2 * s.pp,) * s.pp
    else:  # Megatron interleaved: its warm-up forwards plus the first steady one
        total = m * s.vpp
        for r, peak in enumerate(peaks):
            warm = total if m == s.pp else 2 * (s.pp - r - 1) + (s.vpp - 1) * s.pp
            assert peak == min(total, warm + 1)
    if s.name == "zb-h1":  # the paper: every rank holds the same number until W
        assert in_flight(s, until="W") == (min(s.pp, m),) * s.pp


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(["gpipe", "1f1b"]), st.integers(1, 8), st.integers(1, 24), halves, halves)
def test_gpipe_1f1b_makespan_closed_form(
    name: str, pp: int, m: int, tf: float, tb: float
) -> None:
    s = build(name, pp, m)
    assert execute(s, unit_times(s, tf, tb)).makespan == (m + pp - 1) * (tf + tb)


@settings(max_examples=100, deadline=None)
@given(st.integers(2, 8), st.integers(1, 4), st.integers(2, 4), halves, halves)
def test_interleaved_bubble_closed_form(pp: int, k: int, vpp: int, tf: float, tb: float) -> None:
    # SC'21 sec 2.2.2: bubble = (pp-1)(tF+tB)/vpp with tF, tB per microbatch for the whole
    # rank, so each of the vpp chunks takes tF/vpp and tB/vpp.
    m = k * pp
    s = build("interleaved", pp, m, vpp)
    t = execute(s, unit_times(s, tf / vpp, tb / vpp))
    assert t.bubble == pytest.approx((pp - 1) * (tf + tb) / vpp)
    assert t.makespan == pytest.approx(m * (tf + tb) + (pp - 1) * (tf + tb) / vpp)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 8), st.integers(0, 16), halves, halves, st.data())
def test_zb_h1_bubble_closed_form(
    pp: int, extra: int, tf: float, tb: float, data: st.DataObject
) -> None:
    # Derived in hetpar/schedules/zero_bubble.py: (pp-1)(TF+TB-TW) for m >= pp, TW <= TF, TB.
    tw = data.draw(halves.filter(lambda w: w <= min(tf, tb)))
    m = pp + extra
    zb = build("zb-h1", pp, m)
    t = execute(zb, unit_times(zb, tf, tb, tw))
    assert t.bubble == pytest.approx((pp - 1) * (tf + tb - tw))
    assert t.makespan == pytest.approx(m * (tf + tb + tw) + (pp - 1) * (tf + tb - tw))
    ref = build("1f1b", pp, m)
    t1 = execute(ref, unit_times(ref, tf, tb, tw))  # 1F1B runs B+W as one backward
    assert t1.bubble == pytest.approx((pp - 1) * (tf + tb + tw))
    if pp > 1:
        assert t.bubble < t1.bubble


def test_zb_h1_third_of_1f1b_bubble_with_equal_passes() -> None:
    zb, ref = build("zb-h1", 4, 8), build("1f1b", 4, 8)
    bubble_zb = execute(zb, unit_times(zb, 1, 1, 1)).bubble
    bubble_1f1b = execute(ref, unit_times(ref, 1, 1, 1)).bubble
    assert bubble_zb * 3 == bubble_1f1b == 9


def test_callable_durations_and_p2p_match_chunk_times() -> None:
    s = build("interleaved", 4, 8, 2)
    f, b = [0.5 + c for c in range(8)], [1.0 + 2 * c for c in range(8)]
    fast = execute(s, ChunkTimes(forward=f, backward=b), p2p=0.25)
    slow = execute(
        s,
        lambda r, a: f[a.chunk] if a.kind == "F" else b[a.chunk],
        p2p=lambda src, dst: 0.25,
    )
    assert fast == slow
    assert fast.makespan > execute(s, ChunkTimes(forward=f, backward=b)).makespan


def test_p2p_per_boundary_is_used() -> None:
    s = build("1f1b", 2, 1)
    t = execute(s, unit_times(s, 1, 2), p2p=lambda src, dst: 3.0 if src < dst else 5.0)
    assert t.makespan == 1 + 3 + 1 + 2 + 5 + 2


def test_deadlock_is_reported_with_rank_and_action() -> None:
    bad = Schedule(
        name="bad", pp=2, vpp=1, num_microbatches=1, splits_backward=False,
        ranks=(
            (Action(kind="B", chunk=0, microbatch=0), Action(kind="F", chunk=0, microbatch=0)),
            (Action(kind="F", chunk=1, microbatch=0), Action(kind="B", chunk=1, microbatch=0)),
        ),
    )
    with pytest.raises(AssertionError, match="rank 0 at B0.0"):
        execute(bad, unit_times(bad))


def test_errors() -> None:
    with pytest.raises(ConfigError, match="known: .*1f1b"):
        build("pipedream-2bw", 4, 8)
    with pytest.raises(ConfigError, match="num_microbatches"):
        build("1f1b", 4, 0)
    for args in [("interleaved", 4, 8, 1), ("interleaved", 4, 6, 2), ("interleaved", 1, 4, 2),
                 ("gpipe", 4, 8, 2), ("1f1b", 2, 4, 2), ("zb-h1", 2, 4, 2)]:
        with pytest.raises(Infeasible) as e:
            build(*args)
        assert e.value.kind == "schedule"


def test_chunk_times_checked() -> None:
    s = build("1f1b", 2, 2)
    with pytest.raises(ConfigError, match="forward has 1 entries"):
        execute(s, ChunkTimes(forward=[1.0], backward=[1.0, 1.0]))


def test_register_adds_a_schedule(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))

    @register("serial")
    def serial(pp: int, m: int, vpp: int) -> list[list[Action]]:
        return [[Action(kind=k, chunk=0, microbatch=i) for i in range(m) for k in "FB"]]

    assert "serial" in names()
    s = build("serial", 1, 3)
    assert execute(s, unit_times(s, 1, 2)).makespan == 9


@settings(max_examples=60, deadline=None)
@given(schedules(), st.integers(0, 2**16))
def test_execute_with_per_microbatch_durations_and_per_link_p2p(s: Schedule, seed: int) -> None:
    def dur(rank: int, a: Action) -> float:
        assert s.rank_of(a.chunk) == rank
        return 0.5 + ((seed + 7 * a.chunk + 13 * a.microbatch + ord(a.kind)) % 5) / 2

    def hop(src: int, dst: int) -> float:
        return ((seed + src * 3 + dst) % 3) / 4

    t = execute(s, dur, p2p=hop)
    when = {(a.kind, a.chunk, a.microbatch): (b, e) for acts in t.ranks for a, b, e in acts}

    def link(src: int, dst: int) -> float:
        return hop(src, dst) if s.rank_of(src) != s.rank_of(dst) else 0.0

    for acts in t.ranks:
        free = 0.0
        for a, start, end in acts:
            c, mb = a.chunk, a.microbatch
            ready = [free]  # each action starts as soon as its rank and its inputs allow
            if a.kind == "F" and c > 0:
                ready.append(when[("F", c - 1, mb)][1] + link(c - 1, c))
            if a.kind == "B":
                ready.append(when[("F", c, mb)][1])
                if c + 1 < s.num_chunks:
                    ready.append(when[("B", c + 1, mb)][1] + link(c + 1, c))
            if a.kind == "W":
                ready.append(when[("B", c, mb)][1])
            assert start == max(ready)
            assert end - start == dur(s.rank_of(c), a)
            free = end


def test_defaults_and_the_runs_file_vocabulary_come_from_the_traits() -> None:
    from hetpar import schedules
    from hetpar.specs.plan import Plan

    assert Plan(global_batch=1).schedule == schedules.DEFAULT  # specs cannot import schedules
    assert schedules.default_for(1) == schedules.DEFAULT
    assert schedules.traits(schedules.default_for(2)).chunks == "looped"
    vocab = schedules.vocabulary()
    assert set(names()) <= set(vocab)
    for name in vocab:  # every name a runs file may give is simulated by a registered one
        near = schedules.stand_in(name)
        assert near in names() and (near == name) == (name in names())
    assert schedules.stand_in("no-such-schedule") is None
    # the lock-step engine (DeepSpeed TrainSchedule) runs single-chunk 1F1B-ordered schedules
    # (the DeepSpeed export target names exactly these: tests/test_export_plugin.py)
    for name in names():
        t = schedules.traits(name)
        assert not t.lockstep or t.chunks == "single"
