"""The compiled, memoized lock-step makespan (sim/lockstep.py) equals ``run``'s last end."""

from hypothesis import given, seed, settings
from hypothesis import strategies as st

from hetpar.sim import lockstep

_TIME = st.one_of(st.just(0.0), st.floats(1e-6, 2.0, allow_nan=False, allow_infinity=False))


def _reference(fwd: list[float], bwd: list[float], act: list[float], grad: list[float],
               m: int) -> float:
    """The makespan as ``run`` records it, action by action."""
    return max((acts[-1][3] for acts in lockstep.run(fwd, bwd, act, grad, m) if acts),
               default=0.0)


@seed(36)
@settings(max_examples=150, deadline=None)
@given(st.integers(1, 9).flatmap(lambda pp: st.tuples(
    st.lists(_TIME, min_size=pp, max_size=pp), st.lists(_TIME, min_size=pp, max_size=pp),
    st.lists(_TIME, min_size=pp, max_size=pp), st.lists(_TIME, min_size=pp, max_size=pp),
    st.integers(1, 24))))
def test_makespan_equals_run(case: tuple[list[float], list[float], list[float], list[float],
                                         int]) -> None:
    fwd, bwd, act, grad, m = case
    lockstep._SPANS.clear()
    want = _reference(fwd, bwd, act, grad, m)
    assert lockstep.makespan(fwd, bwd, act, grad, m) == want  # computed
    assert lockstep.makespan(tuple(fwd), bwd, act, grad, m) == want  # memoized


def test_memo_is_keyed_on_values() -> None:
    """Changing one transfer time changes the answer, not a stale memo hit."""
    fwd, bwd = [1.0, 1.0, 1.0], [2.0, 2.0, 2.0]
    a = lockstep.makespan(fwd, bwd, [0.1, 0.1, 0.0], [0.2, 0.2, 0.0], 8)
    b = lockstep.makespan(fwd, bwd, [0.5, 0.1, 0.0], [0.2, 0.2, 0.0], 8)
    assert b > a
    assert b == _reference(fwd, bwd, [0.5, 0.1, 0.0], [0.2, 0.2, 0.0], 8)


def test_periodic_compilation_equals_direct() -> None:
    """A long schedule's steps are the short one's with its middle period repeated."""
    for pp in range(1, 13):
        for m in range(1, 4 * pp + 12):
            assert lockstep._compiled(pp, m) == lockstep._direct(pp, m), (pp, m)
