"""Strict loading of TOML/JSON documents into the frozen dataclasses that form the schema."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import tempfile
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

from hetpar.errors import ConfigError

T = TypeVar("T")


def read_document(path: str | Path) -> dict[str, Any]:
    """Read a TOML or JSON file (chosen by extension) into a dict, or raise ConfigError."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: file not found")
    text = decode_utf8(p.read_bytes(), str(p))
    try:
        if p.suffix == ".json":
            data = json.loads(text)
        elif p.suffix == ".toml":
            data = tomllib.loads(text)
        else:
            raise ConfigError(f"{p}: unknown file type {p.suffix!r}; allowed: .toml, .json")
    except (ValueError, RecursionError) as e:
        # parse errors are ValueErrors, as are integers over Python's 4300-digit limit;
        # absurdly deep nesting overflows the parsers' recursion
        first = (str(e).splitlines() or [type(e).__name__])[0]
        raise ConfigError(f"{p}: cannot parse: {first}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: top level must be a table/object, got {type(data).__name__}")
    return data


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
        raise ConfigError(f"{where}: {_show(value)} is not a name; give a non-empty name of "
                          "printable characters")
    return value


def parse_json(text: str, where: str) -> Any:
    """``json.loads`` with every failure a one-line ConfigError naming ``where``: syntax errors,
    integers beyond Python's 4300-digit limit (ValueError), absurd nesting (RecursionError)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as e:
        first = (str(e).splitlines() or [type(e).__name__])[0] or type(e).__name__
        raise ConfigError(f"{where}: cannot parse JSON: {first}") from None


def from_dict(cls: type[T], data: Any, where: str) -> T:
    """Build dataclass ``cls`` from ``data``; unknown, missing or mistyped keys raise ConfigError.

    ``where`` names the document (and path inside it) for the error message.
    """
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a table, got {_show(data)}")
    file_form = getattr(cls, "from_file_form", None)  # a schema whose file keys differ
    if file_form is not None:
        data = file_form(data)
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(
            f"{where}: unknown key {unknown[0]!r}; allowed: {', '.join(sorted(fields))}"
        )
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        if name in data:
            kwargs[name] = _convert(hints[name], data[name], f"{where}.{name}")
            if name == "name" and isinstance(kwargs[name], str) and (
                    kwargs[name] or f.default != ""):  # "" where it means "unnamed" (plans)
                check_name(kwargs[name], f"{where}.name")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{where}: missing key {name!r}")
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: {e}") from None


def _show(value: Any) -> str:
    try:
        text = repr(value)
    except ValueError:  # an int beyond Python's int-to-str digit limit
        return f"<{type(value).__name__} too large to show>"
    return text if len(text) <= 60 else text[:57] + "..."


def _convert(tp: Any, value: Any, where: str) -> Any:
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin is Literal:
        allowed = get_args(tp)
        if value not in allowed or type(value) is not type(allowed[0]):
            raise ConfigError(
                f"{where}: {_show(value)} is not allowed; allowed: {', '.join(map(str, allowed))}"
            )
        return value
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _convert(a, value, where)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"{where}: {_show(value)} is not allowed")
    if origin is tuple:
        args = get_args(tp)
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{where}: expected a list, got {_show(value)}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(args[0], v, f"{where}[{i}]") for i, v in enumerate(value))
        if len(args) != len(value):
            raise ConfigError(f"{where}: expected {len(args)} items, got {len(value)}")
        pairs = enumerate(zip(args, value, strict=True))
        return tuple(_convert(a, v, f"{where}[{i}]") for i, (a, v) in pairs)
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a table, got {_show(value)}")
        kt, vt = get_args(tp) or (str, Any)
        return {str(k): _convert(vt, v, f"{where}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return from_dict(tp, value, where)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {_show(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {_show(value)}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where}: expected a number, got {_show(value)}")
        if value != value or value in (float("inf"), float("-inf")):
            raise ConfigError(f"{where}: expected a finite number, got {_show(value)}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {_show(value)}")
        return value
    raise AssertionError(f"unsupported schema type {tp!r} at {where}")


def to_dict(obj: Any) -> Any:
    """Turn a schema dataclass into plain dicts/lists (the file form), dropping None values."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = {}
        for f in dataclasses.fields(obj):
            if not f.init:
                continue
            v = getattr(obj, f.name)
            if v is None:
                continue
            out[f.name] = to_dict(v)
        file_form = getattr(obj, "to_file_form", None)  # from_dict's from_file_form reversed
        return file_form(out) if file_form is not None else out
    if isinstance(obj, tuple | list):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def dump_toml(data: dict[str, Any]) -> str:
    """Write a dict (as produced by ``to_dict``) as TOML; tables and arrays of tables supported."""
    lines: list[str] = []
    _toml_table(data, [], lines)
    return "\n".join(lines).strip() + "\n"


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_key(k)} = {_toml_value(x)}" for k, x in v.items()) + "}"
    raise AssertionError(f"cannot write {type(v).__name__} to TOML")


