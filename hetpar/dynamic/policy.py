"""When to re-plan: the static, oracle and adaptive policies, as decisions over cluster states.

Adaptive is a rent-or-buy rule (the ski-rental problem; Karlin, Manasse, Rudolph and
Sleator, Algorithmica 1988): switching "buys" the better plan for its cost, staying
"rents" it by losing the throughput gap every second. It switches at once when the gap
times the expected remaining duration of the new conditions pays for the switch with a
margin (hysteresis); otherwise it waits, and switches when the conditions have lasted as
long as the break-even time (the deterministic 2-competitive rule), since a condition
that has lasted a time t is expected to last about t more (Lindy). Expected durations
come from how long the same source (link, tier, group) held its previous values, or a
prior when it never changed before. A change must also hold ``settle_s`` before any
voluntary switch, so a link flapping every few seconds never makes the plan follow it; if
the flapping goes on, the policy may switch once to the plan best on the mix of the states
it alternates between, when the episode's age (expected to last as long again) pays for
that switch and for switching back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

PolicyName = Literal["static", "adaptive", "oracle"]
POLICIES: tuple[PolicyName, ...] = ("static", "adaptive", "oracle")


@dataclass(frozen=True, kw_only=True)
class AdaptiveConfig:
    """Knobs of the adaptive policy (defaults are used by the CLI and the benchmark)."""

    settle_s: float = 30.0
    """A change must hold this long before a voluntary switch (debounce)."""
    hysteresis: float = 0.5
    """Expected gain must exceed (1 + hysteresis) x the tokens a switch costs."""
    min_gain: float = 0.02
    """Relative throughput gains below this are not worth a look."""
    prior_dwell_s: float = 3600.0
    """Expected duration of a condition whose source never changed before."""
    flap_window_s: float = 300.0
    flap_changes: int = 6
    """At least this many changes within ``flap_window_s``: the cluster is flapping, and the
    plan to consider is the one best on the mix of recent states (hetpar.dynamic.flapping)."""


@dataclass
class DwellHistory:
    """When each source (an event target) changed, to estimate how long its values hold."""

    changes: dict[str, list[float]] = field(default_factory=dict)

    def record(self, source: str, t_s: float) -> None:
        """Source ``source`` changed at ``t_s``."""
        self.changes.setdefault(source, []).append(t_s)

    def expected_dwell(self, sources: list[str], prior_s: float) -> float:
        """Expected time a value of the given sources holds (the shortest of them).

        The mean of the source's completed dwells, shrunk towards the prior as if the prior
        were one more observation: a source seen changing once has only the prior, one with
        a single short dwell is not yet assumed to be always short.
        """
        out = []
        for s in sources:
            ts = self.changes.get(s, [])
            gaps = [b - a for a, b in zip(ts, ts[1:], strict=False)]
            out.append((sum(gaps) + prior_s) / (len(gaps) + 1))
        return min(out) if out else prior_s


def worth_switching(gain: float, current: float, cost_s: float, remaining_s: float,
                    cfg: AdaptiveConfig) -> bool:
    """Whether ``gain`` tokens/s over ``remaining_s`` pays for ``cost_s`` seconds of no training.

    Staying trains ``current * remaining``; switching trains ``(current + gain) *
    (remaining - cost)``. Switch when the difference beats the lost tokens by the margin.
    """
    if remaining_s <= cost_s:
        return False
    return gain * (remaining_s - cost_s) > (1 + cfg.hysteresis) * current * cost_s


def break_even_age(gain: float, current: float, cost_s: float, cfg: AdaptiveConfig) -> float:
    """Age at which a condition, expected to last as long again, makes the switch pay."""
    if gain <= 0:
        return float("inf")
    return cost_s + (1 + cfg.hysteresis) * current * cost_s / gain
