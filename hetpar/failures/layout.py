"""Where a plan's replicas sit on scale-up domains: the unit one GPU failure takes out.

A view of the one placement (``hetpar.placement.place``, a ``Mesh``): degrees and TP groups
(``mesh.groups("tp")``) are read off it, so the failure studies see the devices ``simulate``
and ``run`` see.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hetpar import feasibility
from hetpar.errors import ConfigError
from hetpar.placement import Mesh, place
from hetpar.specs.cluster import ClusterSpec, NodeGroup
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import Plan


@dataclass(frozen=True, kw_only=True)
class Layout:
    """A uniform plan seen as replicas of TP groups laid on scale-up domains.

    A TP group of ``tp`` GPUs sits inside one scale-up domain of ``domain_size`` GPUs, so one
    failed GPU takes its whole TP group out of uniform TP (Arfeen et al. 2025, Sec. 3): the TP
    group is the failure unit. One DP replica spans ``units_per_replica`` = pp x cp units.
    """

    group: str
    domain_size: int
    tp: int
    units_per_replica: int
    replicas: int
    spare_units: int
    """Units of the node group the plan leaves idle (hot spares)."""
    batch_per_replica: int
    micro_batch: int
    pp: int
    vpp: int

    @property
    def units(self) -> int:
        """Units the plan uses."""
        return self.replicas * self.units_per_replica

    @property
    def domains_per_replica(self) -> float:
        """Scale-up domains one DP replica spans."""
        return self.units_per_replica * self.tp / self.domain_size

    @property
    def microbatches(self) -> int:
        return self.batch_per_replica // self.micro_batch


def _plan_group(plan: Plan, cluster: ClusterSpec) -> NodeGroup:
    if plan.group is not None:
        return cluster.group(plan.group)
    if len(cluster.node_groups) != 1:
        names = ", ".join(g.name for g in cluster.node_groups)
        raise ConfigError(
            f"plan: group not set and cluster {cluster.name!r} has several node groups; "
            f"allowed: one of {names}"
        )
    return cluster.node_groups[0]


def layout(model: ModelSpec, cluster: ClusterSpec, plan: Plan) -> Layout:
    """The failure layout of a uniform ``plan`` on ``cluster``; ConfigError if they do not match."""
    if not plan.uniform:
        raise ConfigError("plan: failure analysis needs a uniform plan (tp/pp/dp); got replicas")
    feasibility.check_costed(model, plan)  # first: the verdict simulate gives the same plan
    g = _plan_group(plan, cluster)
    n = g.domain_size
    if n > g.num_gpus:
        raise ConfigError(
            f"node group {g.name!r}: scale-up domain of {n} GPUs larger than the group's "
            f"{g.num_gpus} GPUs; allowed: at most {g.num_gpus}"
        )
    fit = feasibility.scale_up_domain(plan.tp, n, g.name)
    if not fit.ok:  # the planner's restriction; this study's failure unit needs it
        raise ConfigError(
            f"plan: {fit.reason}; the failure analysis needs each TP group inside one "
            f"scale-up domain; allowed: a divisor of {n}"
        )
    need = plan.num_gpus()
    if need > g.num_gpus:
        raise ConfigError(
            f"plan: tp*cp*dp*pp = {need} GPUs, node group {g.name!r} of cluster "
            f"{cluster.name!r} has {g.num_gpus}; allowed: at most {g.num_gpus}"
        )
    pl = place(model, cluster, replace(plan, group=g.name))
    _check_units(pl, n, g.name)
    tp, cp, dp, pp = (pl.axis(a).degree for a in ("tp", "cp", "dp", "pp"))
    per_replica = pp * cp
    return Layout(
        group=g.name, domain_size=n, tp=tp, units_per_replica=per_replica,
        replicas=dp, spare_units=g.num_gpus // tp - per_replica * dp,
        batch_per_replica=plan.batch // dp, micro_batch=plan.micro_batch,
        pp=pp, vpp=plan.vpp,
    )


def _check_units(pl: Mesh, domain: int, group: str) -> None:
    """Every TP group of the placement lies inside one scale-up domain (the failure unit)."""
    for ranks in pl.groups("tp"):
        domains = sorted({pl.ranks[r].device // domain for r in ranks})
        if len(domains) > 1:
            raise ConfigError(
                f"plan: a TP group spans scale-up domains {domains} of node group {group!r} "
                f"(rank order {pl.plan.order!r}); the failure analysis needs each TP group "
                f"inside one domain; allowed: an order with tp innermost, e.g. tp-cp-dp-pp"
            )
