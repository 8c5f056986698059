"""The three kinds of failure: malformed input, infeasible plan, internal invariant (assert)."""

from __future__ import annotations


class ConfigError(ValueError):
    """The input is malformed: a missing or unknown key, a wrong type, an unknown name.

    The message is one line naming the field, the value and what is allowed.
    """


class RuntimeGap(ConfigError):
    """A valid plan or model that hetpar's runtime does not execute (yet): a capability it
    lacks, not a verdict on the plan (simulate and plan take it).

    A ConfigError, so `hetpar run` refuses it as it refuses malformed input (one line, exit 2,
    before any rank starts); its own type lets a caller tell it from malformed input without
    reading the message.
    """


class Infeasible(Exception):
    """A valid plan that does not fit the model or the cluster (OOM, indivisible heads, ...).

    The search expects these and counts them by ``kind``.
    """

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(f"{kind}: {reason}")
        self.kind = kind
        self.reason = reason
