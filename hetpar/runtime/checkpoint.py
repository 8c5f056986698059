"""Sharded checkpoints with ``torch.distributed.checkpoint`` and exact resume (same plan).

Each rank saves its TP shards and optimizer moments under keys that name the shard
(``layers.0.wq|tp1of2``), so replicas holding the same shard write one copy (DCP keeps one
of equal keys) and a restart of the same plan reads back exactly what it saved.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from hetpar.errors import ConfigError
from hetpar.runtime.gradsync import pack
from hetpar.runtime.model import shard
from hetpar.runtime.worker import Worker, zero_slice

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
    return save_state(_state(w), root, step)


def save_state(state: dict[str, Any], root: str | Path, step: int) -> Path:
    """Save a (DTensor or tensor) state dict as ``root/step-N``, then mark it the latest."""
    path = Path(root) / f"step-{step}"
    dcp.save(state, checkpoint_id=str(path))
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
    """Load the state saved at ``step`` into ``w`` in place.

    The same plan reads its own shards back. A different plan (other TP degrees, layer
    splits, ZeRO on or off) is resharded: each rank reads every saved TP shard of the
    weights it now holds, joins them and takes its new shard. Sharded ZeRO moments cannot be
    resharded (their buckets depend on the plan): a ZeRO checkpoint resumes the same plan.
    """
    path = str(Path(root) / f"step-{step}")
    meta = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
    state = _state(w)
    # Every rank must take the same path (DCP loads are collective): reshard if any must.
    same = torch.tensor([int(all(k in meta for k in state))], device=w.device)
    dist.all_reduce(same, op=dist.ReduceOp.MIN)
    if same.item():
        dcp.load(state, checkpoint_id=path)
        with torch.no_grad():
            for n, p in w.params.items():
                p.copy_(state["param|" + n + f"|tp{w.role.tp_rank}of{w.role.tp}"])
    else:
        if any(k.startswith("m|zero|") for k in meta):
            raise ConfigError("checkpoint: saved with ZeRO; resume it with the same plan")
        _load_resharded(w, path, meta)
        state = {"step": state["step"]}
        dcp.load(state, checkpoint_id=path)
    w.step = int(state["step"].item())


def _load_resharded(w: Worker, path: str, meta: dict[str, Any]) -> None:
    want: dict[str, torch.Tensor] = {}
    for n in w.params:
        for kind in ("param", "m", "v"):
            keys = [k for k in meta if k.startswith(f"{kind}|{n}|tp")]
            if not keys:
                raise ConfigError(f"checkpoint: {path} has no {kind} for {n!r} (another model?)")
            for k in keys:
                want[k] = torch.empty(tuple(meta[k].size), dtype=w.cfg.dtype, device=w.device)
    dcp.load(want, checkpoint_id=path)
    full: dict[str, dict[str, torch.Tensor]] = {"param": {}, "m": {}, "v": {}}
    for kind in full:
        for n in w.params:
            info = w.infos[n]
            parts = sorted((k for k in want if k.startswith(f"{kind}|{n}|tp")),
                           key=lambda k: int(k.rsplit("|tp", 1)[1].split("of")[0]))
            t = want[parts[0]] if info.shard_dim is None else torch.cat(
                [want[k] for k in parts], dim=info.shard_dim)
            full[kind][n] = shard(t, info, w.role.tp_rank, w.role.tp)
    with torch.no_grad():
        for n, p in w.params.items():
            p.copy_(full["param"][n])
            if n in w.state:
                w.state[n].m.copy_(full["m"][n])
                w.state[n].v.copy_(full["v"][n])
        for b, st in zip(w.zero_buckets, w.zero_state, strict=True):
            for kind, dst in (("m", st.m), ("v", st.v)):
                flat = pack(b, full[kind], w.infos, force=True)
                dst.copy_(zero_slice(b, w.role.rank, flat))
