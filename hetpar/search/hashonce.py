"""A frozen dataclass's hash computed once: the planner's structures key its caches."""

from __future__ import annotations

from dataclasses import fields
from typing import Any


class HashOnce:
    """Mixin for a frozen dataclass hashed millions of times as part of cache keys (a
    ``Structure``, its ``ReplicaClass``es): the hash the dataclass would generate, the hash
    of its fields' tuple, kept after the first call. A class assigns ``__hash__ =
    HashOnce.__hash__`` in its body (``dataclass`` replaces an inherited one). The kept value
    is not pickled: another process hashes strings with another seed."""

    def __hash__(self) -> int:
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash(tuple(getattr(self, f.name) for f in fields(self)))  # type: ignore[arg-type]
            object.__setattr__(self, "_hash", h)
        return int(h)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_hash", None)
        return state
