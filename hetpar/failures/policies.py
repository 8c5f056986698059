"""Policies for a cluster with failed GPUs, each a planner of the degraded job; their throughput.

The job has R replicas of k failure units (TP groups of n GPUs inside a scale-up domain) and
a pool of units that may be larger than R k (hot spares). A failure pattern is the number of
failed GPUs in every pool unit; the plan's units come first, replica-major. Throughput is
tokens per second as a fraction of the fault-free plan's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from hetpar.errors import ConfigError, Infeasible
from hetpar.failures.cost import ReplicaCost
from hetpar.failures.layout import Layout
from hetpar.failures.power import PowerCurve

POLICIES = ("drop", "drop-packed", "spare", "checkpoint", "ntp", "ntp-boost")
PACKED = ("drop-packed", "checkpoint", "ntp", "ntp-boost")
"""Policies whose result depends only on how many units have how many failures."""


def default_degrees(n: int) -> tuple[int, ...]:
    """Reduced TP degrees NTP may use: steps of 2 down to 7/8 of n (TP32 -> 30, 28 as in
    Arfeen et al. 2025, Sec. 6.2), at least one step; steps of 1 for odd n."""
    step = 2 if n % 2 == 0 else 1
    lowest = min(math.ceil(0.875 * n), n - step)
    return tuple(range(n - step, max(lowest, 1) - 1, -step))


@dataclass(frozen=True, kw_only=True)
class PolicyConfig:
    """Knobs of the NTP policies."""

    degrees: tuple[int, ...] = ()
    """Reduced TP degrees allowed (below the plan's); empty = ``default_degrees``."""
    curve: PowerCurve = field(default_factory=PowerCurve)
    boost_fraction: float = 1.0
    """Most units that may be power-boosted at once, as a fraction of the plan's units."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.boost_fraction <= 1.0:
            raise ConfigError(
                f"boost_fraction {self.boost_fraction} not allowed; allowed: 0..1"
            )


@dataclass(frozen=True, slots=True)
class Outcome:
    """Throughput and global batch as fractions of the fault-free plan's; boosted units."""

    throughput: float
    batch: float
    boosted: int = 0
    power: float = 0.0
    """Extra power drawn by boosted units, in GPU-nominal-powers."""


class Evaluator:
    """Throughput of every policy for a failure pattern, asking a ``ReplicaCost`` for times."""

    def __init__(self, lay: Layout, cost: ReplicaCost, config: PolicyConfig | None = None):
        self.lay, self.cost = lay, cost
        self.config = config or PolicyConfig()
        n, b0 = lay.tp, lay.batch_per_replica
        degrees = self.config.degrees or default_degrees(n)
        bad = [t for t in degrees if not 1 <= t < n]
        if bad:
            raise ConfigError(f"ntp degree {bad[0]} not allowed; allowed: 1..{n - 1}")
        self.degrees = tuple(sorted(degrees, reverse=True))
        self.pace = cost.replica_time(n, b0)
        if not math.isfinite(self.pace):
            raise Infeasible("plan", f"a healthy replica (tp {n}, batch {b0}) cannot run")
        self.t0 = self.pace + cost.sync_time(frozenset({n}), lay.replicas)
        self.degree_of = np.zeros(n + 1, dtype=np.int64)  # failed GPUs in a unit -> TP degree
        self.degree_of[0] = n
        for f in range(1, n + 1):
            self.degree_of[f] = next((t for t in self.degrees if t <= n - f), 0)
        self.bmax = {n: b0, 0: 0} | {t: self._max_batch(t) for t in self.degrees}
        self.boost = {t: self._boost_power(t) for t in self.degrees}
        self._cap_lut = np.array([self.bmax.get(t, 0) for t in range(n + 1)], dtype=np.int64)
        # extra power of a boosted unit by degree (0: not boostable)
        self._power_lut = np.array([(p - 1.0 if (p := self.boost.get(t)) is not None else 0.0)
                                    for t in range(n + 1)])
        self._cache: dict[tuple[str, tuple[int, ...]], Outcome] = {}

    def _max_batch(self, t: int) -> int:
        """Largest batch share (micro-batch multiple) at TP t that keeps pace (Sec. 4.1)."""
        mb = self.lay.micro_batch
        b = self.lay.batch_per_replica
        while b > 0 and self.cost.replica_time(t, b) > self.pace * (1 + 1e-9):
            b -= mb
        return b

    def _boost_power(self, t: int) -> float | None:
        """Power multiplier at which TP t keeps pace with the full share, or None."""
        b0, curve = self.lay.batch_per_replica, self.config.curve
        top = curve.speed(curve.max_power)
        if self.cost.replica_time(t, b0, top) > self.pace * (1 + 1e-9):
            return None
        lo, hi = 1.0, top
        for _ in range(40):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if self.cost.replica_time(t, b0, mid) > self.pace else (lo, mid)
        return curve.power_for(hi)

    # ------------------------------------------------------------------ public
    def evaluate(self, policy: str, counts: np.ndarray) -> Outcome:
        """Outcome of ``policy`` for failed-GPU ``counts`` per pool unit (plan units first)."""
        if policy in PACKED:
            hist = np.bincount(np.minimum(counts, self.lay.tp), minlength=self.lay.tp + 1)
            key = (policy, tuple(int(x) for x in hist))
            out = self._cache.get(key)
            if out is None:
                out = self._cache[key] = self._packed(policy, hist)
            return out
        if policy == "drop":
            return self._replicas(self._unhit_replicas(counts, spares=0))
        if policy == "spare":
            spares = int(np.count_nonzero(counts[self.lay.units:] == 0))
            return self._replicas(self._unhit_replicas(counts, spares))
        raise ConfigError(f"unknown policy {policy!r}; allowed: {', '.join(POLICIES)}")

    def _unhit_replicas(self, counts: np.ndarray, spares: int) -> int:
        lay = self.lay
        per = np.count_nonzero(counts[: lay.units].reshape(lay.replicas, lay.units_per_replica),
                               axis=1)
        hit = np.sort(per[per > 0])
        fixed = int(np.searchsorted(np.cumsum(hit), spares, side="right"))
        return lay.replicas - len(hit) + fixed

    def _replicas(self, run: int) -> Outcome:
        """``run`` full-speed replicas out of R."""
        if run <= 0:
            return Outcome(0.0, 0.0)
        lay = self.lay
        run = min(run, lay.replicas)
        t = self.pace + self.cost.sync_time(frozenset({lay.tp}), run)
        return Outcome(run / lay.replicas * self.t0 / t, run / lay.replicas)

    def _packed(self, policy: str, hist: np.ndarray) -> Outcome:
        lay = self.lay
        if policy == "checkpoint":
            ok = hist[0] >= lay.units
            return Outcome(float(ok), float(ok))
        if policy == "drop-packed":
            return self._replicas(int(hist[0]) // lay.units_per_replica)
        return self._ntp(hist, boost=policy == "ntp-boost")

    def _ntp(self, hist: np.ndarray, boost: bool) -> Outcome:
        deg = np.repeat(self.degree_of, hist)  # one entry per pool unit
        cap, power = self._caps(deg, boost)
        return self._outcome(deg, cap, power)

    def _caps(self, deg: np.ndarray, boost: bool) -> tuple[np.ndarray, np.ndarray]:
        """Batch share each unit can keep pace with, and the extra power of boosted units.

        Boosting goes to the least degraded units first (cheapest), at most
        ``boost_fraction`` of the plan's units (Arfeen et al. 2025, Sec. 4.3).
        """
        cap = self._cap_lut[deg]
        power = np.zeros(len(deg))
        if boost:
            budget = int(self.config.boost_fraction * self.lay.units)
            order = np.argsort(-deg, kind="stable")
            chosen = order[np.flatnonzero(self._power_lut[deg[order]] > 0)[:budget]]
            cap[chosen] = self.lay.batch_per_replica
            power[chosen] = self._power_lut[deg[chosen]]
        return cap, power

    def pack(self, deg: np.ndarray, cap: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Units packed into replicas, worst together (Sec. 4.4), and each replica's batch.

        Returns the unit indices of the replicas used (rows, best first) and their batch
        shares: the fewest replicas that carry the global batch, the last one trimmed.
        """
        lay, k = self.lay, self.lay.units_per_replica
        order = np.lexsort((-deg, -cap))
        m = len(order) // k
        order = order[: m * k].reshape(m, k)
        rep_cap = cap[order].min(axis=1)
        need = lay.replicas * lay.batch_per_replica
        used = int(np.searchsorted(np.cumsum(rep_cap), need)) + 1
        used = min(used, int(np.count_nonzero(rep_cap > 0)))
        shares = rep_cap[:used].copy()
        if used and shares.sum() > need:
            shares[-1] -= shares.sum() - need
        return order[:used], shares

    def _outcome(self, deg: np.ndarray, cap: np.ndarray, power: np.ndarray) -> Outcome:
        order, shares = self.pack(deg, cap)
        if len(order) == 0:
            return Outcome(0.0, 0.0)
        need = self.lay.replicas * self.lay.batch_per_replica
        batch = int(shares.sum())
        rep_deg = deg[order].min(axis=1)
        t = self.pace + self.cost.sync_time(frozenset(np.unique(rep_deg).tolist()), len(order))
        boosted = power[order]
        return Outcome(batch / need * self.t0 / t, batch / need, int(np.count_nonzero(boosted)),
                       float((boosted * deg[order]).sum()))

    def assignment(self, policy: str, counts: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """For a packing policy: (unit rows of the replicas used, their batch shares, the TP
        degree of every pool unit, whether each unit is boosted)."""
        deg = self.degree_of[np.minimum(counts, self.lay.tp)]
        if policy in ("ntp", "ntp-boost"):
            cap, power = self._caps(deg, policy == "ntp-boost")
        elif policy == "drop-packed":
            deg = np.where(counts == 0, self.lay.tp, 0)
            cap, power = np.where(counts == 0, self.lay.batch_per_replica, 0), np.zeros(len(deg))
        else:
            raise ConfigError(
                f"policy {policy!r} writes no plan; allowed: drop-packed, ntp, ntp-boost"
            )
        order, shares = self.pack(deg, cap)
        return order, shares, deg, power > 0
