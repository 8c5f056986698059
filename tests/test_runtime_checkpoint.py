"""Sharded checkpoints: a run stopped and restarted from disk equals an uninterrupted one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from runtime_helpers import CFG, TINY_LLAMA

from hetpar.runtime.launch import launch
from hetpar.runtime.layout import Layout, build_layout
from hetpar.runtime.trainer import RankResult, train_rank
from hetpar.specs.plan import Plan

pytestmark = pytest.mark.timeout(120)


def _rank(rank: int, store: Any, layout: Layout, steps: int, ck: str | None) -> RankResult:
    return train_rank(layout, CFG, steps, checkpoint=ck, every=1)


@pytest.mark.parametrize("plan", [
    Plan(tp=2, dp=2, zero=1, sequence_parallel=True, global_batch=4),
    Plan(pp=2, schedule="1f1b", global_batch=4),
], ids=["tp-dp-zero1", "pp"])
def test_resume_after_full_restart_is_exact(plan: Plan, tmp_path: Path) -> None:
    layout = build_layout(plan, TINY_LLAMA)
    w = layout.world_size
    straight = launch(_rank, w, layout, 4, None, timeout_s=10)
    first = launch(_rank, w, layout, 2, str(tmp_path), timeout_s=10)
    assert (tmp_path / "latest").read_text() == "2"
    second = launch(_rank, w, layout, 4, str(tmp_path), timeout_s=10)
    for a, b, c in zip(straight, first, second, strict=True):
        assert b.losses + c.losses == a.losses  # exact: same arithmetic, no step lost or redone
        for name, p in a.params.items():
            assert (c.params[name] - p).abs().max().item() == 0.0, name
