"""The export-target registry: what a target declares (option tables, schedule names, writer,
parser) and the Export it returns; a target module registers itself when imported."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from hetpar import schedules
from hetpar.errors import ConfigError
from hetpar.export.schema import OptionTable, check
from hetpar.schedules import Traits
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import Plan


class ModelRefused(ConfigError):
    """A target has no form for the model at all (no plan of it exports there): ``export``
    adds the registered targets that do accept the same plan to the message."""


@dataclass(frozen=True, kw_only=True)
class Export:
    """An exported plan: the files to write, what was lost, and the plan actually exported."""

    target: str
    plan: Plan
    """The nearest plan the framework can express (equal to the input when nothing is lost)."""
    warnings: tuple[str, ...]
    files: tuple[tuple[str, str], ...]
    """(file name, content) pairs; the first is the main one."""
    options: dict[str, object]
    """The framework options written, for validation against the target's option table."""
    version: str = ""
    """The framework version whose option table and rules the export follows."""
    env: dict[str, str | None] = field(default_factory=dict)
    """Environment variables the launch script sets (None: unsets)."""

    def problems(self) -> list[str]:
        """Options or environment that break the version's option table and validator rules
        (empty when the framework accepts the export as launched)."""
        return check(get(self.target).table(self.version or None), self.options, self.env)


@dataclass(frozen=True, kw_only=True)
class ScheduleNames:
    """What a target calls hetpar's pipeline schedules, owned by the target: by registered
    name, else (for schedules the table does not list) from the schedule's traits."""

    label: str
    """The framework's display name in warnings (``Megatron-LM``)."""
    by_name: Mapping[str, str] = field(default_factory=dict)
    """Registered schedule -> the framework's name for it."""
    by_traits: Callable[[Traits], str | None] | None = None
    """The framework's name for a schedule with these traits (None: it has none)."""

    def name_of(self, schedule: str) -> str | None:
        """The framework's name for registered ``schedule``, None when it has none."""
        if schedule in self.by_name:
            return self.by_name[schedule]
        if self.by_traits is None:
            return None
        return self.by_traits(schedules.traits(schedule))

    def named(self) -> list[str]:
        """The registered schedules the framework has a name for, in registry order."""
        return [s for s in schedules.names() if self.name_of(s)]

    def known(self) -> list[str]:
        """Every framework name of a registered schedule, in registry order (no repeats)."""
        out: list[str] = []
        for s in self.named():
            name = self.name_of(s)
            if name and name not in out:
                out.append(name)
        return out

    def schedule_of(self, framework_name: str) -> str | None:
        """The (first registered) schedule the framework calls ``framework_name``, or None."""
        return next((s for s in self.named() if self.name_of(s) == framework_name), None)

    def require(self, schedule: str) -> str:
        """The framework's name for ``schedule``; ConfigError naming the ones it has if none."""
        name = self.name_of(schedule)
        if not name:
            raise ConfigError(
                f"export: {self.label} has no name for schedule {schedule!r}; it names: "
                f"{', '.join(self.named()) or 'none'}"
            )
        return name

    def keep_or_default(self, plan: Plan) -> tuple[Plan, list[str]]:
        """Keep the plan's schedule if the framework names it (or pp == 1), else 1f1b with a
        warning: the nearest plan a target that falls back instead of refusing exports."""
        if plan.pp == 1 or self.name_of(plan.schedule):
            return plan, []
        fallback = schedules.DEFAULT
        note = f"schedule {plan.schedule!r} is not in {self.label} -> {fallback}"
        return replace(plan, schedule=fallback, vpp=1), [note]


class Writer(Protocol):
    """Writes the files of a plan for one target, at the version of ``table`` (a target that
    declares ``hybrid`` also takes ``replicate: int``, passed only when > 1)."""

    def __call__(self, plan: Plan, model: ModelSpec, *, table: OptionTable,
                 per_node: int | None, config_name: str) -> Export: ...


@dataclass(frozen=True, kw_only=True)
class Check:
    """What a framework's own code said of an export (``hetpar export --check``)."""

    accepted: bool | None
    """True: accepted; False: refused (``message`` quotes the framework); None: not checked."""
    message: str
    """One line: what ran and what it said, or why nothing ran."""


Checker = Callable[[Export], Check]
"""Runs the installed framework's own parser on an export (hetpar/export/checks.py)."""
Parser = Callable[[str, ModelSpec], Plan]
"""Reads the main file of an export back into a uniform plan."""
Reader = Callable[[Path, str, ModelSpec], tuple[Plan, list[str]]]
"""Reads an export from its main file's path and text (and any file beside it); notes."""


