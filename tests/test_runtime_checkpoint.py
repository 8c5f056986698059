"""Sharded checkpoints: a run stopped and restarted from disk equals an uninterrupted one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from loadscale import deadline, limits
from runtime_helpers import CFG, TINY_LLAMA

from hetpar.runtime.launch import launch
from hetpar.runtime.layout import Layout, build_layout
from hetpar.runtime.trainer import RankResult, train_rank
from hetpar.specs.plan import Plan

pytestmark = pytest.mark.timeout(deadline(120))


def _rank(rank: int, store: Any, layout: Layout, steps: int, ck: str | None) -> RankResult:
    return train_rank(layout, CFG, steps, checkpoint=ck, every=2)


@pytest.mark.parametrize("plan", [
    Plan(tp=2, dp=2, zero=1, sequence_parallel=True, global_batch=4),
    Plan(pp=2, schedule="1f1b", global_batch=4),
    Plan(dp=2, zero=3, global_batch=4),
], ids=["tp-dp-zero1", "pp", "fsdp2"])
def test_resume_after_full_restart_is_exact(plan: Plan, tmp_path: Path) -> None:
    layout = build_layout(plan, TINY_LLAMA)
    w = layout.world_size
    straight = launch(_rank, w, layout, 4, None, **limits())
    first = launch(_rank, w, layout, 2, str(tmp_path), **limits())
    assert (tmp_path / "latest").read_text() == "2"
    second = launch(_rank, w, layout, 4, str(tmp_path), **limits())
    for a, b, c in zip(straight, first, second, strict=True):
        assert b.losses + c.losses == a.losses  # exact: same arithmetic, no step lost or redone
        for name, p in a.params.items():
            assert (c.params[name] - p).abs().max().item() == 0.0, name


@pytest.mark.parametrize("resume", [
    Plan(pp=2, global_batch=4),
    Plan(dp=2, zero=1, global_batch=4),
], ids=["into-pp", "into-zero1"])
def test_resume_into_a_different_plan_reshards(resume: Plan, tmp_path: Path) -> None:
    import shutil

    from hetpar.runtime.trainer import gather_full, reference

    ck = tmp_path / "ck"
    saved = build_layout(Plan(tp=2, dp=2, sequence_parallel=True, global_batch=4), TINY_LLAMA)
    launch(_rank, saved.world_size, saved, 2, str(ck), **limits())
    mine = tmp_path / "copy"
    shutil.copytree(ck, mine)
    layout = build_layout(resume, TINY_LLAMA)
    res = launch(_rank, layout.world_size, layout, 4, str(mine), **limits())
    ref_losses, ref_params = reference(TINY_LLAMA, 4, 4, CFG)
    for r in res:
        assert len(r.losses) == 2  # steps 2 and 3 only: nothing redone, nothing skipped
        for a, b in zip(r.losses, ref_losses[2:], strict=True):
            assert abs(a - b) <= 1e-5 * abs(b)
    full = gather_full(layout, res, 0)
    for name, p in ref_params.items():
        assert (full[name] - p).abs().max().item() <= 1e-6, name


def test_zero_checkpoint_reshards_into_another_plan(tmp_path: Path) -> None:
    # ZeRO-1 moments are saved gathered per parameter, so a run that lost ranks (or any
    # other plan) resumes them: dp=2 zero=1 -> tp=2 must equal the uninterrupted reference.
    from hetpar.runtime.trainer import gather_full, reference

    saved = build_layout(Plan(dp=2, zero=1, global_batch=4), TINY_LLAMA)
    launch(_rank, saved.world_size, saved, 2, str(tmp_path), **limits())
    other = build_layout(Plan(tp=2, global_batch=4), TINY_LLAMA)
    res = launch(_rank, other.world_size, other, 4, str(tmp_path), **limits())
    ref_losses, ref_params = reference(TINY_LLAMA, 4, 4, CFG)
    for a, b in zip(res[0].losses, ref_losses[2:], strict=True):
        assert abs(a - b) <= 1e-5 * abs(b)
    full = gather_full(other, res, 0)
    for name, p in ref_params.items():
        assert (full[name] - p).abs().max().item() <= 1e-6, name
