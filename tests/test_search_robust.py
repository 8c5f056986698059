"""Robust choice: intervals from the compute/network mix, P(#1 beats #2), the robust
objective's low quantile, and the "why #1 won" reorder report."""

from hetpar.search.costmodel import Evaluation
from hetpar.search.explain import reorder
from hetpar.search.generate import Ranked, SearchState
from hetpar.search.objectives import Objective
from hetpar.search.planner import _robust_rerank
from hetpar.search.robust import Uncertainty, interval, p_beats, robust_score
from hetpar.search.rules import SearchStats
from hetpar.specs.plan import Plan

U = Uncertainty()
TOKENS = 1_000_000.0


def ev(compute: float, network: float, rest: float = 0.0, report=None) -> Evaluation:
    t = compute + network + rest
    return Evaluation(iteration_time_s=t, tokens_per_s=TOKENS / t, num_gpus=8,
                      breakdown={"compute": compute, "dp_comm": network, "overhead": rest},
                      report=report or {})


def ranked(name: str, e: Evaluation) -> Ranked:
    return Ranked(plan=Plan(name=name, global_batch=8), evaluation=e, score=(e.tokens_per_s,),
                  gpus=8, price_per_hour=0.0, key=name, bound=e.tokens_per_s)


def test_tie_in_expectation_robust_picks_the_narrower():
    narrow, wide = ev(0.9, 0.1), ev(0.4, 0.6)  # both 1.0 s: same expected tokens/s
    assert narrow.tokens_per_s == wide.tokens_per_s
    lo_n, hi_n = interval(narrow, U)
    lo_w, hi_w = interval(wide, U)
    assert hi_w - lo_w > hi_n - lo_n  # more time on the network: wider interval
    # the planner breaks ties by key and "a-wide" sorts first: only the robust score can
    # put "b-narrow" first
    state = SearchState(SearchStats(), results=[ranked("a-wide", wide), ranked("b-narrow", narrow)])
    _robust_rerank(state, Objective(name="robust"))
    best = sorted(state.results, key=lambda r: (tuple(-x for x in r.score), r.key))[0]
    assert best.key == "b-narrow"
    assert robust_score(narrow, U) > robust_score(wide, U)


def test_p_beats_is_a_probability_of_the_faster():
    a, b = ev(0.9, 0.1), ev(0.95, 0.15)
    p = p_beats(a, b, U)
    assert 0.5 < p < 1.0
    assert abs(p + p_beats(b, a, U) - 1.0) < 1e-9
    assert abs(p_beats(a, a, U) - 0.5) < 1e-9
    # a narrower simulator interval makes the same gap more certain
    assert p_beats(a, b, Uncertainty(sim_interval=0.02)) > p


def test_simulator_interval_in_the_report_is_used():
    base = ev(1.0, 0.0)
    given = ev(1.0, 0.0, report={"tokens_per_s_interval": [0.5 * TOKENS, 2.0 * TOKENS]})
    lo_b, hi_b = interval(base, U)
    lo_g, hi_g = interval(given, U)
    assert hi_g / lo_g > 2 * hi_b / lo_b


def test_reorder_report_changes_when_the_advantage_is_inside_the_interval():
    first = ranked("first", ev(1.0, 0.0))
    close = ranked("close", ev(0.41, 0.61))  # 2% slower, mostly network
    far = ranked("far", ev(0.6, 0.9))  # 50% slower, mostly network
    inside = reorder([first, close], U)
    outside = reorder([first, far], U)
    assert any("#2 overtakes #1" in line for line in inside)
    assert not any("overtakes" in line for line in outside)
    assert all("stays first" in line for line in outside)
