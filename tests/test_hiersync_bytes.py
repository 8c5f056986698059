"""Runtime hierarchical gradient sync moves, per rank and level, the bytes the simulator prices."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch.distributed as dist
from loadscale import limits
from runtime_helpers import CFG, TINY_GPT

from hetpar.net import collectives as algo
from hetpar.net.policies import level_bytes
from hetpar.runtime import hiersync
from hetpar.runtime import model as M  # noqa: N812
from hetpar.runtime.launch import launch
from hetpar.runtime.layout import Layout, build_layout
from hetpar.runtime.trainer import train_rank
from hetpar.sim import network as net
from hetpar.sim.layout import layouts
from hetpar.specs.cluster import ClusterSpec, NodeGroup
from hetpar.specs.plan import Plan

# Bytes one rank sends in each collective, as a ring (all-reduce, reduce-scatter, all-gather;
# Patarasuk & Yuan 2009) or a direct exchange (all-to-all; Thakur et al. 2005) moves them.
_SENT = {
    "all_reduce": lambda args, k: 2 * (k - 1) / k * args[0].nbytes,
    "reduce_scatter_single": lambda args, k: (k - 1) / k * args[1].nbytes,
    "all_gather_single": lambda args, k: (k - 1) / k * args[0].nbytes,
    "all_to_all_single": lambda args, k: (k - 1) / k * args[1].nbytes,
}


class _Counting:
    """``torch.distributed`` as hiersync sees it, logging (op, group ranks, bytes sent)."""

    def __init__(self, log: list[tuple[str, tuple[int, ...], float]]):
        self.log = log

    def __getattr__(self, name: str) -> Any:
        real = getattr(dist, name)
        if name not in _SENT:
            return real

        def wrapped(*args: Any, group: Any = None, **kw: Any) -> Any:
            ranks = tuple(dist.get_process_group_ranks(group)) if group is not None else tuple(
                range(dist.get_world_size()))
            self.log.append((name, ranks, _SENT[name](args, len(ranks))))
            return real(*args, group=group, **kw)

        return wrapped


def _counted_rank(rank: int, store: Any, layout: Layout, steps: int,
                  native: bool) -> list[tuple[str, tuple[int, ...], float]]:
    log: list[tuple[str, tuple[int, ...], float]] = []
    hiersync.dist = _Counting(log)  # type: ignore[assignment]  # this forked rank only
    if not native:
        real = hiersync.reduce_scatter
        hiersync.reduce_scatter = lambda out, buf, group: real(out, buf, group, native=False)  # type: ignore[assignment]
    train_rank(layout, CFG, steps)
    return log


# 25 Gbit/s per GPU across nodes: slow enough that the simulator itself picks the
# hierarchical algorithm for this model's gradients (checked below), not flat NCCL
CLUSTER = ClusterSpec(name="two-boxes", collectives="hierarchical", node_groups=(
    NodeGroup(name="box", gpu="A100-SXM4-80GB", num_nodes=2, gpus_per_node=2,
              nic_bandwidth_gbps=25.0),))
PLAN = Plan(tp=1, pp=1, dp=4, micro_batch=1, global_batch=8)


@pytest.mark.parametrize("native", [True, False], ids=["reduce-scatter", "all-to-all"])
def test_runtime_moves_the_bytes_the_simulator_prices(native: bool) -> None:
    layout = build_layout(PLAN, TINY_GPT, CLUSTER)
    assert layout.hierarchical and layout.nodes == (0, 0, 1, 1)
    steps = 2
    logs = launch(_counted_rank, layout.world_size, layout, steps, native,
                  **limits(CFG.timeout_s))
    # the simulator's data-parallel communicator for the same plan and cluster
    infos = M.param_infos(TINY_GPT, range(TINY_GPT.n_layers), True, True)
    params = sum(math.prod(i.shape) for i in infos.values()) * 4  # fp32 gradients on CPU
    lays, _ = layouts(TINY_GPT, CLUSTER, PLAN)
    levels = lays[0].dp_shapes[0].levels
    assert [lv.size for lv in levels] == [2, 2]
    # the simulator prices this plan's gradient sync with the hierarchical algorithm
    shape = lays[0].dp_shapes[0]
    for nbytes in (params / 2, params):  # bf16 or fp32 gradients, whole
        assert net.all_reduce(shape, nbytes) == pytest.approx(
            algo.hierarchical(levels, "all_reduce", nbytes))
    for rank, log in enumerate(logs):
        moved = {"inside": 0.0, "across": 0.0}
        priced = [0.0, 0.0]
        buckets = 0.0
        for name, ranks, sent in log:
            same_node = len({layout.nodes[r] for r in ranks}) == 1
            moved["inside" if same_node else "across"] += sent
            if name in ("reduce_scatter_single", "all_to_all_single"):  # one per bucket
                size = log_input_bytes(sent, len(ranks))
                buckets += size
                for j, b in enumerate(level_bytes(algo.hierarchical, levels, "all_reduce", size)):
                    priced[j] += b
        assert buckets >= params * steps  # every gradient went through the sync (plus padding)
        assert moved["inside"] == pytest.approx(priced[0], rel=1e-12), rank
        assert moved["across"] == pytest.approx(priced[1], rel=1e-12), rank
        # 2(k-1)/k inside with k = 2: the whole bucket once, not 3/2 of it
        assert moved["inside"] == pytest.approx(buckets, rel=1e-12)


def log_input_bytes(sent: float, k: int) -> float:
    """A reduce-scatter's input bytes from the (k-1)/k of them one rank sends."""
    return sent * k / (k - 1)

