"""Cheap costing of candidates against a cost model: stage costs, memory caps, bounds, DP split."""

from __future__ import annotations

from collections.abc import Sequence

from hetpar.search.bounds import ClassLines
from hetpar.search.candidates import Candidate, ClassCost, Knobs, expert_dp, share_unit
from hetpar.search.costmodel import CostModel, StageCost, StageKey, TailBounded
from hetpar.search.pipeline import inflight
from hetpar.search.split import RankCost, Split, fixed_split, split_layers_exact
from hetpar.search.structures import ReplicaClass, Structure, layout_offsets
from hetpar.search.zeroscope import zero_degrees
from hetpar.specs.cluster import ClusterSpec
from hetpar.specs.model import ModelSpec

__all__ = ["Coster", "expert_dp"]  # expert_dp lives in search/candidates.py; importable here too


class Coster:
    """Cheap per-candidate costing against a cost model, with caches shared across candidates."""

    def __init__(
        self,
        model: ModelSpec,
        cluster: ClusterSpec,
        cost: CostModel,
        global_batch: int,
        seq_len: int,
    ) -> None:
        self.model, self.cluster, self.cost = model, cluster, cost
        self._extra: dict[tuple[object, ...], list[float]] = {}
        self._lt: dict[float, tuple[float, ...]] = {}
        self._bnd: dict[tuple[object, ...], float] = {}
        self.batch, self.seq_len = global_batch, seq_len
        self._stage: dict[tuple[object, ...], StageCost] = {}
        self._ranks: dict[tuple[object, ...], list[RankCost]] = {}
        self._split: dict[tuple[object, ...], Split | None] = {}
        self._same: dict[tuple[object, ...], bool] = {}
        self._offsets: dict[tuple[object, ...], dict[tuple[int, int, int], int]] = {}
        self._tails: dict[tuple[object, ...], tuple[float, ...]] = {}
        self._tailed = isinstance(cost, TailBounded)  # resolved once: the check is slow
        self.lines = ClassLines(self.stage, self.extras, model.n_layers)

    def stage(self, group: str, tp: int, k: Knobs) -> StageCost:
        """The cost model's figures for one rank (cached: the planner asks millions of times)."""
        fast = (group, tp, k.cp, k.micro_batch, k.sequence_parallel and tp > 1, k.recompute,
                k.axes)
        hit = self._stage.get(fast)
        if hit is None:
            hit = self._stage[fast] = self.cost.stage_cost(self._key(group, tp, k))
        return hit

    def _key(self, group: str, tp: int, k: Knobs) -> StageKey:
        return StageKey(
            group=group,
            tp=tp,
            cp=k.cp,
            micro_batch=k.micro_batch,
            sequence_parallel=k.sequence_parallel and tp > 1,
            recompute=k.recompute,
            axes=k.axes,
        )

    def unit(self, s: Structure, k: Knobs) -> int:
        """Micro-batches per share unit (the schedule may need multiples of pp per replica)."""
        return share_unit(s, k)

    def nominal_m(self, s: Structure, k: Knobs) -> int:
        """Micro-batches per replica if shares were equal, rounded to the share unit."""
        u = self.unit(s, k)
        units = self.batch // k.micro_batch // u
        return max(1, units // max(1, s.replicas)) * u

    def rank_costs(
        self, c: ReplicaClass, k: Knobs, dps: tuple[int, ...], m: int
    ) -> list[RankCost]:
        """DP inputs for the ranks of class ``c``; ``max_layers`` from the memory model, with
        rank r's ZeRO state sharded over ``dps[r]`` replicas (``zeroscope.zero_degrees``)."""
        key = (c.ranks, c.count, c.layout, k, dps, m)
        hit = self._ranks.get(key)
        if hit is None:
            hit = self._ranks[key] = self._rank_costs(c, k, dps, m)
        return hit

    def _rank_costs(
        self, c: ReplicaClass, k: Knobs, dps: tuple[int, ...], m: int
    ) -> list[RankCost]:
        held = inflight(k.schedule, c.pp, k.vpp, m)
        out = []
        for r, slot in enumerate(c.ranks):
            sc = self.stage(slot.group, slot.tp, k)
            dp = dps[r]
            first, last = r == 0, r == c.pp - 1
            free = (
                sc.capacity_bytes
                - sc.fixed_bytes
                - first * sc.embed_state.sharded(k.zero, dp)
                - last * sc.head_state.sharded(k.zero, dp)
            )
            per_layer = (sc.layer_bytes(k.zero, dp, expert_dp(k, dp, slot.tp))
                         + sc.layer_activation_bytes * held[r])
            cap = int(free // per_layer) if free > 0 else 0
            out.append(
                RankCost(
                    layer_times=self._layer_times(sc.layer_time_s),
                    extra_s=self.extras(c, k)[r],
                    max_layers=cap,
                )
            )
        return out

    def _layer_times(self, t: float) -> tuple[float, ...]:
        # One shared tuple per distinct time: RankCosts are cached by the hundred thousand.
        hit = self._lt.get(t)
        if hit is None:
            hit = self._lt[t] = (t,) * self.model.n_layers
        return hit

    def extras(self, c: ReplicaClass, k: Knobs) -> list[float]:
        """Per rank, time per micro-batch beyond its layers: embedding, head, and the p2p
        sends at every chunk boundary it touches (both sides pay, as blocking sends)."""
        key = (
            c.ranks,
            c.count,
            c.layout,
            k.cp,
            k.micro_batch,
            k.sequence_parallel,
            k.recompute,
            k.vpp,
            k.axes,
        )
        hit = self._extra.get(key)
        if hit is not None:
            return hit
        pp = c.pp
        out = []
        for r, slot in enumerate(c.ranks):
            sc = self.stage(slot.group, slot.tp, k)
            out.append((r == 0) * sc.embed_time_s + (r == pp - 1) * sc.head_time_s)
        for j in range(pp * k.vpp - 1):
            ra, rb = j % pp, (j + 1) % pp
            t = self._boundary(c, ra, rb, k)
            out[ra] += t
            out[rb] += t
        self._extra[key] = out
        return out

    def _boundary(self, c: ReplicaClass, ra: int, rb: int, k: Knobs) -> float:
        a, b = c.ranks[ra], c.ranks[rb]
        same = self._same_node(c, ra, rb, k.cp)
        # Only what the two StageKeys hold (not schedule, vpp or ZeRO): shared across knobs.
        sp = k.sequence_parallel
        key = (a.group, a.tp, b.group, b.tp, same, k.cp, k.micro_batch, sp, k.recompute,
               k.axes)
        hit = self._bnd.get(key)
        if hit is None:
            ka = self._key(a.group, a.tp, k)
            kb = self._key(b.group, b.tp, k)
            hit = self._bnd[key] = self.cost.boundary_time(ka, kb, same)
        return hit

    def _same_node(self, c: ReplicaClass, ra: int, rb: int, cp: int) -> bool:
        """Whether ranks ra and rb share a node in every replica, with build.py's layout."""
        a, b = c.ranks[ra], c.ranks[rb]
        if a.group != b.group:
            return False
        key = (c.ranks, c.count, c.layout, cp, ra, rb)
        hit = self._same.get(key)
        if hit is None:  # one layout per class and pair, not per knob set (hot in wide spaces)
            gpn = self.cluster.group(a.group).gpus_per_node
            okey = key[:4]
            off = self._offsets.get(okey)
            if off is None:
                off = self._offsets[okey] = layout_offsets([c], cp)
            hit = self._same[key] = all(
                off[(0, i, ra)] // gpn == off[(0, i, rb)] // gpn for i in range(c.count)
            )
        return hit

    def cheap_bound(self, s: Structure, variants: Sequence[Knobs]) -> float:
        """Tokens/s upper bound for knob sets that differ only in schedule and ZeRO stage,
        from proven pipeline lines valid for every layer split (``bounds``, module comment)
        and the continuous relaxation of the shares (``bounds.least_makespan``).

        The lines are ``ClassLines.group_makespan``'s; ``_refined_bound`` evaluates the same
        combinations on the split it finds, so it never exceeds this bound. The cost model's
        tail is left out here (placing every structure's DP group costs more than it
        prunes); ``_refined_bound`` adds it once the split is known.
        """
        k = variants[0]
        total = self.batch // k.micro_batch
        best = 0.0
        for sched in dict.fromkeys(v.schedule for v in variants):
            kv = k._replace(schedule=sched)
            m, k0 = self.nominal_m(s, kv), self.unit(s, kv)
            t = self.lines.group_makespan(s, k, sched, m, k0, total)
            best = max(best, self.batch * self.seq_len / t)
        return best * self.cost.bound_slack()

    def tails(self, s: Structure, k: Knobs, first_layers: tuple[int, ...]) -> tuple[float, ...]:
        """Per class, the cost model's lower bound on what it adds after the pipeline
        (zeros for models without one) when rank 0 holds ``first_layers`` layers."""
        if not self._tailed:
            return (0.0,) * len(s.classes)
        key = (s, k.cp, k.zero, k.zero_scope, first_layers, k.axes)
        hit = self._tails.get(key)
        if hit is None:
            hit = self._tails[key] = self.cost.tail_lower_bound(  # type: ignore[attr-defined]
                s, k, first_layers)
        return hit

    def memory_fit(self, s: Structure, k: Knobs) -> float:
        """Memory rule: the least fraction of the model's layers a replica's ranks can hold
        (>= 1 and at least vpp layers on every rank is exactly the DP's feasibility)."""
        m = self.nominal_m(s, k)
        worst = float("inf")
        for ci, c in enumerate(s.classes):
            dps = zero_degrees(s, ci, k.zero_scope)
            caps = [rc.max_layers for rc in self.rank_costs(c, k, dps, m)]
            frac = sum(min(x, self.model.n_layers) for x in caps) / self.model.n_layers
            if min(caps) < k.vpp:
                frac = min(frac, 0.999)
            worst = min(worst, frac)
        return worst

    def memory_ratio(self, s: Structure, k: Knobs) -> float:
        """For the no-plan message: the least, over classes, of a replica's memory over what
        its ranks need at least (fixed bytes, embedding and head, and every layer at the
        cheapest rank's per-layer bytes); unlike ``memory_fit`` it is not rounded to whole
        layers, so a plan whose GPUs cannot hold even one layer still shows how far off it is."""
        m = self.nominal_m(s, k)
        worst = float("inf")
        for ci, c in enumerate(s.classes):
            held = inflight(k.schedule, c.pp, k.vpp, m)
            dps = zero_degrees(s, ci, k.zero_scope)
            have = need = 0.0
            per_layer = float("inf")
            for r, slot in enumerate(c.ranks):
                sc = self.stage(slot.group, slot.tp, k)
                have += sc.capacity_bytes
                need += (sc.fixed_bytes + (r == 0) * sc.embed_state.sharded(k.zero, dps[r])
                         + (r == c.pp - 1) * sc.head_state.sharded(k.zero, dps[r]))
                per_layer = min(per_layer, sc.layer_bytes(k.zero, dps[r],
                                                          expert_dp(k, dps[r], slot.tp))
                                + sc.layer_activation_bytes * held[r])
            need += self.model.n_layers * per_layer
            worst = min(worst, have / need)
        return worst

    def refine(self, cand: Candidate, fixed: bool) -> bool:
        """Solve each class's layer split (exact DP; equal split if ``fixed``) and tighten
        the bound. False if no split fits memory. Uneven batch shares (a uniform layout whose
        replicas cannot share the batch equally) are bounded like any other shares."""
        s, k = cand.structure, cand.knobs
        m = self.nominal_m(s, k)
        cand.classes = []
        for ci, c in enumerate(s.classes):
            a, b = self.cost.pipeline_weights(k.schedule, c.pp, k.vpp, m)
            dps = zero_degrees(s, ci, k.zero_scope)
            key = (c.ranks, c.count, c.layout, k, dps, m, fixed)
            if key not in self._split:
                ranks = self.rank_costs(c, k, dps, m)
                self._split[key] = (
                    fixed_split(ranks, self.model.n_layers, k.vpp)
                    if fixed
                    else split_layers_exact(ranks, a=a, b=b, min_layers=k.vpp)
                )
            sp = self._split[key]
            if sp is None:
                return False
            cand.classes.append(ClassCost(cls=c, split=sp, a_offset=m - a, b=b))
        cand.bound = self._refined_bound(cand, fixed)
        cand.refined = True
        return True

    def _refined_bound(self, cand: Candidate, fixed: bool) -> float:
        """The split is known: the lines of ``cheap_bound`` on it, plus the cost model's
        tail (after the pipeline) for the layers the split gives rank 0, plus the one rank
        line largest at the nominal share (``bounds.best_rank_line``). Each of cheap_bound's
        lines is at most its counterpart here for every share, so this bound never exceeds
        the group's."""
        s, k = cand.structure, cand.knobs
        total_m, k0 = self.batch // k.micro_batch, self.unit(s, k)
        m = self.nominal_m(s, k)
        tails = self.tails(s, k, tuple(cc.split.layers[0] for cc in cand.classes))
        equal = fixed and total_m % (s.replicas * k0) == 0
        t = self.lines.split_makespan(cand.classes, k, m, k0, total_m, tails, equal)
        return self.batch * self.seq_len / t * self.cost.bound_slack()
