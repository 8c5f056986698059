"""The planner's search space, declared as data (a frozen dataclass loadable from TOML)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from hetpar import schedules
from hetpar.errors import ConfigError
from hetpar.io import from_dict, read_document
from hetpar.specs import axes as axis_table
from hetpar.specs.collectives import (
    ALGORITHMS,
    DP_SYNCS,
    PROTOCOLS,
    Algorithm,
    DpSync,
    NcclProtocol,
    NetworkModel,
)
from hetpar.specs.plan import Recompute, ZeroScope

SPACES_DIR = Path(__file__).resolve().parent.parent / "catalog" / "spaces"
RECOMPUTE = ("none", "selective", "full")
Family = Literal["uniform", "mixed", "split", "wrapped", "hybrid"]


@dataclass(frozen=True, kw_only=True)
class SearchSpace:
    """Values each plan dimension may take. Heterogeneous structure is chosen by ``families``.

    ``uniform``: same TP and PP everywhere, equal layers and batch (Megatron-style).
    ``mixed``: identical replicas whose pipeline ranks sit on different GPU types, with an
    uneven layer split. ``split``: replicas of one GPU type each, per-type TP/PP, uneven
    batch shares. ``wrapped``: mixed pipelines in which one group's ranks sit on both sides
    of the others (V100 -> A100 -> V100). ``hybrid``: mixed pipelines plus single-type
    replicas on the rest of their groups, so a stage's replicas mix GPU types. Mixed
    pipelines may have any depth up to ``max(pp)``.
    """

    tp: tuple[int, ...] = (1, 2, 4, 8)
    pp: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8, 16)
    dp: tuple[int, ...] = ()
    """Allowed data-parallel degrees (total replicas); empty = any."""
    cp: tuple[int, ...] = (1,)
    sequence_parallel: tuple[bool, ...] = (True,)
    """Only applies with tp > 1 (with tp = 1 it is always off)."""
    axes: dict[str, tuple[int, ...]] = field(default_factory=dict, hash=False)
    """Degrees of the ``plan``-scope axes of ``specs/axes.py`` (bundled: ep, etp), by name;
    an axis not named here is searched at its row's ``searched`` degrees, or for a
    mixture-of-experts model at ``search.experts.MOE_DEGREES``'s."""
    vpp: tuple[int, ...] = (1, 2)
    micro_batch: tuple[int, ...] = (1, 2, 4)
    schedule: tuple[str, ...] = (schedules.DEFAULT, schedules.DEFAULT_LOOPED)
    recompute: tuple[Recompute, ...] = ("none", "selective", "full")
    zero: tuple[int, ...] = (0, 1, 2, 3)
    zero_scope: tuple[ZeroScope, ...] = ("all", "group")
    """Which peers ZeRO shards over (``Plan.zero_scope``): ``all`` replicas, or only those on
    the same node group (hybrid sharding). ``group`` is generated with ZeRO >= 1 only, and
    kept only for structures with a data-parallel group that spans two node groups
    (elsewhere it is the ``all`` plan; rule ``zero_scope``)."""
    families: tuple[Family, ...] = ("uniform", "mixed", "split")
    layouts: tuple[Literal["dp-inner", "pp-inner"], ...] = ("dp-inner",)
    """Device orders inside a group: ``dp-inner`` (Megatron's tp-cp-dp-pp: a stage's
    data-parallel peers side by side) and/or ``pp-inner`` (tp-cp-pp-dp: a replica's
    pipeline side by side, for networks where pipeline traffic is the heavier)."""
    min_gpu_fraction: float = 0.5
    algorithm: tuple[Algorithm, ...] = ("auto", "ring", "tree")
    protocol: tuple[NcclProtocol, ...] = ("auto",)
    dp_sync: tuple[DpSync, ...] = ("auto", "flat", "hierarchical")
    """What the planner may force on the top plans' collectives (``Plan.collectives``), tried
    after the search where a bound says it could win (``search/collsearch.py``)."""
    network_models: tuple[NetworkModel, ...] = ()
    """Alternative models of the fabric that ``--objective robust`` ranks every plan under
    (worst case over them and the nominal one; ``search/alternatives.py``); empty: its
    bundled list ``alternatives.DEFAULT``."""
    widen_vpp: bool = True
    """Also try the top plans with every other virtual-stage count the layers allow, where
    the bound says they could win (needs a looped schedule in ``schedule``)."""
    """Structures using less than this fraction of the cluster's GPUs are not generated
    (the ``min_gpus`` and ``budget`` objectives set it to 0)."""

    def __post_init__(self) -> None:
        for k in ("tp", "pp", "cp", "vpp", "micro_batch"):
            vals = getattr(self, k)
            if not vals or any(v < 1 for v in vals):
                raise ConfigError(
                    f"search space: {k} must be a non-empty list of integers >= 1, got {list(vals)}"
                )
        for name, vals in self.axes.items():
            if axis_table.get(name).scope != "plan":
                raise ConfigError(f"search space: axes.{name}: only plan-scope axes are "
                                  f"listed here (tp, cp, dp and pp have their own keys)")
            if not vals or any(v < 1 for v in vals):
                raise ConfigError(f"search space: axes.{name} must be a non-empty list of "
                                  f"integers >= 1, got {list(vals)}")
        if any(v < 1 for v in self.dp):
            raise ConfigError(f"search space: dp values must be >= 1, got {list(self.dp)}")
        bad = [r for r in self.recompute if r not in RECOMPUTE]
        if bad or not self.recompute:
            raise ConfigError(
                f"search space: recompute {bad[0] if bad else '[]'!r} not allowed; "
                f"allowed: {', '.join(RECOMPUTE)}"
            )
        if not self.zero or any(z not in (0, 1, 2, 3) for z in self.zero):
            raise ConfigError(
                f"search space: zero must be a list from 0, 1, 2, 3, got {list(self.zero)}"
            )
        if not self.zero_scope or any(z not in ("all", "group") for z in self.zero_scope):
            raise ConfigError(
                "search space: zero_scope must be a non-empty list from 'all', 'group', "
                f"got {list(self.zero_scope)}"
            )
        for k, allowed in (("algorithm", ALGORITHMS), ("protocol", PROTOCOLS),
                           ("dp_sync", DP_SYNCS)):
            bad = [v for v in getattr(self, k) if v not in allowed]
            if bad or "auto" not in getattr(self, k):
                raise ConfigError(f"search space: {k} {bad[0] if bad else list(getattr(self, k))!r}"
                                  f" not allowed; allowed: a list from {', '.join(allowed)} "
                                  "holding 'auto'")
        if not self.families or not self.schedule or not self.sequence_parallel or not self.layouts:
            raise ConfigError(
                "search space: families, schedule, sequence_parallel and layouts must be non-empty"
            )
        if not 0.0 <= self.min_gpu_fraction <= 1.0:
            raise ConfigError(
                f"search space: min_gpu_fraction must be in [0, 1], got {self.min_gpu_fraction}"
            )

    @property
    def max_pp(self) -> int:
        return max(self.pp)

    def axis_degrees(self) -> list[tuple[str, list[int]]]:
        """Per ``plan``-scope axis (table order), the degrees to search."""
        return [(a.name, sorted(set(self.axes.get(a.name, a.searched))))
                for a in axis_table.of_scope("plan")]


def space_names() -> list[str]:
    """Names of the bundled search spaces."""
    return sorted(p.stem for p in SPACES_DIR.glob("*.toml"))


def load_space(ref: str | None = None) -> SearchSpace:
    """A search space by bundled name (``default``, ``wide``) or TOML/JSON path."""
    if ref is None:
        ref = "default"
    p = Path(ref)
    if not (p.suffix in (".toml", ".json") and p.is_file()):
        p = SPACES_DIR / f"{ref}.toml"
        if not p.is_file():
            raise ConfigError(
                f"unknown search space {ref!r}; known: {', '.join(space_names())} (or a file path)"
            )
    return from_dict(SearchSpace, read_document(p), p.name)
