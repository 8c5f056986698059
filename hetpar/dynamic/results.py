"""What a replay produces: the switches, the throughput segments and the totals."""

from __future__ import annotations

from dataclasses import dataclass

from hetpar.dynamic.switching import SwitchCost


@dataclass(frozen=True, kw_only=True)
class Switch:
    """One re-plan: when, from which plan to which, why, and what it cost."""

    t_s: float
    from_plan: str
    to_plan: str
    reason: str
    forced: bool
    cost: SwitchCost | None
    """None for the oracle (switches are free)."""
    tokens_per_s_before: float
    tokens_per_s_after: float

    def to_dict(self) -> dict[str, object]:
        """Plain form for JSON output."""
        d = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "cost"}
        d["cost"] = self.cost.to_dict() if self.cost else None
        return d


@dataclass(frozen=True, kw_only=True)
class Segment:
    """[t_s, end_s) under one plan at one throughput; ``training_s`` excludes switching."""

    t_s: float
    end_s: float
    plan: str
    tokens_per_s: float
    training_s: float


@dataclass(frozen=True, kw_only=True)
class ReplayResult:
    """Tokens trained over the horizon, the throughput timeline and every switch."""

    policy: str
    trace: str
    horizon_s: float
    tokens: float
    segments: tuple[Segment, ...]
    switches: tuple[Switch, ...]
    decision_s: tuple[float, ...]
    """Wall time of each re-planning decision (planner + costs), seconds."""

    def to_dict(self) -> dict[str, object]:
        """Plain form for JSON output."""
        return {
            "policy": self.policy, "trace": self.trace, "horizon_s": self.horizon_s,
            "tokens": self.tokens, "mean_tokens_per_s": self.tokens / self.horizon_s,
            "switches": [s.to_dict() for s in self.switches],
            "segments": [vars(s) for s in self.segments],
            "decision_s": list(self.decision_s),
        }
