"""Job description: what to train (batch, sequence length), independent of how."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hetpar.errors import ConfigError
from hetpar.specs.gpu import DEFAULT_PRECISION, Precision, stated
from hetpar.specs.plan import Plan, check_batch

MAX_SEQ_LEN = 1 << 24
"""The longest sequence a job may state (16,777,216 tokens): above the longest published
context of a trained model (Llama 4 Scout's 10M tokens, Meta, "The Llama 4 herd", 2025-04);
a longer one is a typo, which priced gives an iteration of 10^28 s and no error."""


@dataclass(frozen=True, kw_only=True)
class Job:
    """A training job: global batch, sequence length, precision and optimizer."""

    name: str = ""
    global_batch: int
    """Sequences per iteration."""
    seq_len: int | None = None
    """Tokens per sequence; default: the model's."""
    precision: Precision = DEFAULT_PRECISION
    optimizer: Literal["adam", "sgd"] = "adam"
    framework: str = ""
    """The software that will run it (catalog/frameworks: megatron-lm, megatron-core,
    megatron-deepspeed, deepspeed, fsdp, other); blank: the simulator's default profile."""

    def __post_init__(self) -> None:
        if self.global_batch < 1:
            raise ConfigError(f"job: global_batch must be >= 1, got {self.global_batch}")
        check_batch(self.global_batch, "job: global_batch")
        if self.seq_len is not None and not 1 <= self.seq_len <= MAX_SEQ_LEN:
            raise ConfigError(f"job: seq_len {self.seq_len} not allowed; allowed: "
                              f"1..{MAX_SEQ_LEN:,}")


def resolve_precision(plan: Plan, job: Job | None) -> Precision:
    """The precision an iteration runs in: whichever of plan and job states one (the plan's
    when only defaults are present); both stated and different is a ConfigError."""
    if job is None or job.precision == plan.precision:
        return plan.precision
    if stated(plan.precision) and stated(job.precision):
        raise ConfigError(
            f"plan precision {plan.precision!r} conflicts with job precision "
            f"{job.precision!r}; state one of them or make them agree"
        )
    return job.precision if stated(job.precision) else plan.precision
