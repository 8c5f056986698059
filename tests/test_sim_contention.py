"""Contention inside simulate: traffic that shares a link with the overlapped gradient sync."""

from __future__ import annotations

import dataclasses

import pytest

from hetpar.catalog import load_model
from hetpar.net.contention import fair_rates, overlap_delay
from hetpar.sim.core import simulate
from hetpar.sim.profile import resolve
from hetpar.specs.cluster import ClusterSpec, NodeGroup
from hetpar.specs.plan import Plan

MODEL = load_model("llama3.1-8b")
FSDP = resolve("fsdp")  # reduces gradient buckets during the backward (dp_grad_overlap = 1)


def _box(gpu: str = "RTX-4090", nodes: int = 1, **kw: object) -> ClusterSpec:
    """Consumer boxes of 4 cards without NVLink: TP and DP meet on the host-memory path."""
    grp = NodeGroup(name="g", gpu=gpu, num_nodes=nodes, gpus_per_node=4, scaleup_size=1,
                    node_bandwidth_gbps=252.0, **kw)  # type: ignore[arg-type]
    return ClusterSpec(name="box", node_groups=(grp,))


def _run(cluster: ClusterSpec, tp: int, dp: int, pp: int = 1, profile: object = FSDP
         ) -> dict[str, float]:
    plan = Plan(tp=tp, pp=pp, dp=dp, micro_batch=1, global_batch=8 * dp, recompute="full")
    return simulate(MODEL, cluster, plan, profile=profile).breakdown  # type: ignore[arg-type]


def test_overlap_delay_is_the_fair_share_of_one_link() -> None:
    # two flows on one link each get half (max-min), so the shorter one ends at 2 x its own
    # time, later by itself, and the longer by the shorter one's time
    assert fair_rates([["l"], ["l"]], {"l": 10.0}) == [5.0, 5.0]
    a, b = 2.0, 5.0
    assert overlap_delay(a, b) == overlap_delay(b, a) == a
    assert overlap_delay(0.0, b) == 0.0


def test_tp_beside_an_overlapped_dp_sync_on_one_host_path_is_slower() -> None:
    one, two = _run(_box(), tp=2, dp=1), _run(_box(), tp=2, dp=2)
    assert two["tp_comm"] > one["tp_comm"] * 1.02
    # nothing else of the TP cost moved: the difference is the shared link
    assert two["compute"] == pytest.approx(one["compute"])
    # each flow got half the link while both ran: the last micro-batch's backward TP
    # collectives (4 of the 6 per layer under full recompute, 8 micro-batches) and the sync
    # (timed alone with the overlap switched off) are each late by the shorter of the two
    last_bwd = one["tp_comm"] / 8 * 4 / 6
    sync = _run(_box(), tp=2, dp=2, profile=dataclasses.replace(FSDP, dp_grad_overlap=0.0))
    assert two["tp_comm"] - one["tp_comm"] == pytest.approx(min(last_bwd, sync["dp_comm"]))


def test_no_contention_when_the_sync_does_not_overlap_the_backward() -> None:
    after = resolve(None)  # the default profile reduces gradients after the backward
    assert after.dp_grad_overlap == 0
    one, two = _run(_box(), 2, 1, profile=after), _run(_box(), 2, 2, profile=after)
    assert two["tp_comm"] == pytest.approx(one["tp_comm"])
    assert two["dp_comm"] > 0


def test_no_contention_when_tp_and_dp_use_different_links() -> None:
    # TP inside an NVLink node, DP across nodes over per-GPU NICs (rails): no common link
    dgx = ClusterSpec(name="dgx", node_groups=(NodeGroup(
        name="g", gpu="A100-SXM4-80GB", num_nodes=2, gpus_per_node=2),))
    plan = dict(tp=2, pp=1, micro_batch=1, recompute="full")
    one = simulate(MODEL, dgx, Plan(dp=1, global_batch=8, **plan), profile=FSDP).breakdown
    two = simulate(MODEL, dgx, Plan(dp=2, global_batch=16, **plan), profile=FSDP).breakdown
    assert two["tp_comm"] == pytest.approx(one["tp_comm"])


def test_pipeline_gradient_sends_share_a_shared_nic_with_the_sync() -> None:
    # two boxes, one pipeline stage per box: the backward's gradient send leaves through the
    # box's one NIC, which the DP ring across boxes also uses (nic_shared)
    shared = _box("RTX-4090", nodes=4, nic_shared=True, nic_bandwidth_gbps=6.25)
    alone = _run(shared, tp=4, dp=1, pp=2)
    busy = _run(shared, tp=4, dp=2, pp=2)
    assert busy["pp_comm"] > alone["pp_comm"] * 1.05
    # a sync after the backward (default profile) leaves the send alone
    after = resolve(None)
    assert _run(shared, tp=4, dp=2, pp=2, profile=after)["pp_comm"] == pytest.approx(
        _run(shared, tp=4, dp=1, pp=2, profile=after)["pp_comm"])


def test_pipeline_sends_beside_zero3_gathers_on_a_shared_nic_are_slower() -> None:
    # ZeRO-3 gathers and reduce-scatters run on the DP ring (across boxes, one NIC per box)
    # during every micro-batch, where the pipeline's sends leave through the same NIC
    shared = _box("RTX-4090", nodes=4, nic_shared=True, nic_bandwidth_gbps=6.25)
    plan = dict(tp=4, pp=2, micro_batch=1, recompute="full", zero=3)
    one = simulate(MODEL, shared, Plan(dp=1, global_batch=8, **plan), profile=FSDP).breakdown
    two = simulate(MODEL, shared, Plan(dp=2, global_batch=16, **plan), profile=FSDP).breakdown
    assert two["pp_comm"] > one["pp_comm"] * 1.5  # sends fully beside much longer gathers
    # ZeRO-1 has no traffic beside the sends but the overlapped sync of the last backward
    z1 = dict(plan, zero=1)
    z1_two = simulate(MODEL, shared, Plan(dp=2, global_batch=16, **z1), profile=FSDP).breakdown
    assert one["pp_comm"] < z1_two["pp_comm"] < two["pp_comm"]