@dataclass(frozen=True, kw_only=True)
class Target:
    """An export target: a framework hetpar writes plans for and reads them back from."""

    name: str
    """``--to`` / ``--from`` name; also the ``framework`` of its option tables."""
    help: str
    """One line for ``hetpar export --help``."""
    tables: tuple[OptionTable, ...]
    """Option tables, one per supported framework version (the newest is the default)."""
    schedules: ScheduleNames
    write: Writer
    parse: Parser
    read: Reader | None = None
    """For an export spread over several files; None: ``parse`` of the main file's text."""
    check: Checker | None = None
    """The framework's own parser on an export, where installed; None: never checked."""
    hybrid: str = ""
    """The option that writes hybrid sharding (``write``'s ``replicate`` copies of the ZeRO
    group: ``dp_sync = "hierarchical"``, ``export/hybrid.py``); empty: none, such plans are
    refused and ``write`` is never given ``replicate``."""

    def check_export(self, e: Export) -> Check:
        """``check`` of ``e``, or "not checked" for a target that declares none."""
        if self.check is None:
            return Check(accepted=None, message=f"not checked: export target {self.name!r} "
                         "declares no check of its own")
        return self.check(e)

    def __post_init__(self) -> None:
        versions = [t.version for t in self.tables]
        assert self.tables and len(set(versions)) == len(versions), (self.name, versions)
        assert all(t.framework == self.name for t in self.tables), self.name

    @property
    def versions(self) -> dict[str, OptionTable]:
        """Version -> option table."""
        return {t.version: t for t in self.tables}

    def table(self, version: str | None = None) -> OptionTable:
        """The option table at ``version`` (default: the newest supported)."""
        tables = self.versions
        if version is None:
            return tables[max(tables)]
        if version not in tables:
            raise ConfigError(
                f"export: --framework-version {version!r} is not a supported {self.name} "
                f"version; supported: {', '.join(sorted(tables))}"
            )
        return tables[version]

    def read_file(self, path: Path, text: str, model: ModelSpec) -> tuple[Plan, list[str]]:
        """The plan an export describes, read from its main file; and notes."""
        from hetpar.export.hybrid import read_back  # hybrid imports the placement
        plan, notes = self.read(path, text, model) if self.read else (self.parse(text, model), [])
        return read_back(plan, text), notes


_REGISTRY: dict[str, Target] = {}


def register(target: Target) -> Target:
    """Register ``target`` under its name (a module calls this once, when imported)."""
    assert target.name not in _REGISTRY, f"export target {target.name!r} registered twice"
    _REGISTRY[target.name] = target
    return target


def unregister(name: str) -> None:
    """Remove a registered target (for tests and plug-ins that register temporarily)."""
    del _REGISTRY[name]


def names() -> tuple[str, ...]:
    """The registered targets, in registration order."""
    return tuple(_REGISTRY)


def get(name: str, what: str = "export: unknown target") -> Target:
    """The target called ``name``; ConfigError ``what 'name'; known: ...`` if none is."""
    target = _REGISTRY.get(name)
    if target is None:
        raise ConfigError(f"{what} {name!r}; known: {', '.join(names())}")
    return target


def header(table: OptionTable, plan: Plan, model: ModelSpec, lost: list[str]) -> list[str]:
    """The comment lines every export starts with: plan, framework version, sources, model."""
    head = [
        f"hetpar export of plan {plan.name or '(unnamed)'} for {model.name} -> {table.framework}",
        f"framework version {table.version} (commit {table.commit}); options and rules from: "
        + ", ".join(table.sources),
        f"model: {model.source}" if model.source else f"model: {model.name}",
    ]
    return head + [f"warning: {w}" for w in lost]


def expert_fields(model: ModelSpec) -> str:
    """The ModelSpec expert fields a model sets beyond the expert count and top-k (Qwen-MoE's
    widths and gated shared expert), as ``, field=value`` pairs ('' for Mixtral-like)."""
    pairs = [(f, getattr(model, f)) for f in ("moe_ffn_hidden", "shared_expert_ffn_hidden")]
    out = "".join(f", {f}={v}" for f, v in pairs if v is not None)
    return out + (", shared_expert_gate=true" if model.shared_expert_gate else "")


def moe_losses(model: ModelSpec, target: str) -> list[str]:
    """For a target whose files carry no mixture-of-experts options (nor any model shape)."""
    if model.n_experts <= 1:
        return []
    return [f"{model.name} is a mixture of experts ({model.n_experts} experts, top-"
            f"{model.experts_per_token}{expert_fields(model)}): the {target} files carry no "
            "expert options, so the experts must come from the model code, else they are "
            "dropped"]
