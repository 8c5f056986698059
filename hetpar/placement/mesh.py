"""``Mesh``: a placed plan's ranks and their communicator groups, asked for by axis name.

Modelled on torchtitan's ``ParallelDims`` / ``DeviceMesh`` (torchtitan
``distributed/parallel_dims.py``: one world mesh of named dimensions, ``pp, dp_replicate,
dp_shard, cp, tp``, flattened into views such as ``dp_shard_cp`` and, for MoE, unflattened a
second way into ``efsdp x ep x etp``). Every rank has a coordinate on each named dimension
(``dims``, outer first; the built ones are ``pp, dp, cp, tp``); the groups of a name are the
ranks that agree on every other dimension, ordered by their coordinates on the named ones.

A heterogeneous (explicit-replica) plan is a mesh per replica and per stage: its tp, cp and
pp groups stay inside one replica, and a group along ``dp`` (or a dimension carved from it)
joins the ranks that hold the same shard, i.e. the same layers at the same tp degree, the
same tp and cp rank, across replicas (``RankPlace.replica`` names the replica).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from hetpar.errors import ConfigError
from hetpar.specs import axes
from hetpar.specs.plan import Plan

DIMS: tuple[str, ...] = ("pp", "dp", "cp", "tp")
"""The device dimensions every mesh starts with, outer first (torchtitan's dense order)."""
EXPERT_DIMS: tuple[str, ...] = ("ep", "edp", "efsdp", "etp")
"""The names ``Mesh.with_experts`` adds: expert parallel, expert data parallel (the ranks
holding the same experts), its sharded part (torchtitan's ``efsdp``), expert tensor parallel."""


@dataclass(frozen=True, kw_only=True)
class Axis:
    """A parallel axis: its degree, the feasibility predicate that bounds it, its traffic."""

    name: str
    degree: int
    """The largest degree over the replicas (the degree, for a uniform plan)."""
    predicate: str
    """The ``hetpar.feasibility`` predicate (or rule) its degree must satisfy."""
    collective: str


@dataclass(frozen=True, kw_only=True)
class RankPlace:
    """Where one rank runs and its coordinates on every axis."""

    rank: int
    group: str
    device: int
    """Index inside ``group`` (cluster-wide: ``cluster.group_offset(group) + device``)."""
    replica: int
    pp_rank: int
    tp_rank: int
    cp_rank: int
    tp: int
    cp: int
    pp: int
    chunks: tuple[int, ...]
    """Stage indices (model order) this rank runs: j with j % pp == pp_rank."""
    coords: tuple[tuple[str, int], ...] = ()
    """(name, coordinate) on every ``plan``-scope axis of ``specs/axes.py``: its position
    in its group (``Mesh.groups``), i.e. in its data-parallel group modulo the degree."""


Groups = tuple[tuple[int, ...], ...]


@dataclass(frozen=True, kw_only=True)
class Mesh:
    """The expanded plan, its axes, every rank's place, and its named dimensions' groups."""

    plan: Plan
    """Explicit replicas with every stage's devices assigned."""
    axes: tuple[Axis, ...]
    ranks: tuple[RankPlace, ...]
    stage_ranks: tuple[tuple[tuple[int, ...], ...], ...]
    """``stage_ranks[r][j]``: ranks of stage j of replica r, device order (cp-major, tp inner)."""
    dims: tuple[str, ...] = DIMS
    """The named dimensions, outer first (``unflatten`` splits one in place)."""
    coords: tuple[tuple[int, ...], ...] = ()
    """``coords[rank]``: its coordinate on each of ``dims`` (left out: the built ones')."""
    origin: tuple[tuple[str, str], ...] = ()
    """(dimension, the built dimension it was carved from) for each unflattened one."""
    views: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """Named flattenings (name, dimensions outer first): ``flatten``'s and ``unflatten``'s."""
    experts: tuple[int, int] | None = None
    """(ep, etp) once ``with_experts`` made the expert view."""
    _memo: dict[object, Groups] = field(default_factory=dict, compare=False, hash=False,
                                        repr=False)

    def __post_init__(self) -> None:
        if not self.coords:  # the built dimensions' coordinates, once (dims order)
            object.__setattr__(self, "coords", tuple(
                (p.pp_rank, p.replica, p.cp_rank, p.tp_rank) for p in self.ranks))

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    def axis(self, name: str) -> Axis:
        return next(a for a in self.axes if a.name == name)

    def resolve(self, name: str) -> tuple[str, ...]:
        """The dimensions ``name`` stands for: one dimension, a view, or dimensions and views
        joined by ``_`` (``dp_cp``, ``dp_shard_cp``), outer first; ConfigError if none."""
        known = dict(self.views) | {d: (d,) for d in self.dims}
        if name in known:
            return known[name]
        parts = name.split("_")
        for cut in range(len(parts) - 1, 0, -1):  # the longest known head first
            head = "_".join(parts[:cut])
            if head in known:
                try:
                    return known[head] + self.resolve("_".join(parts[cut:]))
                except ConfigError:
                    continue
        names = [*self.dims, *(v for v, _ in self.views), *self._extra()]
        raise ConfigError(f"mesh: unknown dimension {name!r}; known: {', '.join(names)}")

    def _extra(self) -> list[str]:
        plan_axes = [a.name for a in axes.of_scope("plan")]
        return plan_axes + (list(EXPERT_DIMS) if self.experts else [])

    def groups(self, name: str) -> Groups:
        """The communicator groups of ``name``, each ordered by coordinate: every rank is in
        exactly one. tp: per (replica, pp rank, cp rank); cp: per (replica, pp rank, tp rank);
        pp: per (replica, tp rank, cp rank); dp: ranks holding the same shard across replicas;
        a ``plan``-scope axis of degree d (carved out of the data-parallel ranks): each dp
        group cut into runs of d replicas; ``ep`` / ``edp`` / ``efsdp`` / ``etp``: the expert
        view (``with_experts``)."""
        hit = self._memo.get(name)
        if hit is None:
            hit = self._groups(name)
            self._memo[name] = hit
        return hit

    def _groups(self, name: str) -> Groups:
        if name in EXPERT_DIMS and self.experts is not None:  # the view, once made, wins
            from hetpar.placement.experts import expert_groups

            return expert_groups(self, name)
        if name in {a.name for a in axes.of_scope("plan")}:
            d = self.axis(name).degree
            return tuple(g[i:i + d] for g in self.groups("dp") for i in range(0, len(g), d))
        if name in EXPERT_DIMS:
            raise ConfigError(f"mesh: {name!r} needs the expert view (with_experts)")
        dims = self.resolve(name)
        return self.partition(dims)

    def partition(self, dims: Sequence[str]) -> Groups:
        """Ranks agreeing on every dimension but ``dims``, ordered by ``dims`` (outer first)."""
        keyer = self._keyer(dims)
        found: dict[tuple[object, ...], list[int]] = {}
        for r in range(self.world_size):
            found.setdefault(keyer(r), []).append(r)
        pos = [self.dims.index(d) for d in dims]
        cs = self.coords
        return tuple(tuple(sorted(g, key=lambda r: tuple(cs[r][i] for i in pos)))
                     for g in found.values())

    def key(self, rank: int, dims: Sequence[str]) -> tuple[object, ...]:
        """What the members of ``rank``'s group along ``dims`` share (``partition``).

        Along a dimension carved from dp the other members sit in other replicas: they share
        the shard (layers and tp degree; the pipeline rank follows from it) instead of the
        replica and pipeline rank."""
        return self._keyer(dims)(rank)

    def _keyer(self, dims: Sequence[str]) -> Callable[[int], tuple[object, ...]]:
        across = any(self.base(d) == "dp" for d in dims)
        keep = [i for i, d in enumerate(self.dims) if not (
            d in dims or (across and d == "pp") or (not across and self.base(d) == "dp"))]
        shard = across and "pp" not in dims
        cs, ranks, reps = self.coords, self.ranks, self.plan.replicas

        def key(r: int) -> tuple[object, ...]:
            p, c = ranks[r], cs[r]
            own = tuple(c[i] for i in keep)
            if not across:
                return (*own, p.replica)
            if shard:
                stages = reps[p.replica].stages
                return (*own, (tuple(stages[j].layers for j in p.chunks), p.tp))
            return own

        return key

    def base(self, dim: str) -> str:
        """The built dimension ``dim`` was carved from (itself for a built one)."""
        return dict(self.origin).get(dim, dim)

    def size(self, name: str) -> int:
        """The size of ``name``'s groups (the largest, for a heterogeneous plan)."""
        return max(len(g) for g in self.groups(name))

    def coordinate(self, rank: int, name: str) -> int:
        """``rank``'s position in its group of ``name``."""
        return next(g.index(rank) for g in self.groups(name) if rank in g)

    def flatten(self, dims: Sequence[str], name: str | None = None) -> Mesh:
        """This mesh with the view ``name`` (default the dimensions joined by ``_``)."""
        leaves = tuple(d for n in dims for d in self.resolve(n))
        view = name or "_".join(dims)
        if view in self.dims:
            raise ConfigError(f"mesh: flatten name {view!r} is a dimension")
        return replace(self, views=(*self.views, (view, leaves)), _memo={})

    def unflatten(self, dim: str, parts: Sequence[tuple[str, int]]) -> Mesh:
        """Split dimension ``dim`` into ``parts`` ((name, size), outer first): a rank's
        position in its ``dim`` group, in mixed radix. ``dim`` stays a view of the parts.
        ConfigError naming every factor when their product is not each group's size."""
        if dim not in self.dims:
            raise ConfigError(f"mesh: unflatten {dim!r}: not a dimension; "
                              f"known: {', '.join(self.dims)}")
        total = 1
        for _, n in parts:
            total *= n
        sizes = sorted({len(g) for g in self.groups(dim)})
        if sizes != [total]:
            shown = " x ".join(f"{n}({s})" for n, s in parts)
            raise ConfigError(f"mesh: {shown} = {total} != {dim} {'/'.join(map(str, sizes))}")
        at = self.dims.index(dim)
        pos = {r: i for g in self.groups(dim) for i, r in enumerate(g)}
        cs = self.coords
        coords = []
        for r in range(self.world_size):
            digits, rest = [], pos[r]
            for _, n in reversed(parts):
                digits.append(rest % n)
                rest //= n
            coords.append(cs[r][:at] + tuple(reversed(digits)) + cs[r][at + 1:])
        names = tuple(n for n, _ in parts)
        return replace(self, dims=self.dims[:at] + names + self.dims[at + 1:],
                       coords=tuple(coords),
                       origin=(*self.origin, *((n, self.base(dim)) for n in names)),
                       views=(*self.views, (dim, names)), _memo={})

    def with_experts(self, ep: int, etp: int = 1) -> Mesh:
        """The expert view: ``ep`` carved from dp_shard x cp (x tp when etp = 1), as
        torchtitan's sparse mesh; see ``hetpar.placement.experts``."""
        from hetpar.placement.experts import check_experts

        check_experts(self, ep, etp)
        return replace(self, experts=(ep, etp), _memo={})
