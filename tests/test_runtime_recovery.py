"""Killed worker: SIGKILL one rank of a TP group mid-step; the survivors must carry on exactly."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
from loadscale import deadline, limits
from runtime_helpers import TINY_LLAMA

from hetpar.errors import Infeasible
from hetpar.runtime import recovery
from hetpar.runtime.deadlines import adaptive
from hetpar.runtime.elastic import degrade
from hetpar.runtime.launch import launch
from hetpar.runtime.layout import build_layout, local_cluster
from hetpar.runtime.recovery import train_elastic
from hetpar.runtime.trainer import RankResult, gather_full, reference, train_rank
from hetpar.runtime.worker import RunConfig
from hetpar.specs.plan import Plan

pytestmark = pytest.mark.timeout(deadline(120))
CFG = RunConfig(timeout_s=5.0)
STEPS, KILL_STEP = 5, 2


def _rank(rank: int, store: Any, layout: Any, kill: tuple[int, int]) -> RankResult:
    return train_elastic(rank, store, layout, CFG, STEPS, kill)


def _check_survivors(plan: Plan, victim: int) -> list[RankResult]:
    layout = build_layout(plan, TINY_LLAMA)
    res = launch(_rank, layout.world_size, layout, (victim, KILL_STEP), timeout_s=5.0,
                 expect_killed=(victim,), wall_s=deadline(90))
    assert res[victim] is None
    deg = degrade(layout, {victim})
    active = [r for old, r in enumerate(res) if old in deg.new_rank]
    ref_losses, ref_params = reference(TINY_LLAMA, plan.batch, STEPS, CFG)
    for r in active:
        # Every step exactly once, in order: none skipped, none repeated.
        done = [int(e.split()[1]) for e in r.events if re.fullmatch(r"step \d+", e)]
        assert done == list(range(STEPS)), r.events
        assert any(e.startswith(f"failure at step {KILL_STEP}") for e in r.events), r.events
        resumed = [float(e.split()[1]) for e in r.events if e.startswith("resumed")]
        # resumed once; how fast is bench/run_recovery.py's figure, not a test's (load)
        assert len(resumed) == 1 and resumed[0] > 0, r.events
        for a, b in zip(r.losses, ref_losses, strict=True):
            assert abs(a - b) <= 1e-5 * abs(b)
    new_layout = build_layout(deg.plan, TINY_LLAMA, local_cluster(len(deg.new_rank)))
    by_new = sorted(active, key=lambda r: r.rank)
    for rep in range(new_layout.replicas):
        full = gather_full(new_layout, by_new, rep)
        for name, p in ref_params.items():
            assert (full[name] - p).abs().max().item() <= 1e-6, (rep, name)
    return res


def _ck_rank(rank: int, store: Any, layout: Any, steps: int, ck: str) -> RankResult:
    return train_rank(layout, CFG, steps, checkpoint=ck)


def test_ntp_shrinks_the_degraded_replica_and_continues(tmp_path: Path) -> None:
    plan = Plan(tp=2, dp=2, global_batch=4, on_failure="ntp")
    res = _check_survivors(plan, victim=1)
    # Rank 0 (TP partner of the victim) keeps training its replica alone at tp=1.
    assert res[0].losses and len(res[0].losses) == STEPS
    # The literal reference: the old plan for KILL_STEP steps, then (through a disk checkpoint)
    # the degraded plan from that step on, without any failure.
    old = build_layout(plan, TINY_LLAMA)
    launch(_ck_rank, old.world_size, old, KILL_STEP, str(tmp_path), **limits())
    deg = degrade(old, {1})
    new = build_layout(deg.plan, TINY_LLAMA, local_cluster(len(deg.new_rank)))
    ref = launch(_ck_rank, new.world_size, new, STEPS, str(tmp_path), **limits())
    survivors = sorted((r for r in res if r is not None and r.rank in range(new.world_size)
                        and len(r.losses) == STEPS), key=lambda r: r.rank)
    for got, want in zip(survivors, ref, strict=True):
        for a, b in zip(got.losses[KILL_STEP:], want.losses, strict=True):
            assert abs(a - b) <= 1e-5 * abs(b)
        for name, p in want.params.items():
            assert (got.params[name] - p).abs().max().item() <= 1e-6, name


def test_drop_policy_hands_the_batch_to_the_healthy_replica() -> None:
    plan = Plan(tp=2, dp=2, global_batch=4, on_failure="drop")
    res = _check_survivors(plan, victim=1)
    assert "idle after re-forming" in res[0].events and len(res[0].losses) == KILL_STEP


def test_ntp_with_pipeline_on_eight_ranks() -> None:
    # Rank 5 is TP rank 1 of the second pipeline stage of replica 0 (order tp-cp-dp-pp).
    plan = Plan(tp=2, pp=2, dp=2, global_batch=8, sequence_parallel=True, on_failure="ntp")
    _check_survivors(plan, victim=5)


def test_degrade_plans() -> None:
    layout = build_layout(Plan(tp=2, dp=3, global_batch=6, micro_batch=2,
                               on_failure="drop"), TINY_LLAMA)
    deg = degrade(layout, {3})
    assert [r.batch for r in deg.plan.replicas] == [4, 2]
    assert deg.plan.batch == 6 and sorted(deg.new_rank) == [0, 1, 4, 5]
    ntp = degrade(build_layout(Plan(tp=2, dp=2, global_batch=4), TINY_LLAMA), {0})
    assert [r.stages[0].tp for r in ntp.plan.replicas] == [1, 2]
    with pytest.raises(Infeasible, match="no healthy copy"):
        degrade(build_layout(Plan(tp=2, global_batch=4), TINY_LLAMA), {1})


class _Store:
    """The launcher store's heartbeats, as ``_stale`` reads them (launch rank -> beat time)."""

    def __init__(self, beats: dict[int, float]) -> None:
        self.beats = beats

    def get(self, key: str) -> bytes:
        return repr(self.beats[int(key.split("/")[1])]).encode()


def test_a_live_rank_on_a_loaded_machine_is_not_declared_dead() -> None:
    # Under load a step takes 1.5 s and a live rank's heartbeat thread, starved like the
    # rest, last beat 3 s ago: a fixed 2 s deadline called it dead (issue 34); the adaptive
    # one waits for 10 median steps. A rank silent for 20 s is still found.
    now = time.time()
    store = _Store({0: now - 0.1, 1: now - 3.0, 2: now - 20.0})
    busy = [1.4, 1.5, 1.6]
    assert recovery._stale(store, [0, 1, 2], recovery.STALE_S) == {1, 2}  # the old verdict
    stale_s = adaptive(recovery.STALE_S, busy)
    assert stale_s == pytest.approx(15.0)
    assert recovery._stale(store, [0, 1, 2], stale_s) == {2}


def test_the_deadlines_keep_their_floor_on_an_idle_machine() -> None:
    assert adaptive(2.0, []) == 2.0  # nothing observed yet: the floor
    assert adaptive(2.0, [0.01, 0.02, 0.5]) == 2.0  # fast steps never shorten it
    assert adaptive(10.0, [3.0, 1.0, 2.0]) == 20.0  # the median, not the mean or the last
