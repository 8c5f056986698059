"""Throughput versus power of a boosted scale-up domain: a configurable piecewise-linear curve."""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from hetpar.errors import ConfigError

# Arfeen et al. 2025 (arXiv 2504.06095), Sec. 6.5 / Table 1: boosting a TP30 domain to 1.1x
# its power lowers perf/W by 2.8%, to 1.2x by 6.5%; perf = power x perf/W gives the points
# below. Beyond 1.2x the curve continues with its last slope (an extrapolation, not a figure
# of the paper) up to the paper's +30% limit.
PAPER_POWER = (1.0, 1.1, 1.2)
PAPER_PERF = (1.0, 1.1 * (1 - 0.028), 1.2 * (1 - 0.065))


@dataclass(frozen=True, kw_only=True)
class PowerCurve:
    """GPU speed (compute rate multiplier) versus power multiplier, both 1.0 at nominal power."""

    power: tuple[float, ...] = PAPER_POWER
    perf: tuple[float, ...] = PAPER_PERF
    max_power: float = 1.3
    """Highest power multiplier a boosted domain may draw (the paper's rack: +30% of TDP)."""

    def __post_init__(self) -> None:
        if len(self.power) != len(self.perf) or len(self.power) < 2:
            raise ConfigError("power curve: power and perf need the same length, at least 2")
        if self.power[0] != 1.0 or self.perf[0] != 1.0:
            raise ConfigError("power curve: the first point must be (1.0, 1.0)")
        if any(b <= a for a, b in zip(self.power, self.power[1:], strict=False)) or any(
            b < a for a, b in zip(self.perf, self.perf[1:], strict=False)
        ):
            raise ConfigError(
                f"power curve: power must increase and perf must not decrease; got "
                f"{list(self.power)}, {list(self.perf)}"
            )
        if not 1.0 <= self.max_power <= 3.0:
            raise ConfigError(f"power curve: max_power {self.max_power} not allowed; allowed: 1..3")

    def speed(self, power: float) -> float:
        """Compute-rate multiplier at ``power`` x nominal (linear between and beyond points)."""
        p, f = self.power, self.perf
        i = min(max(bisect.bisect_right(p, power), 1), len(p) - 1)
        slope = (f[i] - f[i - 1]) / (p[i] - p[i - 1])
        return f[i - 1] + slope * (power - p[i - 1])

    def power_for(self, speed: float) -> float | None:
        """Least power multiplier reaching ``speed``, or None if above ``max_power``."""
        if speed <= 1.0:
            return 1.0
        lo, hi = 1.0, self.max_power
        if self.speed(hi) < speed:
            return None
        for _ in range(50):  # bisection; speed() is monotone
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if self.speed(mid) < speed else (lo, mid)
        return hi
