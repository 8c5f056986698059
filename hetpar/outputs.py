"""Output paths checked before any work: a file name, not a folder or device, in a folder
that can be written (a probe file created and removed there)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from hetpar.errors import ConfigError


def check_file_path(path: str | Path) -> Path:
    """ConfigError unless ``path`` can become a regular file; returns its nearest existing folder.

    A name ending in a separator (``out/``) says "a directory" even where none exists yet:
    refused, never written as a file named ``out`` (one rule for every single-file output)."""
    if isinstance(path, str) and path.endswith(("/", os.sep)):
        raise ConfigError(f"{path}: ends in {path[-1]!r}, which names a directory; "
                          "give a file name")
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"{p}: is a directory; give a file name")
    if p.exists() and not p.is_file():
        # a device or pipe: os.replace would swap the node itself for a regular file
        raise ConfigError(f"{p}: is not a regular file (a device, pipe or socket); "
                          "give a file name")
    above = next((a for a in p.absolute().parents if a.exists()), Path("/"))
    if not above.is_dir():
        raise ConfigError(f"{p}: {above} is not a directory")
    return above


def probe_writable(path: str | Path, *, directory: bool = False) -> None:
    """ConfigError unless ``path`` (a file, or with ``directory`` a folder) can be written:
    the folders it needs are created, a probe file is created in the folder that will hold the
    output, then all of it is removed again. Called before any long work, so that a path under
    /proc, a read-only mount or a full disk is refused up front; a permission test
    (``os.access``) says yes to root everywhere and knows nothing of mounts."""
    p = Path(path)
    if not directory:
        check_file_path(path)
    folder = p if directory else p.parent
    if directory and p.exists() and not p.is_dir():
        raise ConfigError(f"{path}: is a file, expected a directory")
    above = next((a for a in (folder, *folder.parents) if a.exists()), Path("/"))
    if not above.is_dir():
        raise ConfigError(f"{path}: {above} is not a directory")
    made: list[Path] = []
    try:
        # Other processes may probe the same path at once (torchrun starts every rank of
        # `hetpar run` together): one may make a folder between our look and our mkdir, or
        # remove the folders it made before our probe lands; both are retried, not errors.
        for attempt in range(3):
            try:
                _make_folders(folder, made)
                fd, probe = tempfile.mkstemp(dir=folder, prefix=".hetpar-probe.")
                break
            except FileNotFoundError:
                if attempt == 2:
                    raise
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        why = e.strerror or type(e).__name__
        raise ConfigError(f"{path}: cannot write there ({why})") from None
    finally:
        for d in reversed(made):
            try:
                d.rmdir()
            except OSError:
                pass


def _make_folders(folder: Path, made: list[Path]) -> None:
    """Create ``folder`` and its missing parents, recording in ``made`` the ones this call
    made; a folder another process made meanwhile is taken as it is."""
    for d in reversed([folder, *folder.parents]):
        if d.exists():
            continue
        try:
            d.mkdir()
        except FileExistsError:
            if not d.is_dir():
                raise
            continue
        made.append(d)
