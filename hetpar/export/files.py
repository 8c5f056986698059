"""Writing several output files so that none is left half-written."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from hetpar.io import file_mode, make_parent


def write_atomic(files: Sequence[tuple[str | Path, str]]) -> None:
    """Write every (path, text): all to temporary files first, then rename each into place."""
    temps: list[tuple[str, Path]] = []
    try:
        for path, text in files:
            p = make_parent(path)
            fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
            temps.append((tmp, p))
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            # a launcher script runs as ./name.sh; everything else is a plain 0644 file
            os.chmod(tmp, file_mode(executable=text.startswith("#!")))
        for tmp, p in temps:
            os.replace(tmp, p)
    finally:
        for tmp, _ in temps:
            Path(tmp).unlink(missing_ok=True)
