"""The option tables of the registered export targets per framework version, read from the
target registry (each target module declares its own tables)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from hetpar.export.schema import Option, OptionTable, Rule, argv_options, check
from hetpar.export.target import get, names

__all__ = ["TABLES", "VERSIONS", "Option", "OptionTable", "Rule", "argv_options", "check",
           "table"]


class _Versions(Mapping[str, dict[str, OptionTable]]):
    """target -> {version -> option table}, of the targets registered now."""

    def __getitem__(self, target: str) -> dict[str, OptionTable]:
        if target not in names():
            raise KeyError(target)
        return get(target).versions

    def __iter__(self) -> Iterator[str]:
        return iter(names())

    def __len__(self) -> int:
        return len(names())


class _Newest(Mapping[str, OptionTable]):
    """target -> its newest option table (the default of ``--framework-version``)."""

    def __getitem__(self, target: str) -> OptionTable:
        if target not in names():
            raise KeyError(target)
        return get(target).table()

    def __iter__(self) -> Iterator[str]:
        return iter(names())

    def __len__(self) -> int:
        return len(names())


VERSIONS: Mapping[str, dict[str, OptionTable]] = _Versions()
TABLES: Mapping[str, OptionTable] = _Newest()
"""The newest supported version of each target (the default of ``--framework-version``)."""


def table(target: str, version: str | None = None) -> OptionTable:
    """The option table of ``target`` at ``version`` (default: the newest supported)."""
    return get(target).table(version)
