"""Checkpoint integrity: a manifest of sizes and SHA-256 per file, verified before any load.

Pure Python (no torch): the launcher checks a checkpoint directory before it forks ranks, so
every corruption (truncated or flipped shard, lost ``.metadata``, a bad ``latest``) is one
line naming the file, and nothing starts from a state it cannot trust.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from hetpar.errors import ConfigError
from hetpar.io import write_text_atomic

MANIFEST = "manifest.json"
LATEST = "latest"
FORMAT = "hetpar-checkpoint-1"
_STEP_DIR = re.compile(r"step-(\d+)")


class CheckpointError(ConfigError):
    """A checkpoint directory that cannot be trusted: the message names the file and why."""


@dataclass(frozen=True, kw_only=True)
class Resume:
    """Where a run resumes: ``step`` under ``path`` (verified), and what was noticed on the way."""

    step: int
    path: Path
    note: str = ""


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"step-{step}"


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def write_manifest(path: Path, step: int) -> None:
    """Record every file of the step directory ``path`` (size and SHA-256), atomically."""
    files = {p.name: {"bytes": p.stat().st_size, "sha256": _sha256(p)}
             for p in sorted(path.iterdir()) if p.is_file() and p.name != MANIFEST}
    doc = {"format": FORMAT, "step": step, "files": files}
    write_text_atomic(path / MANIFEST, json.dumps(doc, indent=1) + "\n")


def mark_latest(root: str | Path, step: int) -> None:
    """Point ``root/latest`` at ``step`` (written last and atomically)."""
    write_text_atomic(Path(root) / LATEST, str(step))


def verify(path: Path, step: int) -> None:
    """Raise CheckpointError (naming the file) unless ``path`` is an intact step directory."""
    if not path.exists():
        raise CheckpointError(f"checkpoint: {path} does not exist")
    if not path.is_dir():
        raise CheckpointError(f"checkpoint: {path} is a file, expected a step directory")
    mf = path / MANIFEST
    if not mf.is_file():
        what = "is empty" if not any(path.iterdir()) else f"has no {MANIFEST}"
        raise CheckpointError(f"checkpoint: {path} {what} (an interrupted save, or not a "
                              f"hetpar checkpoint)")
    try:
        doc = json.loads(mf.read_text(encoding="utf-8"))
        files = doc["files"]
        ok = doc.get("format") == FORMAT and doc.get("step") == step and isinstance(files, dict)
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError):
        ok = False
    if not ok:
        raise CheckpointError(f"checkpoint: {mf} is not a valid {FORMAT} manifest for step {step}")
    if ".metadata" not in files:
        raise CheckpointError(f"checkpoint: {mf} lists no .metadata file")
    for name, rec in sorted(files.items()):
        f = path / name
        if not f.is_file():
            raise CheckpointError(f"checkpoint: {f} is missing (listed in {MANIFEST})")
        size = f.stat().st_size
        if size != rec.get("bytes"):
            raise CheckpointError(f"checkpoint: {f} has {size} bytes, the manifest says "
                                  f"{rec.get('bytes')} (truncated or overwritten)")
        if _sha256(f) != rec.get("sha256"):
            raise CheckpointError(f"checkpoint: {f} fails its SHA-256 check (corrupted)")


def steps_present(root: Path) -> list[int]:
    """Step numbers of the ``step-N`` entries under ``root``, ascending."""
    out = []
    for p in root.iterdir():
        m = _STEP_DIR.fullmatch(p.name)
        if m:
            out.append(int(m.group(1)))
    return sorted(out)


def resolve(root: str | Path) -> Resume | None:
    """The verified step a run in ``root`` resumes from, or None for a fresh start.

    ``latest`` names the step; without it (deleted, or never written), or when the step it
    names fails verification, the newest step directory that verifies is used, and ``note``
    says so. Anything else is a CheckpointError.
    """
    r = Path(root)
    if not r.exists():
        return None
    if not r.is_dir():
        raise CheckpointError(f"checkpoint: {r} is a file, expected a checkpoint directory")
    present = steps_present(r)
    listed = ", ".join(map(str, present)) or "none"
    latest = r / LATEST
    if latest.exists():
        if not latest.is_file():
            raise CheckpointError(f"checkpoint: {latest} is not a file")
        text = latest.read_bytes()[:64].decode("utf-8", "replace").strip()
        if not re.fullmatch(r"\d+", text) or int(text) < 1:
            raise CheckpointError(f"checkpoint: {latest} holds {text!r}; expected a step "
                                  f"number >= 1 (step directories present: {listed})")
        step = int(text)
        if step not in present:
            raise CheckpointError(f"checkpoint: {latest} names step {step} but there is no "
                                  f"{step_dir(r, step)} (step directories present: {listed})")
        try:
            verify(step_dir(r, step), step)
        except CheckpointError as e:
            return _fall_back(r, step, present, e)
        return Resume(step=step, path=step_dir(r, step))
    skipped = []
    for step in reversed(present):
        try:
            verify(step_dir(r, step), step)
        except CheckpointError as e:
            skipped.append(f"step-{step}: {str(e).split(': ', 2)[-1]}")
            continue
        note = f"checkpoint: {r} has no '{LATEST}' file; using the newest verified step-{step}"
        if skipped:
            note += " (skipped " + "; ".join(skipped) + ")"
        return Resume(step=step, path=step_dir(r, step), note=note)
    if present:
        raise CheckpointError(f"checkpoint: {r} has no '{LATEST}' and no step directory "
                              f"verifies ({'; '.join(skipped)})")
    return None


def _fall_back(root: Path, bad: int, present: list[int], err: CheckpointError) -> Resume:
    """The newest verified step before ``bad`` (the step ``latest`` names, which failed
    ``err``), with a note naming both; ``err`` itself when no older step verifies.

    Why not refuse: a save is verified only when read, so a disk that corrupts the newest
    step would otherwise stop a run whose previous checkpoint is intact (issue 34)."""
    skipped = []
    for step in reversed([s for s in present if s < bad]):
        try:
            verify(step_dir(root, step), step)
        except CheckpointError as e:
            skipped.append(f"step-{step}: {str(e).split(': ', 2)[-1]}")
            continue
        note = (f"checkpoint: the latest {step_dir(root, bad)} is corrupt "
                f"({str(err).split(': ', 2)[-1]}); falling back to the newest verified "
                f"{step_dir(root, step)}")
        if skipped:
            note += " (skipped " + "; ".join(skipped) + ")"
        return Resume(step=step, path=step_dir(root, step), note=note)
    raise CheckpointError(f"{err} (and no older step directory verifies)") from None


def unname(root: str | Path, step: int) -> None:
    """Before ``step`` is saved again over a leftover directory: if ``latest`` names it (a
    corrupt step the run fell back from), point ``latest`` at the newest older step that
    verifies (or remove it), so a crash while the step is rewritten leaves a resumable root."""
    r = Path(root)
    latest = r / LATEST
    if not latest.is_file() or latest.read_bytes()[:64].strip() != str(step).encode():
        return
    for older in reversed([s for s in steps_present(r) if s < step]):
        try:
            verify(step_dir(r, older), older)
        except CheckpointError:
            continue
        mark_latest(r, older)
        return
    latest.unlink()


def prune(root: str | Path, current: int, keep: int) -> list[int]:
    """Delete step directories older than the ``keep`` newest up to ``current``; returns them."""
    if keep < 1:
        return []
    r = Path(root)
    old = [s for s in steps_present(r) if s <= current][:-keep]
    for s in old:
        p = step_dir(r, s)
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
    return old
