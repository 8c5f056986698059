"""Sharded checkpoints with ``torch.distributed.checkpoint``, exact resume and resharding.

Each rank saves its TP shards and optimizer moments under keys that name the shard
(``layers.0.wq|tp1of2``), so replicas holding the same shard write one copy (DCP keeps one
of equal keys) and a restart of the same plan reads back exactly what it saved. ZeRO-1
moments are gathered into the same per-parameter form (over the ZeRO group, which under
hybrid sharding is one node group's: each holds a copy), so any plan can resume any
checkpoint. Rank 0 then writes the manifest (``hetpar.runtime.manifest``) and ``latest``.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from hetpar.errors import ConfigError
from hetpar.runtime import faults
from hetpar.runtime import manifest as mf
from hetpar.runtime.gradsync import pack, unpack
from hetpar.runtime.hybrid import gather
from hetpar.runtime.model import shard
from hetpar.runtime.worker import Worker


def _state(w: Worker) -> dict[str, torch.Tensor]:
    """Parameters and Adam moments of this rank's TP shards, keyed by the shard (collective
    when ZeRO shards the moments: each bucket's slices are all-gathered first)."""
    tag = f"|tp{w.role.tp_rank}of{w.role.tp}"
    out: dict[str, torch.Tensor] = {}
    for n, p in w.params.items():
        out["param|" + n + tag] = p.detach()
    for n, st in w.state.items():
        out["m|" + n + tag], out["v|" + n + tag] = st.m, st.v
    if w.zero_buckets:
        moments: dict[str, dict[str, torch.Tensor]] = {"m": {}, "v": {}}
        for b, sh, st in zip(w.zero_buckets, w.shards, w.zero_state, strict=True):
            for kind, mine in (("m", st.m), ("v", st.v)):
                # the ZeRO group holds the whole bucket (one node group's, under hybrid
                # sharding: every node group keeps a copy of the moments)
                dst = {e.name: moments[kind].setdefault(e.name, torch.zeros_like(w.params[e.name]))
                       for e in b.entries}
                unpack(b, gather(sh, mine, w.groups)[: b.numel], dst, w.infos)
        for kind, ts in moments.items():
            for n, t in ts.items():
                out[kind + "|" + n + tag] = t
    out["step"] = torch.tensor([w.step], dtype=torch.int64)
    return out


def save(w: Worker, root: str | Path, step: int, keep: int = 0) -> Path:
    """Save ``w``'s state after ``step`` iterations under ``root/step-N``; returns the dir."""
    return save_state(_state(w), root, step, keep)


def save_state(state: dict[str, Any], root: str | Path, step: int, keep: int = 0) -> Path:
    """Save a (DTensor or tensor) state dict as ``root/step-N``, then mark it the latest.

    A leftover directory of the same step (a save interrupted by a failure) is removed
    first; after every rank has written, rank 0 records the manifest, moves ``latest`` and
    keeps only the ``keep`` newest steps (0: all).
    """
    path = mf.step_dir(root, step)
    if dist.get_rank() == 0 and path.exists():
        mf.unname(root, step)
    if dist.get_rank() == 0 and path.is_dir():
        shutil.rmtree(path)
    elif dist.get_rank() == 0 and path.exists():
        path.unlink()
    dist.barrier()
    rank = dist.get_rank()
    faults.point("save-begin", step, rank)
    dcp.save(state, checkpoint_id=str(path))
    faults.point("save-end", step, rank)
    dist.barrier()
    if rank == 0:
        # Manifest, then latest: a crash before either leaves the previous step current.
        # Rank 0 is the only writer of both (no lock: the barrier orders the ranks' shards
        # before it); its death between them leaves a verified step that `latest` does not
        # name yet, and the next save of that step replaces it.
        mf.write_manifest(path, step)
        faults.point("latest", step, rank)
        mf.mark_latest(root, step)
        mf.prune(root, step, keep)
    return path


def latest_step(root: str | Path) -> int | None:
    """The last completely saved and verified step under ``root``, or None (CheckpointError
    when the directory cannot be trusted)."""
    r = mf.resolve(root)
    return r.step if r else None


def load(w: Worker, root: str | Path, step: int) -> None:
    """Load the state saved at ``step`` into ``w`` in place.

    The same plan reads its own shards back. A different plan (other TP degrees, layer
    splits, ZeRO on or off) is resharded: each rank reads every saved TP shard of the
    weights it now holds, joins them and takes its new shard. Sharded ZeRO moments cannot be
    resharded (their buckets depend on the plan): a ZeRO checkpoint resumes the same plan.
    """
    path = str(mf.step_dir(root, step))
    meta = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
    state = {} if w.zero_buckets else _state(w)
    # Every rank must take the same path (DCP loads are collective): reshard if any must.
    same = torch.tensor([int(bool(state) and all(
        k in meta and tuple(getattr(meta[k], "size", ())) == tuple(t.shape)
        for k, t in state.items()))],
        device=w.device)
    dist.all_reduce(same, op=dist.ReduceOp.MIN)
    if same.item():
        dcp.load(state, checkpoint_id=path)
        with torch.no_grad():
            for n, p in w.params.items():
                p.copy_(state["param|" + n + f"|tp{w.role.tp_rank}of{w.role.tp}"])
    else:
        _load_resharded(w, path, meta)
        state = {"step": torch.zeros(1, dtype=torch.int64)}
        dcp.load(state, checkpoint_id=path)
    w.step = int(state["step"].item())


def _load_resharded(w: Worker, path: str, meta: dict[str, Any]) -> None:
    want: dict[str, torch.Tensor] = {}
    for n in w.params:
        for kind in ("param", "m", "v"):
            keys = _one_degree([k for k in meta if k.startswith(f"{kind}|{n}|tp")])
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
            if tuple(t.shape) != tuple(info.shape):
                raise ConfigError(f"checkpoint: {path} holds {kind} {n!r} of shape "
                                  f"{tuple(t.shape)}, the model needs {tuple(info.shape)} "
                                  "(another model?)")
            full[kind][n] = shard(t, info, w.role.tp_rank, w.role.tp)
    with torch.no_grad():
        for n, p in w.params.items():
            p.copy_(full["param"][n])
            if n in w.state:
                w.state[n].m.copy_(full["m"][n])
                w.state[n].v.copy_(full["v"][n])
        for b, sh, st in zip(w.zero_buckets, w.shards, w.zero_state, strict=True):
            for kind, dst in (("m", st.m), ("v", st.v)):
                dst.copy_(sh.slice(pack(b, full[kind], w.infos, force=True)))


def _one_degree(keys: list[str]) -> list[str]:
    """The keys of one complete set of TP shards (``|tpIofT`` for I < T; a checkpoint of
    replicas at different TP degrees holds one set per degree, all equal when joined)."""
    by: dict[int, set[int]] = {}
    for k in keys:
        i, t = k.rsplit("|tp", 1)[1].split("of")
        by.setdefault(int(t), set()).add(int(i))
    for deg in sorted(by):
        if by[deg] == set(range(deg)):
            return [k for k in keys if k.endswith(f"of{deg}")]
    return []
