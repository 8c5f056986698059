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

import math
from dataclasses import dataclass, field
from typing import Literal

from hetpar.dynamic.trace import TraceEvent

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


def value_key(ev: TraceEvent) -> str:
    """Which "value" of its source an event sets, for dwell statistics per value: the kind
    for up/down and membership, else the value rounded to a factor of two."""
    if ev.value is None or ev.kind in ("leave", "join"):
        return ev.kind
    return f"{ev.kind}:{round(math.log2(ev.value)) if ev.value > 0 else 0}"


@dataclass
class DwellHistory:
    """How long each source (an event target) held each of its values."""

    last: dict[str, tuple[float, str]] = field(default_factory=dict)
    dwells: dict[tuple[str, str], list[float]] = field(default_factory=dict)

    def record(self, ev: TraceEvent) -> None:
        """Event ``ev`` ends its source's previous value and starts a new one."""
        prev = self.last.get(ev.target)
        if prev is not None and ev.t_s > prev[0]:
            self.dwells.setdefault((ev.target, prev[1]), []).append(ev.t_s - prev[0])
        self.last[ev.target] = (ev.t_s, value_key(ev))

    def expected_dwell(self, events: tuple[TraceEvent, ...], prior_s: float) -> float:
        """Expected time the values just set will hold (the shortest over the events).

        The geometric mean of the past dwells of the same source at the same value (or at
        any value, if this one was never seen), shrunk towards the prior as if the prior were
        one more observation. Geometric, because durations are heavy-tailed: a few short
        dwells quickly pull a 1-hour prior down, one long dwell does not dominate.
        """
        out = []
        for ev in events:
            same = self.dwells.get((ev.target, value_key(ev)))
            seen = same or [d for (src, _), ds in self.dwells.items() if src == ev.target
                            for d in ds]
            logs = [math.log(max(d, 1e-3)) for d in seen] + [math.log(prior_s)]
            out.append(math.exp(sum(logs) / len(logs)))
        return min(out) if out else prior_s


def remaining_s(expected_dwell: float, age: float) -> float:
    """Expected remaining duration of a condition ``age`` seconds old: what is left of its
    expected dwell, or, once past half of it, as long again as it has lasted (Lindy)."""
    return expected_dwell - age if age < expected_dwell / 2 else max(expected_dwell / 2, age)


def switch_price(cfg: AdaptiveConfig, cost_s: float, current: float, back: float) -> float:
    """Tokens a switch must win back: ``cost_s`` seconds at the current rate, plus (if the
    condition is expected to end) the switch back at ``back``, the rate it returns to."""
    return (1 + cfg.hysteresis) * cost_s * (current + back)


def worth_switching(gain: float, cost_s: float, remaining: float, price: float) -> bool:
    """Whether ``gain`` tokens/s for the ``remaining`` seconds after a ``cost_s`` switch beats
    ``price`` (staying trains ``current * remaining``, switching ``(current + gain) *
    (remaining - cost_s)``)."""
    return remaining > cost_s and gain * (remaining - cost_s) > price
