"""Strict loading of TOML/JSON documents into the frozen dataclasses that form the schema."""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

from hetpar.errors import ConfigError
from hetpar.outputs import check_file_path as check_file_path  # re-exported, as below
from hetpar.outputs import probe_writable as probe_writable
from hetpar.strict import check_name as check_name  # re-exported: io is where loaders look
from hetpar.strict import decode_utf8 as decode_utf8
from hetpar.strict import is_number as is_number
from hetpar.strict import parse_float as parse_float  # re-exported: io is where loaders look
from hetpar.strict import parse_int as parse_int

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
