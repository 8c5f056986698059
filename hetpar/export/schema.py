"""The option-table schema (options, validator rules, versioned tables) and the check of an
export against it; each target module declares its tables (``export/<name>_options.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from hetpar.errors import ConfigError

OptionType = Literal["int", "float", "bool", "str", "flag", "list", "nested"]


@dataclass(frozen=True, kw_only=True)
class Option:
    """One framework option: a command-line flag or a (dotted) configuration key."""

    name: str
    type: OptionType
    """``flag`` = a command-line switch without a value; ``list`` = a list of strings."""
    choices: tuple[str | int, ...] = ()
    """Allowed values (empty = any value of the type)."""
    min: int | None = None
    """Smallest allowed value for ``int`` options."""


@dataclass(frozen=True, kw_only=True)
class Rule:
    """A framework validator rule: when every ``when`` condition holds, ``then`` must hold.

    A condition is ``NAME`` (option given), ``!NAME`` (not given), ``NAME=V``, ``NAME!=V``
    or ``NAME>N``; ``env:VAR`` names an environment variable the launcher sets instead.
    """

    when: tuple[str, ...]
    then: str
    why: str
    """What the framework does otherwise (its own message, or the silent effect)."""


@dataclass(frozen=True, kw_only=True)
class OptionTable:
    """The options hetpar writes for one framework version, and where they come from."""

    framework: str
    sources: tuple[str, ...]
    options: tuple[Option, ...]
    version: str = ""
    """The framework version this table describes (``--framework-version``)."""
    commit: str = ""
    """The framework commit the table and rules were taken from (recorded in every export)."""
    rules: tuple[Rule, ...] = ()

    def get(self, name: str) -> Option | None:
        """The option called ``name``, or None."""
        return next((o for o in self.options if o.name == name), None)


def int_option(name: str, lo: int = 1) -> Option:
    """An integer option with a lower bound."""
    return Option(name=name, type="int", min=lo)


def flag_option(name: str) -> Option:
    """A command-line switch without a value."""
    return Option(name=name, type="flag")


def check(
    table: OptionTable, items: Mapping[str, object], env: Mapping[str, str | None] | None = None
) -> list[str]:
    """Problems with ``items`` (option name -> value; None for a flag) against ``table``: unknown
    names, values out of range, and broken rules given the launch environment ``env``."""
    problems = []
    for name, value in items.items():
        opt = table.get(name)
        if opt is None:
            problems.append(f"{table.framework}: unknown option {name}")
        elif not _fits(opt, value):
            problems.append(
                f"{table.framework}: {name}={value!r} not allowed ({opt.type} {opt.choices})"
            )
    env = env or {}
    for rule in table.rules:
        if all(_holds(c, items, env) for c in rule.when) and not _holds(rule.then, items, env):
            cond = " and ".join(rule.when) or "always"
            problems.append(f"{table.framework} {table.version}: {cond} needs {rule.then}: "
                            f"{rule.why}")
    return problems


def _holds(cond: str, items: Mapping[str, object], env: Mapping[str, str | None]) -> bool:
    """One rule condition (see ``Rule``) against the options and the environment."""
    src: Mapping[str, object] = items
    if cond.startswith("!"):
        return not _holds(cond[1:], items, env)
    if cond.startswith("env:"):
        cond, src = cond[4:], env
    for op in ("!=", "=", ">"):
        if op in cond:
            name, want = cond.split(op, 1)
            value = src.get(name)
            if op == ">":
                return isinstance(value, int) and value > int(want)
            equal = name in src and value is not None and str(value) == want
            return equal if op == "=" else not equal
    return cond in src and (src is items or src.get(cond) is not None)


def _fits(opt: Option, value: object) -> bool:
    if opt.type == "flag":
        return value is None
    if opt.type == "nested":  # a list of lists of strings (module FQNs per model part)
        return isinstance(value, list) and all(
            isinstance(v, list) and all(isinstance(x, str) for x in v) for v in value
        )
    if opt.type == "list":
        return isinstance(value, list) and all(
            isinstance(v, str) and (not opt.choices or v in opt.choices) for v in value
        )
    kinds: dict[str, tuple[type, ...]] = {
        "int": (int,),
        "float": (int, float),
        "bool": (bool,),
        "str": (str,),
    }
    if not isinstance(value, kinds[opt.type]) or (opt.type != "bool" and isinstance(value, bool)):
        return False
    if opt.choices and value not in opt.choices:
        return False
    return not (opt.min is not None and isinstance(value, int) and value < opt.min)


def argv_options(argv: list[str], table: OptionTable) -> dict[str, object]:
    """Command-line ``argv`` as option -> value: ints typed per ``table``, None for flags."""
    out: dict[str, object] = {}
    i = 0
    while i < len(argv):
        name = argv[i]
        if not name.startswith("--"):
            raise ConfigError(f"{table.framework}: expected an option, got {name!r}")
        value: object = None
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            value, i = argv[i + 1], i + 1
            opt = table.get(name)
            if opt is not None and opt.type in ("int", "float"):
                kind = int if opt.type == "int" else float
                try:
                    value = kind(str(value))
                except ValueError:
                    raise ConfigError(
                        f"{table.framework}: {name} expects "
                        f"{'an integer' if kind is int else 'a number'}, got {value!r}"
                    ) from None
        out[name] = value
        i += 1
    return out
