"""The fork launcher: results by rank, a failing rank's traceback, a hang that fails fast."""

from __future__ import annotations

import time
from typing import Any

import pytest
from loadscale import deadline

from hetpar.runtime.launch import LaunchError, launch

pytestmark = pytest.mark.timeout(deadline(60))


def _sum_ranks(rank: int, store: Any) -> float:
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    return float(t.item())


def _one_rank_skips(rank: int, store: Any) -> None:
    import torch
    import torch.distributed as dist

    if rank == 0:
        dist.all_reduce(torch.ones(1))  # rank 1 never joins: must time out, not hang
    else:
        time.sleep(8)


def _raises(rank: int, store: Any) -> None:
    if rank == 1:
        raise ValueError("boom on rank 1")


def test_results_come_back_by_rank() -> None:
    assert launch(_sum_ranks, 3, wall_s=deadline(300)) == [3.0, 3.0, 3.0]


def test_a_hang_fails_within_the_collective_timeout() -> None:
    # the event is the LaunchError naming the rank; how long it takes is not asserted (a
    # loaded machine stretches it), the module's load-scaled hang guard stops a real hang
    with pytest.raises(LaunchError, match="rank 0"):
        launch(_one_rank_skips, 2, timeout_s=2.0, wall_s=deadline(300))


def test_a_failing_rank_reports_its_traceback() -> None:
    with pytest.raises(LaunchError, match="boom on rank 1"):
        launch(_raises, 2, wall_s=deadline(300))
