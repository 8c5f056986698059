"""The expert view of a mesh: EP carved from the data-sharded x context (x tensor) ranks.

torchtitan (``distributed/parallel_dims.py``) unflattens the same world a second way for the
experts: ``dp_shard x cp`` (``x tp`` when expert tensor parallelism is 1) is split into
``efsdp x ep`` (ep inner), ``etp`` is tp or 1, and the expert weights are replicated over
``dp_replicate`` and sharded over ``efsdp``. So the ranks holding the same experts, the
expert-data-parallel group ``edp``, are ``dp_replicate x efsdp``, and
ep x edp = dp x cp x tp / etp on every pipeline rank.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hetpar.errors import ConfigError

if TYPE_CHECKING:
    from hetpar.placement.mesh import Groups, Mesh


def sharded_dims(mesh: Mesh, etp: int) -> tuple[str, ...]:
    """The dimensions EP is carved from: dp's sharded part (all of dp unless it was
    unflattened with a ``dp_replicate``), cp, and tp when etp = 1."""
    dp = tuple(d for d in mesh.dims if mesh.base(d) == "dp" and d != "dp_replicate")
    return (*dp, "cp", *(("tp",) if etp == 1 else ()))


def replicate_dims(mesh: Mesh) -> tuple[str, ...]:
    """The dimensions the experts are replicated over (``dp_replicate`` if unflattened)."""
    return tuple(d for d in mesh.dims if d == "dp_replicate")


def check_experts(mesh: Mesh, ep: int, etp: int) -> None:
    """ConfigError naming the factors when ``ep`` / ``etp`` do not fit ``mesh``."""
    if ep < 1:
        raise ConfigError(f"mesh: ep must be >= 1, got {ep}")
    tps = sorted({p.tp for p in mesh.ranks})
    if etp != 1 and tps != [etp]:
        raise ConfigError(f"mesh: etp={etp} must be 1 or the tp degree; tp is "
                          f"{'/'.join(map(str, tps))}")
    dims = sharded_dims(mesh, etp)
    sizes = sorted({len(g) for g in mesh.partition(dims)})
    bad = [s for s in sizes if s % ep]
    if bad:
        shown = " x ".join(f"{d}({mesh.size(d)})" for d in dims)
        raise ConfigError(f"mesh: ep={ep} does not divide {shown} = "
                          f"{'/'.join(map(str, bad))}")


def expert_groups(mesh: Mesh, name: str) -> Groups:
    """The groups of ``ep``, ``efsdp``, ``edp`` or ``etp`` of ``mesh``'s expert view."""
    assert mesh.experts is not None
    ep, etp = mesh.experts
    dims = sharded_dims(mesh, etp)
    if name == "ep":  # ep inner: runs of ep consecutive sharded ranks
        return tuple(g[i:i + ep] for g in mesh.partition(dims) for i in range(0, len(g), ep))
    if name == "efsdp":  # same ep coordinate, one replicate coordinate
        return tuple(g[e::ep] for g in mesh.partition(dims) for e in range(ep))
    if name == "edp":  # same ep coordinate over dp_replicate x efsdp
        full = replicate_dims(mesh) + dims
        return tuple(g[e::ep] for g in mesh.partition(full) for e in range(ep))
    assert name == "etp", name
    if etp == 1:
        return tuple((r,) for r in range(mesh.world_size))
    return mesh.groups("tp")
