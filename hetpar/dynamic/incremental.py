"""Incremental re-planning for the search planner: re-price the last search's ranked plans.

A full ``hetpar.search`` on a 1,024-GPU heterogeneous cluster takes minutes (issue 36), too
slow to answer every change of a trace. Most changes (a link's bandwidth, a straggler) keep
the same GPUs, and the previous search's ranked plans are still valid plans there: moved to
the new state's group names (``state.relocate``) they are re-simulated, and the best is
the answer. Changes of the GPU set (nodes leaving or joining) make structures possible
that the previous ranking never saw, so they fall back to a full search.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hetpar.dynamic.state import ClusterState, relocate
from hetpar.errors import Infeasible
from hetpar.specs.plan import Plan


@dataclass(frozen=True, kw_only=True)
class Ranking:
    """The placed ranked plans (best first) of the last full search, and its state."""

    state: ClusterState
    plans: tuple[Plan, ...]


@dataclass(frozen=True, kw_only=True)
class Decision:
    """One answer: the plan (None if none runs), and whether it took a full search."""

    plan: Plan | None
    full: bool
    priced: int
    """Plans the incremental path re-simulated (0 for a full search)."""


def present(state: ClusterState) -> dict[str, int]:
    """Present nodes per original node group (nodes leave from the end, so a count says
    which ones)."""
    out: dict[str, int] = {}
    for p in state.parts:
        out[p.group] = out.get(p.group, 0) + p.num_nodes
    return out


Pick = Callable[[Sequence[Plan], ClusterState], "Plan | None"]
"""The best of these plans on this state (None if none runs): re-simulated, and for the
search planner with the collectives pass's forced variants where its bound says they
could win (``search/collsearch.py``)."""


def replan(state: ClusterState, last: Ranking | None, pick: Pick,
           full: Callable[[ClusterState], Ranking | None]) -> tuple[Decision, Ranking | None]:
    """The best plan for ``state``: from ``last``'s ranked plans when the GPU set is the
    same, else from ``full(state)``; returns the decision and the ranking to keep."""
    if last is None or present(last.state) != present(state):
        ranking = full(state)
        plan = ranking.plans[0] if ranking and ranking.plans else None
        return Decision(plan=plan, full=True, priced=0), ranking
    moved: list[Plan] = []
    for plan in last.plans:
        try:
            moved.append(relocate(plan, last.state, state))
        except Infeasible:
            continue  # a stage now spans two derived groups (a straggler split its node)
    best = pick(moved, state) if moved else None
    if best is None:  # none of the ranked plans runs here: search again
        ranking = full(state)
        plan = ranking.plans[0] if ranking and ranking.plans else None
        return Decision(plan=plan, full=True, priced=len(moved)), ranking
    # The ranking stays the full search's (in its own state), so drift over many small
    # changes does not accumulate: every later state is compared with that search's plans.
    return Decision(plan=best, full=False, priced=len(moved)), last
