"""Job description: what to train (batch, sequence length), independent of how."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hetpar.errors import ConfigError
from hetpar.specs.gpu import Precision


@dataclass(frozen=True, kw_only=True)
class Job:
    """A training job: global batch, sequence length, precision and optimizer."""

    name: str = ""
    global_batch: int
    """Sequences per iteration."""
    seq_len: int | None = None
    """Tokens per sequence; default: the model's."""
    precision: Precision = "bf16"
    optimizer: Literal["adam", "sgd"] = "adam"
    framework: str = ""
    """The software that will run it (catalog/frameworks: megatron-lm, megatron-core,
    megatron-deepspeed, deepspeed, fsdp, other); blank: the simulator's default profile."""

    def __post_init__(self) -> None:
        if self.global_batch < 1:
            raise ConfigError(f"job: global_batch must be >= 1, got {self.global_batch}")
        if self.seq_len is not None and self.seq_len < 1:
            raise ConfigError(f"job: seq_len must be >= 1, got {self.seq_len}")
