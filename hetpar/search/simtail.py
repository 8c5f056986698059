"""A lower bound on what ``hetpar.sim`` adds after a replica's pipeline: gradient sync, step."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hetpar import formulas
from hetpar.search.structures import Structure, layout_offsets
from hetpar.specs.cluster import ClusterSpec
from hetpar.specs.job import Job
from hetpar.specs.model import ModelSpec

if TYPE_CHECKING:
    from hetpar.sim.network import GroupShape


@dataclass
class SimTail:
    """Per replica class, seconds that ``simulate`` adds after the pipeline, at least.

    ``hetpar.sim.core._replica`` adds ``max_r(exposed_sync_r + optimizer_r - slack_r)``,
    where rank r's slack is the backward time of the ranks before it, so rank 0 (slack 0)
    alone shows that the tail is at least its exposed sync plus its optimizer step; the
    iteration adds the profile's overhead. The bound prices rank 0's share of the model
    (embedding and its fewest layers) with the simulator's own collectives on the DP group
    the plan will have (the same device layout as ``build.py``), so it is the simulator's
    formula evaluated at a lower bound on the bytes (the collectives grow with the bytes).
    """

    model: ModelSpec
    cluster: ClusterSpec
    job: Job
    _shapes: dict[tuple[object, ...], tuple[GroupShape, bool]] = field(
        default_factory=dict, repr=False
    )

    def per_class(
        self, s: Structure, cp: int, zero: int, first_layers: Sequence[int]
    ) -> tuple[float, ...]:
        """Lower bounds for each class of ``s``, rank 0 holding ``first_layers[c]`` layers
        (the split's own count, or vpp, the fewest any split gives it)."""
        from hetpar.sim import network as net
        from hetpar.sim.memory import state_bytes_per_param
        from hetpar.sim.profile import resolve

        prof = resolve(self.job.framework or None)
        shape, reshard = self._rank0_shape(s, cp)
        wb, gb, ob = state_bytes_per_param(self.job.precision, self.job.optimizer)
        topo = net.topology(self.cluster)
        out = []
        for c, n0 in zip(s.classes, first_layers, strict=True):
            slot = c.ranks[0]
            params = formulas.embedding_params(self.model) + n0 * _least_layer_params(self.model)
            if c.pp == 1 and not self.model.tied_embeddings:
                params += formulas.output_params(self.model)
            params /= slot.tp
            sync = 0.0
            # The simulator hides the profile's DP overlap x the last backward of the sync;
            # without an upper bound on that backward here, any overlap makes the bound zero.
            overlap = prof.dp_grad_overlap + prof.dp_param_gather_overlap
            if shape.n > 1 and zero < 3 and overlap == 0.0:
                if zero == 0:  # core._dp_sync: all-reduce, or reduce-scatter + all-gather
                    sync = net.all_reduce(shape, params * gb)
                else:
                    sync = net.reduce_scatter(shape, params * gb) + net.all_gather(
                        shape, params * wb
                    )
                if reshard:
                    sync += params * gb / shape.inner.bandwidth
            # core._optimizer_time at the GPU's best memory efficiency (the table's largest
            # fraction: efficiency is not monotone in the bytes, so this keeps a bound).
            gpu = topo.gpu(slot.group)
            d = s.replicas if zero >= 1 else 1
            nbytes = params / d * (gb + 2 * ob + wb)
            opt = nbytes / (gpu.memory_bandwidth * max(gpu.memory_efficiency.fraction))
            out.append(sync + opt + prof.iteration_overhead_s)
        return tuple(out)

    def _rank0_shape(self, s: Structure, cp: int) -> tuple[GroupShape, bool]:
        """The DP group of pipeline rank 0 over all replicas, and whether TP degrees differ
        in it (the simulator then reshards), from the layout the built plan will have."""
        key = (s.classes, s.uniform, s.layout, cp)
        hit = self._shapes.get(key)
        if hit is None:
            hit = self._shapes[key] = self._place(s, cp)
        return hit

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


def _least_layer_params(model: ModelSpec) -> float:
    # MoE models alternate dense and expert layers; the least of one period bounds them all.
    period = min(model.n_layers, model.moe_layer_interval + 1)
    return float(min(formulas.layer_params(model, i) for i in range(period)))
