"""The three kinds of failure: malformed input, infeasible plan, internal invariant (assert)."""

from __future__ import annotations


class ConfigError(ValueError):
    """The input is malformed: a missing or unknown key, a wrong type, an unknown name.

    The message is one line naming the field, the value and what is allowed.
    """


class Infeasible(Exception):
    """A valid plan that does not fit the model or the cluster (OOM, indivisible heads, ...).

    The search expects these and counts them by ``kind``.
    """

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(f"{kind}: {reason}")
        self.kind = kind
        self.reason = reason
