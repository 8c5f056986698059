"""Failure rates per GPU, split into classes with repair-time distributions, loaded from presets."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

import numpy as np

from hetpar.errors import ConfigError
from hetpar.io import from_dict, read_document

PRESETS = Path(__file__).resolve().parent.parent / "catalog" / "failure_rates"
RepairKind = Literal["fixed", "exponential", "lognormal"]


@dataclass(frozen=True, kw_only=True)
class Repair:
    """Time from a failure until the GPU is back in service.

    ``fixed``: always ``mean_hours``; ``exponential``: mean ``mean_hours``; ``lognormal``: mean
    ``mean_hours`` and log-space standard deviation ``sigma`` (so median = mean / e^(sigma^2/2)).
    """

    kind: RepairKind = "fixed"
    mean_hours: float
    sigma: float = 1.0

    def __post_init__(self) -> None:
        if not self.mean_hours > 0 or self.sigma <= 0:
            raise ConfigError(
                f"repair: mean_hours ({self.mean_hours}) and sigma ({self.sigma}) must be > 0"
            )

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """``size`` repair durations in seconds."""
        mean_s = self.mean_hours * 3600.0
        if self.kind == "fixed":
            return np.full(size, mean_s)
        if self.kind == "exponential":
            return rng.exponential(mean_s, size)
        # lognormal with E[X] = exp(mu + sigma^2 / 2) = mean
        mu = math.log(mean_s) - self.sigma**2 / 2
        return rng.lognormal(mu, self.sigma, size)


@dataclass(frozen=True, kw_only=True)
class FailureClass:
    """One class of failures (hardware, software, ...): its share of all events and its repair."""

    name: str
    share: float
    """Fraction of the observed interruptions that belong to this class."""
    repair: Repair
    gpus_per_event: int = 1
    """Blast radius: the aligned block of GPUs one event takes down (e.g. a 4-GPU tray)."""

    def __post_init__(self) -> None:
        if self.gpus_per_event < 1:
            raise ConfigError(
                f"failure class {self.name!r}: gpus_per_event {self.gpus_per_event} not "
                f"allowed; allowed: >= 1"
            )
        if not 0.0 <= self.share <= 1.0:
            raise ConfigError(
                f"failure class {self.name!r}: share {self.share} not allowed; allowed: 0..1"
            )


@dataclass(frozen=True, kw_only=True)
class FailureRates:
    """Observed interruptions (``events`` on ``gpus`` GPUs over ``days`` days) and their classes.

    Every event takes out one GPU (the NTP paper's assumption, Arfeen et al. 2025, Sec. 6.2)
    or its class's ``gpus_per_event`` block; the per-GPU rate of class c is
    events * share_c / (gpus * days).
    """

    name: str
    events: float
    gpus: int
    days: float
    classes: tuple[FailureClass, ...]
    description: str = ""
    sources: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.events < 0 or self.gpus < 1 or not self.days > 0:
            raise ConfigError(
                f"failure rates {self.name!r}: need events >= 0, gpus >= 1, days > 0; got "
                f"{self.events}, {self.gpus}, {self.days}"
            )
        if not self.classes:
            raise ConfigError(f"failure rates {self.name!r}: classes is empty")
        total = sum(c.share for c in self.classes)
        if total > 1.0 + 1e-9:
            raise ConfigError(
                f"failure rates {self.name!r}: class shares sum to {total:.3f}; allowed: <= 1"
            )
        if self.per_gpu_day > 1.0:
            raise ConfigError(
                f"failure rates {self.name!r}: {self.per_gpu_day:.3g} failures per GPU-day; "
                f"allowed: 0..1"
            )

    @property
    def per_gpu_day(self) -> float:
        """Failures per GPU per day, all classes together."""
        return self.events * sum(c.share for c in self.classes) / (self.gpus * self.days)

    def class_rate(self, c: FailureClass) -> float:
        """Failures of class ``c`` per GPU per second."""
        return self.events * c.share / (self.gpus * self.days * 86400.0)

    def mean_failed_fraction(self) -> float:
        """Steady-state fraction of GPUs down: sum over classes of rate x block x mean repair
        (Little's law; overlapping blocks make the true value slightly smaller)."""
        return sum(self.class_rate(c) * c.gpus_per_event * c.repair.mean_hours * 3600.0
                   for c in self.classes)

    def with_blast(self, gpus: int) -> FailureRates:
        """The same rates with every event taking down an aligned block of ``gpus`` GPUs."""
        classes = tuple(replace(c, gpus_per_event=gpus) for c in self.classes)
        return replace(self, name=f"{self.name}-blast{gpus}", classes=classes)

    def scaled(self, factor: float) -> FailureRates:
        """The same classes with every rate multiplied by ``factor``."""
        if factor < 0:
            raise ConfigError(f"failure rates: scale {factor} not allowed; allowed: >= 0")
        return FailureRates(
            name=f"{self.name}x{factor:g}", events=self.events * factor, gpus=self.gpus,
            days=self.days, classes=self.classes, description=self.description,
            sources=self.sources,
        )


def preset_names() -> list[str]:
    """Names of the bundled failure-rate presets."""
    return sorted(p.stem for p in PRESETS.glob("*.toml"))


def load_rates(ref: str) -> FailureRates:
    """A preset by name (``llama3``) or a TOML/JSON file of the same form."""
    p = Path(ref)
    if p.suffix in (".toml", ".json"):
        return from_dict(FailureRates, read_document(p), str(p))
    path = PRESETS / f"{ref}.toml"
    if not path.is_file():
        raise ConfigError(
            f"unknown failure-rate preset {ref!r}; known: {', '.join(preset_names())} "
            f"(or a file path)"
        )
    return from_dict(FailureRates, read_document(path), path.name)
