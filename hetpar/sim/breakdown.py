"""The time breakdown's keys as one registry: what each term is and how it scales.

``Report.breakdown`` has one entry per ``terms()`` key, in this order; every consumer iterates
this list instead of keeping its own: the report's ``bottleneck``, ``hetpar simulate``'s table,
the failure studies' rescaling of a replica's time (``failures/simcost.py``), the planner's
explanation and uncertainty split (``search/explain.py``, ``search/robust.py``) and the HTML
report (``cli/report.py`` passes ``payload()`` to ``report.js``). A plan-scope axis with a
registered cost (``sim.axis_costs``) adds its key; ``register`` adds any other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hetpar.errors import ConfigError
from hetpar.sim import axis_costs

Per = Literal["micro_batch", "iteration"]
Scales = Literal["compute", "share", "tp_ring", "fixed", "busy", "sync"]
Kind = Literal["compute", "network", "other"]


@dataclass(frozen=True, kw_only=True)
class Term:
    """One key of the time breakdown."""

    key: str
    word: str
    """``Report.bottleneck`` when this term is the largest."""
    per: Per
    """When it is paid: per micro-batch (on the pipeline's critical path, so the bubble
    follows it) or once per iteration."""
    scales: Scales
    """How it changes when a replica's tp shrinks from n to t survivors holding n / t of the
    shards (NTP, Arfeen et al. 2025, Sec. 4.2; ``failures/simcost.py``): ``compute`` with the
    share n / t and 1 / GPU speed, ``share`` with n / t, ``tp_ring`` with the ring factor
    (t-1)/t over (n-1)/n, ``fixed`` not at all, ``busy`` with the per-micro-batch busy time
    (the bubble), ``sync`` not part of a replica's time (the data-parallel sync)."""
    kind: Kind
    """What its uncertainty follows (``search/robust.py``): the compute efficiency, the
    network bandwidth, or neither."""
    limit: str
    """What bounds a plan this term dominates (``search/explain.py``)."""
    color: str = ""
    """Its colour in the HTML report (empty: the report's palette)."""


BUILTIN: tuple[Term, ...] = (
    Term(key="compute", word="compute", per="micro_batch", scales="compute", kind="compute",
         limit="compute (the GPUs' matmul throughput)", color="#4c78a8"),
    Term(key="recompute", word="recompute", per="micro_batch", scales="compute",
         kind="compute", limit="activation recomputation", color="#72b7b2"),
    Term(key="tp_comm", word="tp-link", per="micro_batch", scales="tp_ring", kind="network",
         limit="the tensor-parallel link (scale-up domain)", color="#e45756"),
    Term(key="cp_comm", word="cp-link", per="micro_batch", scales="fixed", kind="network",
         limit="the context-parallel link", color="#ff9da6"),
    Term(key="pp_comm", word="pp-link", per="micro_batch", scales="share", kind="network",
         limit="pipeline transfers between stages", color="#b279a2"),
    Term(key="dp_comm", word="dp-link", per="iteration", scales="sync", kind="network",
         limit="the data-parallel gradient sync (scale-out network)", color="#9d755d"),
    Term(key="bubble", word="pp-bubble", per="iteration", scales="busy", kind="compute",
         limit="the pipeline bubble", color="#bab0ac"),
    Term(key="optimizer", word="optimizer", per="iteration", scales="share", kind="other",
         limit="the optimizer step (memory bandwidth)", color="#eeca3b"),
    Term(key="overhead", word="overhead", per="iteration", scales="fixed", kind="other",
         limit="fixed per-iteration overhead", color="#79706e"),
)
"""The simulator's own terms, in breakdown order."""

_EXTRA: dict[str, Term] = {}


def register(term: Term) -> Term:
    """Add a breakdown key (a term a plug-in's cost writes into ``Report.breakdown``)."""
    if term.key in {t.key for t in terms()}:
        raise ConfigError(f"breakdown key {term.key!r} is already registered")
    _EXTRA[term.key] = term
    return term


def unregister(key: str) -> None:
    """Remove a registered breakdown key (tests)."""
    _EXTRA.pop(key, None)


def _axis_term(key: str, word: str) -> Term:
    # a plan-scope axis's collectives run per layer per micro-batch on the critical path
    # (AxisCost) and move activation bytes of the GPU's share: they follow the share
    return Term(key=key, word=word, per="micro_batch", scales="share", kind="network",
                limit=f"the {word} collectives")


def terms() -> tuple[Term, ...]:
    """Every breakdown key: the built-in ones, every costed axis's, then registered ones."""
    axis = tuple(_axis_term(k, w) for k, w in axis_costs.cost_keys())
    return BUILTIN + axis + tuple(_EXTRA.values())


def keys() -> tuple[str, ...]:
    """The breakdown's keys, in order."""
    return tuple(t.key for t in terms())


def payload() -> list[dict[str, str]]:
    """The keys as the HTML report receives them: key, colour, what bounds a plan."""
    return [{"key": t.key, "color": t.color, "limit": t.limit} for t in terms()]
