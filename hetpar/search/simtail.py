"""A lower bound on what ``hetpar.sim`` adds after a replica's pipeline: gradient sync, step."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING

from hetpar import formulas
from hetpar.search.structures import Structure, layout_offsets
from hetpar.specs.cluster import ClusterSpec
from hetpar.specs.gpu import GPUSpec
from hetpar.specs.job import Job
from hetpar.specs.model import ModelSpec

if TYPE_CHECKING:
    from hetpar.sim.network import GroupShape


@dataclass
class SimTail:
    """Per replica class, seconds that ``simulate`` adds after the pipeline, at least.

    ``sim.structure.simulate_replica`` adds ``max_r(exposed_sync_r + optimizer_r - slack_r)``,
    where rank r's slack is the backward time of the ranks before it, so rank 0 (slack 0)
    alone shows that the tail is at least its exposed sync plus its optimizer step; the
    iteration adds the profile's overhead. The bound prices rank 0's share of the model
    (embedding and its fewest layers) with the simulator's own collectives on the DP group
    the plan will have (the same device layout as ``build.py``), so it is the simulator's
    formula evaluated at a lower bound on the bytes (the collectives grow with the bytes).
    With ``zero_scope = "group"`` the DP group is rank 0's peers on its own node group and
    the sync adds ``structure._cross_sync``'s all-reduce of the largest shard across the groups
    (``sim/layout.py`` ``_hybrid``), priced on the same devices.
    """

    model: ModelSpec
    cluster: ClusterSpec
    job: Job
    _shapes: dict[tuple[object, ...], tuple[Rank0, ...]] = field(
        default_factory=dict, repr=False
    )

    def per_class(
        self, s: Structure, cp: int, zero: int, first_layers: Sequence[int],
        scope: str = "all",
    ) -> tuple[float, ...]:
        """Lower bounds for each class of ``s``, rank 0 holding ``first_layers[c]`` layers
        (the split's own count, or vpp, the fewest any split gives it), ZeRO over ``scope``
        (``Plan.zero_scope``)."""
        from hetpar.sim import network as net
        from hetpar.sim.memory import state_bytes_per_param
        from hetpar.sim.profile import resolve

        prof = resolve(self.job.framework or None)
        wb, gb, ob = state_bytes_per_param(self.job.precision, self.job.optimizer)
        topo = net.topology(self.cluster)
        out = []
        rank0 = self._rank0_shape(s, cp, scope if zero >= 1 else "all")
        for c, n0, r0 in zip(s.classes, first_layers, rank0, strict=True):
            slot, shape = c.ranks[0], r0.shape
            params = formulas.embedding_params(self.model) + n0 * _least_layer_params(self.model)
            if c.pp == 1:  # as sim/chunk.py::chunk_params: the tied table once
                params += formulas.output_params(self.model)
                if self.model.tied_embeddings:
                    params -= formulas.word_embedding_params(self.model)
            params /= slot.tp
            sync = 0.0
            # The simulator hides the profile's DP overlap x the last backward of the sync;
            # without an upper bound on that backward here, any overlap makes the bound zero.
            overlap = prof.dp_grad_overlap + prof.dp_param_gather_overlap
            if r0.cross is not None and overlap == 0.0:  # structure._cross_sync, at every stage
                sync = net.all_reduce(r0.cross, params * gb / r0.smallest)
            if shape.n > 1 and zero < 3 and overlap == 0.0:
                if zero == 0:  # structure._dp_sync: all-reduce, or reduce-scatter + all-gather
                    sync += net.all_reduce(shape, params * gb)
                else:
                    sync += net.reduce_scatter(shape, params * gb) + net.all_gather(
                        shape, params * wb
                    )
                if r0.reshard:
                    sync += params * gb / shape.inner.bandwidth
            d = r0.zero_degree if zero >= 1 else 1
            opt = step_bound(topo.gpu(slot.group), params / d * (gb + 2 * ob + wb))
            out.append(sync + opt + prof.iteration_overhead_s)
        return tuple(out)

    def _rank0_shape(self, s: Structure, cp: int, scope: str) -> tuple[Rank0, ...]:
        """Per class: pipeline rank 0's DP group (over all replicas, or with ``group``
        scope over those on its node group) and what ``sim/layout.py`` derives from it, from
        the layout the built plan will have."""
        key = (s.classes, s.uniform, s.layout, cp, scope)
        hit = self._shapes.get(key)
        if hit is None:
            if scope == "group":
                hit = self._place_group(s, cp)
            else:
                shape, reshard = self._place(s, cp)
                hit = (Rank0(shape=shape, reshard=reshard, zero_degree=s.replicas),) * len(
                    s.classes)
            self._shapes[key] = hit
        return hit

    def _place_group(self, s: Structure, cp: int) -> tuple[Rank0, ...]:
        """``zero_scope = "group"``: per class, rank 0's ZeRO group and cross-group shape as
        ``sim/layout.py`` ``_hybrid`` builds them (the simulator's own layout for uniform
        structures; ``layout_offsets``, replicas class-major as ``build.py`` orders them,
        otherwise)."""
        from hetpar.sim import network as net

        if s.uniform is not None:
            return self._uniform_group(s, cp)
        off = layout_offsets(s.classes, cp)
        members = [(c.ranks[0].group, off[(ci, i, 0)])
                   for ci, c in enumerate(s.classes) for i in range(c.count)]
        topo = net.topology(self.cluster)
        by_group: dict[str, list[tuple[str, int]]] = {}
        for d in members:
            by_group.setdefault(d[0], []).append(d)
        cross = topo.shape([g[0] for g in by_group.values()]) if len(by_group) > 1 else None
        smallest = min(len(g) for g in by_group.values())
        reshard = len({c.ranks[0].tp for c in s.classes}) > 1  # over all peers, as _explicit
        return tuple(
            Rank0(shape=topo.shape(by_group[c.ranks[0].group]), reshard=reshard,
                  zero_degree=len(by_group[c.ranks[0].group]), cross=cross, smallest=smallest)
            for c in s.classes
        )

    def _uniform_group(self, s: Structure, cp: int) -> tuple[Rank0, ...]:
        from hetpar.search.build import ORDER
        from hetpar.sim import network as net
        from hetpar.sim.layout import layouts
        from hetpar.specs.plan import Plan

        assert s.uniform is not None
        tp, pp, dp = s.uniform
        plan = Plan(tp=tp, pp=pp, dp=dp, cp=cp, global_batch=dp, order=ORDER[s.layout],
                    zero=1, zero_scope="group")
        by_group: dict[str, Rank0] = {}
        for lay in layouts(self.model, self.cluster, plan)[0]:
            cross = lay.cross.get(0)
            by_group.setdefault(lay.chunks[0].group, Rank0(
                shape=lay.dp_shapes.get(0, net.LOCAL), reshard=bool(lay.reshard.get(0, False)),
                zero_degree=lay.dp_sizes.get(0, 1), cross=cross[0] if cross else None,
                smallest=cross[1] if cross else 1))
        return tuple(by_group[c.ranks[0].group] for c in s.classes)

    def _place(self, s: Structure, cp: int) -> tuple[GroupShape, bool]:
        from hetpar.search.build import ORDER
        from hetpar.sim import network as net
        from hetpar.sim.layout import layouts
        from hetpar.specs.plan import Plan

        if s.uniform is not None:
            # Uniform plans are laid out by the simulator itself (fast path or ``expand``).
            tp, pp, dp = s.uniform
            plan = Plan(tp=tp, pp=pp, dp=dp, cp=cp, global_batch=dp, order=ORDER[s.layout])
            lays, _ = layouts(self.model, self.cluster, plan)
            lay = lays[0]
            return lay.dp_shapes.get(0, net.LOCAL), bool(lay.reshard.get(0, False))
        off = layout_offsets(s.classes, cp)
        devs = [
            (c.ranks[0].group, off[(ci, i, 0)])
            for ci, c in enumerate(s.classes)
            for i in range(c.count)
        ]
        shape = net.topology(self.cluster).shape(devs)
        return shape, len({c.ranks[0].tp for c in s.classes}) > 1


@dataclass(frozen=True, kw_only=True)
class Rank0:
    """Pipeline rank 0's data-parallel view in one replica class (``sim/layout.py``)."""

    shape: GroupShape
    reshard: bool
    zero_degree: int
    """Replicas its ZeRO stage shards over (``Layout.dp_sizes[0]``)."""
    cross: GroupShape | None = None
    """``zero_scope = "group"``: one rank per node group (``Layout.cross``), else None."""
    smallest: int = 1
    """The smallest node group's ZeRO degree (its shards are the largest to all-reduce)."""


@lru_cache(maxsize=256)
def step_bound(gpu: GPUSpec, nbytes: float) -> float:
    """Seconds of an optimizer step over ``nbytes`` of state, at least: ``structure.
    _optimizer_time`` at the GPU's best memory efficiency (the table's largest fraction:
    efficiency is not monotone in the bytes, so this keeps a bound). bench/mutation.py's
    search:optimizer patches it by this name."""
    return nbytes / (gpu.memory_bandwidth * max(gpu.memory_efficiency.fraction))


def _least_layer_params(model: ModelSpec) -> float:
    # MoE models mix dense and expert layers (first_dense_layers, interval, pattern): the least
    # of them all bounds every layer
    return float(min(formulas.layer_params(model, i) for i in range(model.n_layers)))