def _key(k: str) -> str:
    return k if k.replace("_", "").replace("-", "").isalnum() else json.dumps(k)


def _is_table_list(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, dict) for x in v)


def _toml_table(data: dict[str, Any], path: list[str], lines: list[str]) -> None:
    for k, v in data.items():
        if not isinstance(v, dict) and not _is_table_list(v):
            lines.append(f"{_key(k)} = {_toml_value(v)}")
    for k, v in data.items():
        sub = [*path, _key(k)]
        if isinstance(v, dict):
            lines.append("")
            lines.append(f"[{'.'.join(sub)}]")
            _toml_table(v, sub, lines)
        elif _is_table_list(v):
            for item in v:
                lines.append("")
                lines.append(f"[[{'.'.join(sub)}]]")
                _toml_table(item, sub, lines)


def file_mode(executable: bool = False) -> int:
    """The mode a plainly created file gets (0644 / 0755 under the usual umask 022).

    ``tempfile.mkstemp`` creates 0600 files; renamed into place they would stay private."""
    return (0o777 if executable else 0o666) & ~_umask()


def _umask() -> int:
    try:  # Linux shows it without changing it (os.umask would, briefly, for every thread)
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


def check_file_path(path: str | Path) -> Path:
    """ConfigError unless ``path`` can become a regular file; returns its nearest existing folder.

    A name ending in a separator (``out/``) says "a directory" even where none exists yet:
    refused, never written as a file named ``out`` (one rule for every single-file output)."""
    if isinstance(path, str) and path.endswith(("/", os.sep)):
        raise ConfigError(f"{path}: ends in {path[-1]!r}, which names a directory; "
                          "give a file name")
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"{p}: is a directory; give a file name")
    if p.exists() and not p.is_file():
        # a device or pipe: os.replace would swap the node itself for a regular file
        raise ConfigError(f"{p}: is not a regular file (a device, pipe or socket); "
                          "give a file name")
    above = next((a for a in p.absolute().parents if a.exists()), Path("/"))
    if not above.is_dir():
        raise ConfigError(f"{p}: {above} is not a directory")
    return above


def probe_writable(path: str | Path, *, directory: bool = False) -> None:
    """ConfigError unless ``path`` (a file, or with ``directory`` a folder) can be written:
    the folders it needs are created, a probe file is created in the folder that will hold the
    output, then all of it is removed again. Called before any long work, so that a path under
    /proc, a read-only mount or a full disk is refused up front; a permission test
    (``os.access``) says yes to root everywhere and knows nothing of mounts."""
    p = Path(path)
    if not directory:
        check_file_path(path)
    folder = p if directory else p.parent
    if directory and p.exists() and not p.is_dir():
        raise ConfigError(f"{path}: is a file, expected a directory")
    above = next((a for a in (folder, *folder.parents) if a.exists()), Path("/"))
    if not above.is_dir():
        raise ConfigError(f"{path}: {above} is not a directory")
    made: list[Path] = []
    try:
        for d in reversed([folder, *folder.parents]):
            if not d.exists():
                d.mkdir()
                made.append(d)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".hetpar-probe.")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        why = e.strerror or type(e).__name__
        raise ConfigError(f"{path}: cannot write there ({why})") from None
    finally:
        for d in reversed(made):
            try:
                d.rmdir()
            except OSError:
                pass


def make_parent(path: str | Path) -> Path:
    """Create ``path``'s folder; ConfigError if ``path`` is a folder or a file is in the way."""
    p = Path(path)
    check_file_path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    return p


def write_text_atomic(path: str | Path, text: str, *, executable: bool = False) -> None:
    """Write ``text`` to ``path`` via a temporary file in the same folder, renamed into place,
    so a reader (or a failed run) never leaves a half-written file."""
    p = make_parent(path)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, file_mode(executable))
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def literal_values(tp: Any) -> tuple[Any, ...]:
    """The allowed values of a ``Literal`` type (for help texts and errors)."""
    return typing.get_args(tp)
