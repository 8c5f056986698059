"""ZeRO-1/2, hybrid sharding and FSDP under ``dp_sync = "hierarchical"``: per rank and level,
the runtime moves the bytes the simulator prices, and trains like the reference."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.distributed as dist
from collective_bytes import Log, count, per_level
from loadscale import deadline
from runtime_helpers import CFG, TINY_GPT, TINY_LLAMA

from hetpar.net import collectives as algo
from hetpar.net.policies import level_bytes
from hetpar.runtime import hiersync
from hetpar.runtime import model as M  # noqa: N812
from hetpar.runtime.gradsync import plan_buckets
from hetpar.runtime.hybrid import shard_of
from hetpar.runtime.launch import launch
from hetpar.runtime.layout import Layout, build_layout
from hetpar.runtime.trainer import RankResult, gather_full, reference, train_rank
from hetpar.sim import network as net
from hetpar.sim.layout import layouts
from hetpar.specs.cluster import ClusterSpec, NodeGroup
from hetpar.specs.collectives import Collectives
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import Plan

pytestmark = pytest.mark.timeout(deadline(180))

HIER = Collectives(dp_sync="hierarchical")
# two nodes of two ranks; the plan's dp_sync asks for the hierarchical sync
CLUSTER = ClusterSpec(name="two-boxes", node_groups=(
    NodeGroup(name="box", gpu="A100-SXM4-80GB", num_nodes=2, gpus_per_node=2,
              nic_bandwidth_gbps=25.0),))
# hybrid sharding: two node groups of one two-rank node each
TWO_TYPES = ClusterSpec(name="two-types", node_groups=(
    NodeGroup(name="a", gpu="A100-SXM4-80GB", num_nodes=1, gpus_per_node=2),
    NodeGroup(name="b", gpu="A100-SXM4-80GB", num_nodes=1, gpus_per_node=2)))
STEPS = 2
MICRO = 2
"""Micro-batches per replica in the FSDP2 cases (batch 2 per replica, micro-batch 1)."""


def _counted(rank: int, store: Any, layout: Layout) -> tuple[Log, RankResult]:
    log: Log = []
    count(log)  # this forked rank only
    return log, train_rank(layout, CFG, STEPS)


def _run(plan: Plan, cluster: ClusterSpec, model: ModelSpec = TINY_GPT
         ) -> tuple[Layout, list[tuple[Log, RankResult]]]:
    layout = build_layout(plan, model, cluster)
    assert layout.hierarchical
    out = launch(_counted, layout.world_size, layout, timeout_s=CFG.timeout_s)
    ref_losses, ref_params = reference(model, plan.batch, STEPS, CFG)
    results = [r for _, r in out]
    for r in results:
        for a, b in zip(r.losses, ref_losses, strict=True):
            assert abs(a - b) <= 1e-5 * abs(b)
    for name, p in gather_full(layout, results, 0).items():
        assert (p - ref_params[name]).abs().max().item() <= 1e-6, name
    return layout, out


def _itemsize() -> int:
    return torch.empty((), dtype=CFG.dtype).element_size()


def _priced(shape: net.GroupShape, op: str, nbytes: float) -> tuple[float, ...]:
    """Bytes per level the simulator prices for ``op`` on ``shape``; checks first that the
    simulator prices it with the hierarchical algorithm (the plan's dp_sync)."""
    levels = shape.levels
    assert net.__dict__[op](shape, nbytes) == pytest.approx(
        algo.hierarchical(levels, op, nbytes)), op  # type: ignore[arg-type]
    out = level_bytes(algo.hierarchical, levels, op, nbytes)  # type: ignore[arg-type]
    return out + (0.0,) * (2 - len(out))


@pytest.mark.parametrize("zero", [1, 2])
def test_zero_reduce_scatter_and_gather_move_the_priced_bytes(zero: int) -> None:
    plan = Plan(dp=4, zero=zero, micro_batch=1, global_batch=8, collectives=HIER)
    layout, out = _run(plan, CLUSTER)
    lays, _ = layouts(TINY_GPT, CLUSTER, plan)
    shape = lays[0].dp_shapes[0]
    assert [lv.size for lv in shape.levels] == [2, 2]
    numel = int(CFG.bucket_mib * 2**20 / _itemsize())
    for rank, (log, _) in enumerate(out):
        buckets = plan_buckets(layout, rank, numel)
        assert buckets and all(b.ranks == (0, 1, 2, 3) for b in buckets)
        priced = [0.0, 0.0]
        for b in buckets:  # gradients reduce-scattered, updated weights all-gathered
            size = shard_of(layout, b, rank).padded * _itemsize()
            for op in ("reduce_scatter", "all_gather"):
                for j, x in enumerate(_priced(shape, op, size)):
                    priced[j] += x * STEPS
        moved = per_level(log, layout.nodes)
        assert moved["inside"] == pytest.approx(priced[0], rel=1e-12), rank
        assert moved["across"] == pytest.approx(priced[1], rel=1e-12), rank
        # k = 2 per node, m = 2 nodes: half of each message inside, a quarter across, twice
        total = sum(shard_of(layout, b, rank).padded for b in buckets) * _itemsize() * STEPS
        assert moved["inside"] == pytest.approx(total, rel=1e-12)
        assert moved["across"] == pytest.approx(total / 2, rel=1e-12)
        assert {name for name, _, _ in log} <= {"reduce_scatter_single", "all_to_all_single",
                                                  "all_gather_single"}


class _Groups:
    """Every group ``hiersync`` asks for, keyed by sorted ranks (created on every rank)."""

    def __init__(self, needed: set[tuple[int, ...]]) -> None:
        self.by = {r: dist.new_group(list(r)) for r in sorted(needed)}

    def get(self, ranks: tuple[int, ...]) -> Any:
        return self.by[tuple(sorted(ranks))]


def _two_level_rank(rank: int, store: Any, nodes: tuple[int, ...]) -> tuple[list[float], ...]:
    ranks = tuple(range(len(nodes)))
    groups = _Groups({ranks} | hiersync.needed_groups({ranks}, nodes))
    n, per = len(ranks), 3
    buf = torch.arange(n * per, dtype=torch.float64) * (rank + 1)
    mine = torch.empty(per, dtype=torch.float64)
    hiersync.reduce_scatter_over(mine, buf, ranks, nodes, groups)
    out = torch.empty(n * per, dtype=torch.float64)
    own = torch.full((per,), float(rank), dtype=torch.float64)
    hiersync.all_gather_over(out, own, ranks, nodes, groups)
    return mine.tolist(), out.tolist()


@pytest.mark.parametrize("nodes", [(0, 0, 1, 1), (0, 1, 0, 1), (1, 0, 0, 1)])
def test_two_level_halves_keep_the_flat_layout(nodes: tuple[int, ...]) -> None:
    """Rank p ends with block p of the sum, and the gather joins blocks in rank order, however
    the ranks sit on the nodes (torch orders each subgroup by global rank)."""
    assert hiersync.split((0, 1, 2, 3), nodes) is not None
    got = launch(_two_level_rank, 4, nodes, timeout_s=CFG.timeout_s)
    total = sum(r + 1 for r in range(4))
    for p, (mine, out) in enumerate(got):
        assert mine == [total * x for x in range(3 * p, 3 * p + 3)]
        assert out == [float(q) for q in range(4) for _ in range(3)]


def test_hybrid_sharding_moves_the_priced_bytes() -> None:
    """zero_scope = "group" on two node groups of one two-rank node: the reduce-scatter and
    the gather stay inside each node, only the shard's all-reduce crosses (one rank a node,
    so both are one level and the two-level forms reduce to the flat calls)."""
    plan = Plan(dp=4, zero=1, zero_scope="group", micro_batch=1, global_batch=8,
                collectives=HIER)
    layout, out = _run(plan, TWO_TYPES)
    assert layout.nodes == (0, 0, 1, 1)
    lay = layouts(TINY_GPT, TWO_TYPES, plan)[0][0]
    shape, (cross, smallest) = lay.dp_shapes[0], lay.cross[0]
    assert (shape.n, shape.k, cross.n, cross.k, smallest) == (2, 2, 2, 1, 2)
    numel = int(CFG.bucket_mib * 2**20 / _itemsize())
    for rank, (log, _) in enumerate(out):
        inside = across = 0.0
        for b in plan_buckets(layout, rank, numel):
            size = shard_of(layout, b, rank).padded * _itemsize()
            inside += sum(_priced(shape, "reduce_scatter", size) + _priced(
                shape, "all_gather", size)) * STEPS
            across += sum(_priced(cross, "all_reduce", size / smallest)) * STEPS
        moved = per_level(log, layout.nodes)
        assert moved["inside"] == pytest.approx(inside, rel=1e-12), rank
        assert moved["across"] == pytest.approx(across, rel=1e-12), rank
        assert across > 0 and inside > 0


def _fsdp_parts(world: int) -> list[int]:
    """Padded bytes of each FSDP2 unit of TINY_LLAMA (embedding, blocks, head), as
    ``fsdp._Net`` wraps them: FSDP2 pads every parameter's first dimension to a multiple of
    the shard group's size."""
    infos = M.param_infos(TINY_LLAMA, range(TINY_LLAMA.n_layers), True, True)

    def padded(names: list[str]) -> int:
        total = 0
        for n in names:
            shape = infos[n].shape
            total += -(-shape[0] // world) * world * math.prod(shape[1:])
        return total * _itemsize()

    units = [[n for n in infos if n in ("tok_emb", "pos_emb")]]
    units += [[n for n in infos if n.startswith(f"layers.{i}.")]
              for i in range(TINY_LLAMA.n_layers)]
    units.append([n for n in infos if n.startswith("lnf") or n == "head"])
    return [padded(u) for u in units]


def test_fsdp_gathers_and_reduce_scatters_in_two_levels() -> None:
    """zero = 3: in each of a replica's two micro-batches every FSDP2 unit's weights are
    all-gathered in forward and again in backward and its gradient reduce-scattered, each in
    two levels."""
    plan = Plan(dp=4, zero=3, micro_batch=1, global_batch=8, collectives=HIER)
    layout, out = _run(plan, CLUSTER, TINY_LLAMA)
    lays, _ = layouts(TINY_LLAMA, CLUSTER, plan)
    shape = lays[0].dp_shapes[0]
    assert [lv.size for lv in shape.levels] == [2, 2]
    priced = [0.0, 0.0]
    for size in _fsdp_parts(layout.world_size):
        for op, times in (("all_gather", 2), ("reduce_scatter", 1)):  # sim/chunk.py _fsdp_comm
            for j, x in enumerate(_priced(shape, op, size)):
                priced[j] += x * times * MICRO * STEPS
    for rank, (log, _) in enumerate(out):
        moved = per_level(log, layout.nodes)
        assert moved["inside"] == pytest.approx(priced[0], rel=1e-12), rank
        assert moved["across"] == pytest.approx(priced[1], rel=1e-12), rank


def test_fsdp_hsdp_shards_inside_and_all_reduces_across() -> None:
    """zero = 3 with zero_scope = "group" (FSDP2's HSDP) on two node groups of one node each:
    the gathers and the reduce-scatter inside the node every micro-batch, the shard's
    all-reduce across once per iteration (the simulator's _fsdp_comm on the ZeRO group plus
    _cross_sync)."""
    plan = Plan(dp=4, zero=3, zero_scope="group", micro_batch=1, global_batch=8,
                collectives=HIER)
    layout, out = _run(plan, TWO_TYPES, TINY_LLAMA)
    lay = layouts(TINY_LLAMA, TWO_TYPES, plan)[0][0]
    shape, (cross, smallest) = lay.dp_shapes[0], lay.cross[0]
    assert (shape.n, shape.k, cross.n, cross.k, smallest) == (2, 2, 2, 1, 2)
    inside = across = 0.0
    for size in _fsdp_parts(2):  # FSDP2 pads to the shard group (the node group's 2 ranks)
        inside += sum(2 * x + y for x, y in zip(_priced(shape, "all_gather", size),
                                                _priced(shape, "reduce_scatter", size),
                                                strict=True)) * MICRO * STEPS
        across += sum(_priced(cross, "all_reduce", size / smallest)) * STEPS
    for rank, (log, _) in enumerate(out):
        moved = per_level(log, layout.nodes)
        assert moved["inside"] == pytest.approx(inside, rel=1e-12), rank
        assert moved["across"] == pytest.approx(across, rel=1e-12), rank


# hybrid sharding whose node groups span two nodes each: the ZeRO group itself goes in two levels
FOUR_NODES = ClusterSpec(name="two-types-two-nodes", node_groups=(
    NodeGroup(name="a", gpu="A100-SXM4-80GB", num_nodes=2, gpus_per_node=2,
              nic_bandwidth_gbps=25.0),
    NodeGroup(name="b", gpu="A100-SXM4-80GB", num_nodes=2, gpus_per_node=2,
              nic_bandwidth_gbps=25.0)))


def test_hybrid_sharding_over_node_groups_of_two_nodes() -> None:
    plan = Plan(dp=8, zero=2, zero_scope="group", micro_batch=1, global_batch=8,
                collectives=HIER)
    layout, out = _run(plan, FOUR_NODES)
    assert layout.nodes == (0, 0, 1, 1, 2, 2, 3, 3)
    lay = layouts(TINY_GPT, FOUR_NODES, plan)[0][0]
    shape, (cross, smallest) = lay.dp_shapes[0], lay.cross[0]
    assert [lv.size for lv in shape.levels] == [2, 2] and (cross.n, smallest) == (2, 4)
    numel = int(CFG.bucket_mib * 2**20 / _itemsize())
    for rank, (log, _) in enumerate(out):
        priced = [0.0, 0.0]
        for b in plan_buckets(layout, rank, numel):
            size = shard_of(layout, b, rank).padded * _itemsize()
            for op in ("reduce_scatter", "all_gather"):
                for j, x in enumerate(_priced(shape, op, size)):
                    priced[j] += x * STEPS
            priced[1] += sum(_priced(cross, "all_reduce", size / smallest)) * STEPS
        moved = per_level(log, layout.nodes)
        assert moved["inside"] == pytest.approx(priced[0], rel=1e-12), rank
        assert moved["across"] == pytest.approx(priced[1], rel=1e-12), rank
