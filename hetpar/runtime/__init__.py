"""PyTorch execution of hetpar plans (the only part of hetpar that imports torch, lazily)."""

from __future__ import annotations

from typing import Any

__all__ = ["run"]


def __getattr__(name: str) -> Any:
    # ``from hetpar.runtime import run`` imports torch only when it is asked for.
    if name == "run":
        from hetpar.runtime.api import run

        return run
    raise AttributeError(f"module 'hetpar.runtime' has no attribute {name!r}")
