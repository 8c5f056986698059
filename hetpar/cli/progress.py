"""Progress bars on stderr (tqdm) for long commands; off with --quiet or when not a terminal."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_quiet(p: argparse.ArgumentParser) -> None:
    """The --quiet option every command has."""
    p.add_argument("--quiet", "-q", action="store_true",
                   help="no progress output on stderr (also off when stderr is not a terminal)")


def enabled(args: argparse.Namespace) -> bool:
    """Draw progress: not --quiet, and stderr is a terminal (logs and pipes stay clean)."""
    return not getattr(args, "quiet", False) and sys.stderr.isatty()


def bar(args: argparse.Namespace, total: int | None, desc: str, unit: str = "it") -> Any:
    """A tqdm bar on stderr, disabled (a no-op) when ``enabled(args)`` is false."""
    from tqdm import tqdm  # here, not at the top: `hetpar --help` need not load it

    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, leave=False,
                dynamic_ncols=True, disable=not enabled(args), mininterval=0.2)


def note(args: argparse.Namespace, msg: str) -> None:
    """A one-line status message on stderr, shown only where a bar would be."""
    if enabled(args):
        print(msg, file=sys.stderr, flush=True)
