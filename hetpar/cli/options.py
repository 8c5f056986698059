"""argparse types that check an option's range before any work starts (one-line errors)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path

from hetpar.errors import ConfigError
from hetpar.io import parse_float, parse_int, probe_writable
from hetpar.workers import Workers, parse_workers


def _num(x: float) -> str:
    return str(x) if isinstance(x, int) else f"{x:g}"


def _show(lo: float, hi: float | None, lo_open: bool, hi_open: bool = False) -> str:
    if hi is None:
        return f"{'>' if lo_open else '>='} {_num(lo)}"
    if lo_open or hi_open:
        return f"{'>' if lo_open else '>='} {_num(lo)} and {'<' if hi_open else '<='} {_num(hi)}"
    return f"{_num(lo)}..{_num(hi)}"


def int_in(lo: int, hi: int | None = None) -> Callable[[str], int]:
    """An integer option in [lo, hi] (hi None: no upper bound)."""

    def parse(text: str) -> int:
        try:  # the one strict parser: ASCII digits, no "1_6", no full-width digits
            v = parse_int(text, "")
        except ConfigError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if v < lo or (hi is not None and v > hi):
            raise argparse.ArgumentTypeError(
                f"{v} not allowed; allowed: {_show(lo, hi, False)}")
        return v

    parse.__name__ = "integer"
    return parse


def float_in(lo: float, hi: float | None = None, *, lo_open: bool = False,
             hi_open: bool = False) -> Callable[[str], float]:
    """A finite number in [lo, hi] (``lo_open``/``hi_open``: that end excluded; hi None: no
    upper bound)."""

    def parse(text: str) -> float:
        try:
            v = parse_float(text, "")
        except ConfigError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number") from None
        bad = not math.isfinite(v) or v < lo or (lo_open and v == lo)
        if bad or (hi is not None and (v > hi or (hi_open and v == hi))):
            raise argparse.ArgumentTypeError(
                f"{text} not allowed; allowed: {_show(lo, hi, lo_open, hi_open)}")
        return v

    parse.__name__ = "number"
    return parse


SEED = int_in(0, 2**32 - 1)
"""Random seeds: numpy and torch take 0 .. 2**32 - 1."""


def _workers(text: str) -> Workers:
    try:
        return parse_workers(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--workers").lstrip(": ")) from None


WORKERS = _workers
"""``--workers N|ray|ray:ADDRESS``, checked when parsed (Ray is started or reached later)."""


WORKERS_HELP = ("worker processes, or 'ray' (a Ray instance started on this machine) / "
                "'ray:ADDRESS' (a running Ray cluster: auto, HOST:PORT, ray://HOST:10001); "
                "Ray needs hetpar[ray]; results are the same whatever the workers")


def check_writable(path: str | Path) -> None:
    """Refuse an output path that cannot be written, before the work that produces it
    (``io.probe_writable``: a probe file created and removed where the output will go)."""
    probe_writable(path)


def check_writable_dir(path: Path, option: str) -> None:
    """Refuse an output directory that cannot be created or written in, before the work."""
    try:
        probe_writable(path, directory=True)
    except ConfigError as e:
        raise ConfigError(f"{option} {e}") from None


def check_output(path: str | None, option: str, suffixes: tuple[str, ...] = ()) -> None:
    """An output option checked before the work whose result it receives (None: not given)."""
    if path is None:
        return
    try:
        check_writable(path)  # the string: a trailing "/" is gone from the Path
    except ConfigError as e:
        raise ConfigError(f"{option} {e}") from None
    p = Path(path)
    if suffixes and p.suffix.lower() not in suffixes:
        raise ConfigError(f"{option} {path}: unknown extension {p.suffix!r}; allowed: "
                          f"{', '.join(suffixes)}")
