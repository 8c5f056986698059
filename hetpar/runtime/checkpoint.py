"""Sharded checkpoints with ``torch.distributed.checkpoint`` and exact resume (same plan).

Each rank saves its TP shards and optimizer moments under keys that name the shard
(``layers.0.wq|tp1of2``), so replicas holding the same shard write one copy (DCP keeps one
of equal keys) and a restart of the same plan reads back exactly what it saved.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from hetpar.runtime.worker import Worker

STEP_FILE = "latest"


def _state(w: Worker) -> dict[str, torch.Tensor]:
    tag = f"|tp{w.role.tp_rank}of{w.role.tp}"
    out: dict[str, torch.Tensor] = {}
    for n, p in w.params.items():
        out["param|" + n + tag] = p.detach()
    for n, st in w.state.items():
        out["m|" + n + tag], out["v|" + n + tag] = st.m, st.v
    seen: dict[tuple[int, ...], int] = {}
    for b, st in zip(w.zero_buckets, w.zero_state, strict=True):
        j = seen[b.ranks] = seen.get(b.ranks, -1) + 1
        key = f"zero|{'-'.join(map(str, b.ranks))}|{j}|{b.ranks.index(w.role.rank)}"
        out["m|" + key], out["v|" + key] = st.m, st.v
    out["step"] = torch.tensor([w.step], dtype=torch.int64)
    return out


def save(w: Worker, root: str | Path, step: int) -> Path:
    """Save ``w``'s state after ``step`` iterations under ``root/step-N``; returns the dir."""
    path = Path(root) / f"step-{step}"
    dcp.save(_state(w), checkpoint_id=str(path))
    dist.barrier()
    if dist.get_rank() == 0:
        # Written last and atomically: a crash mid-save leaves the previous step current.
        tmp = Path(root) / (STEP_FILE + ".tmp")
        tmp.write_text(str(step))
        os.replace(tmp, Path(root) / STEP_FILE)
    return path


def latest_step(root: str | Path) -> int | None:
    """The last completely saved step under ``root``, or None."""
    f = Path(root) / STEP_FILE
    return int(f.read_text()) if f.is_file() else None


def load(w: Worker, root: str | Path, step: int) -> None:
    """Load the state saved at ``step`` into ``w`` in place (same plan as when saved)."""
    state = _state(w)
    dcp.load(state, checkpoint_id=str(Path(root) / f"step-{step}"))
    with torch.no_grad():
        for n, p in w.params.items():
            p.copy_(state["param|" + n + f"|tp{w.role.tp_rank}of{w.role.tp}"])
    w.step = int(state["step"].item())
