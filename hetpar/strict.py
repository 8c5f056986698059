"""The one strict reading of text: numbers (ASCII digits, no underscores, finite), names, UTF-8."""

from __future__ import annotations

import math
import re
from typing import Any

from hetpar.errors import ConfigError


def decode_utf8(raw: bytes, where: str) -> str:
    """``raw`` as UTF-8 text; an invalid byte is a ConfigError naming ``where`` and its offset
    (never a U+FFFD slipped into a name)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{where}: not UTF-8 text: byte {raw[e.start]:#04x} at offset "
                          f"{e.start} ({e.reason})") from None


# ASCII digits only (Python's int() and float() also take other scripts' digits, "\uff12",
# and underscores, "1_6"); the optional exponent as JSON and TOML write it.
_INT = re.compile(r"[+-]?[0-9]+", re.ASCII)
_FLOAT = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)


def is_number(text: str) -> bool:
    """Whether ``text`` is a number as the strict parsers read it (ASCII digits, no
    underscores; nan and inf are not numbers), before any range check."""
    return bool(_FLOAT.fullmatch(text.strip(" ")))


def parse_int(text: str, where: str, lo: int | None = None, hi: int | None = None) -> int:
    """The one strict integer parser of hetpar's text inputs (CLI options, inline plans and
    clusters): ASCII digits with an optional sign, no underscores, in [lo, hi]."""
    t = text.strip(" ")
    if not _INT.fullmatch(t) or len(t) > 1000:
        raise ConfigError(f"{where}: {text!r} is not an integer")
    return _in_range(int(t), text, where, lo, hi)


def parse_float(text: str, where: str, lo: float | None = None,
                hi: float | None = None) -> float:
    """The one strict number parser: ASCII digits, an optional point and exponent, no
    underscores, finite (no nan, inf), in [lo, hi]."""
    t = text.strip(" ")
    if not _FLOAT.fullmatch(t):
        raise ConfigError(f"{where}: {text!r} is not a number")
    v = float(t)
    if not math.isfinite(v):
        raise ConfigError(f"{where}: {text!r} not allowed; allowed: finite numbers")
    return _in_range(v, text, where, lo, hi)


def _in_range(v: Any, text: str, where: str, lo: float | None, hi: float | None) -> Any:
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        span = f"{lo}..{hi}" if lo is not None and hi is not None else (
            f">= {lo}" if lo is not None else f"<= {hi}")
        raise ConfigError(f"{where}: {text.strip()} not allowed; allowed: {span}")
    return v


def check_name(value: str, where: str) -> str:
    """A name (of a model, GPU, cluster, group...): non-empty and printable, so that errors,
    reports and file names can show it."""
    if not value.strip() or not value.isprintable():
        shown = repr(value) if len(value) <= 60 else repr(value[:57]) + "..."
        raise ConfigError(f"{where}: {shown} is not a name; give a non-empty name of "
                          "printable characters")
    return value
