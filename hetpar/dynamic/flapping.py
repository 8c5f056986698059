"""Flapping conditions: the mix of states a cluster alternates between, and the plan best on it.

When a source changes every few seconds no single state lasts long enough to plan for,
but the alternation itself does: the plan to run is the one with the best throughput
averaged over the states, weighted by the time spent in each (as a robust plan for a
known distribution of conditions). Adaptive replay uses this during flapping, at most
once per episode, instead of following each flip.
"""

from __future__ import annotations

from collections.abc import Callable

from hetpar.dynamic.cost import ThroughputModel
from hetpar.dynamic.state import ClusterState, Step, relocate
from hetpar.errors import Infeasible
from hetpar.specs.cluster import ClusterSpec
from hetpar.specs.plan import Plan

Mix = list[tuple[ClusterState, float]]
"""Distinct states (one representative each) and the seconds spent in them."""


def recent_mix(steps: list[Step], i: int, t: float, window_s: float,
               min_changes: int) -> Mix | None:
    """States of the last ``window_s`` seconds before ``t`` (step ``i`` is current), or None
    if the cluster changed fewer than ``min_changes`` times in that window."""
    lo = t - window_s
    if i < min_changes or steps[i - min_changes + 1].t_s < lo:
        return None
    seen: dict[ClusterSpec | None, tuple[ClusterState, float]] = {}
    j = i
    while j >= 0:
        a, b = max(steps[j].t_s, lo), (t if j == i else steps[j + 1].t_s)
        if b > a:
            rep, w = seen.get(steps[j].state.cluster, (steps[j].state, 0.0))
            seen[steps[j].state.cluster] = (rep, w + b - a)
        if steps[j].t_s <= lo:
            break
        j -= 1
    return list(seen.values()) if len(seen) > 1 else None


def mix_throughput(plan: Plan, home: ClusterState, mix: Mix, cost: ThroughputModel) -> float:
    """Time-weighted mean tokens/s of ``plan`` (in ``home``'s names) over the states of ``mix``."""
    total = sum(w for _, w in mix)
    out = 0.0
    for state, w in mix:
        try:
            out += w * cost.tokens_per_s(relocate(plan, home, state), state)
        except Infeasible:
            pass
    return out / total


def best_on_mix(current: Plan, home: ClusterState, mix: Mix, cost: ThroughputModel,
                best_for: Callable[[ClusterState], Plan | None],
                ) -> tuple[Plan, ClusterState, float]:
    """Among the current plan and each state's best plan, the one best on average over ``mix``.

    Returns the plan, the state whose names it uses, and its mean tokens/s.
    """
    cands: list[tuple[Plan, ClusterState]] = [(current, home)]
    for state, _ in mix:
        p = best_for(state)
        if p is not None:
            cands.append((p, state))
    scored = [(mix_throughput(p, s, mix, cost), k) for k, (p, s) in enumerate(cands)]
    value, k = max(scored)
    return cands[k][0], cands[k][1], value
