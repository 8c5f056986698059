"""Decompose the gap between the shared and the bundled heterogeneous validation sets.

Copies ../shared/validation/hetero to a temporary folder, applies one or more of the bundled
copy's differences (catalog GPU names, the plans' AMP facts, the clusters' measured links,
the job's framework) and prints `hetpar validate`'s overall line for each variant.
Run from the repository root: `.venv/bin/python bench/hetero_shared_gap.py`.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "validation" / "hetero"
BUNDLED = ROOT / "hetpar" / "catalog" / "validation" / "hetero"
LOCAL_GPUS = {'"../gpus/V100-SXM2-16GB.toml"': '"V100-SXM2-16GB"',
              '"../gpus/T4-16GB.toml"': '"T4-16GB"'}
VARIANTS: dict[str, set[str]] = {
    "shared as is": set(), "gpu names": {"gpu"}, "framework": {"fw"},
    "plan facts": {"plan"}, "cluster links": {"cluster"},
    "all but framework": {"gpu", "plan", "cluster"}, "all": {"gpu", "plan", "cluster", "fw"},
}


def _cluster(run: Path, bundled: Path, changes: set[str]) -> None:
    """Write the variant's cluster file: the shared one or the bundled one, GPU names as asked."""
    text = (bundled if "cluster" in changes else run).joinpath("cluster.toml").read_text()
    for local, catalog in LOCAL_GPUS.items():
        text = text.replace(local, catalog) if "gpu" in changes else text.replace(catalog, local)
    (run / "cluster.toml").write_text(text)


def variant(base: Path, name: str, changes: set[str]) -> str:
    """Build one variant of the shared set and return validate's overall line."""
    d = base / name.replace(" ", "_")
    shutil.copytree(SHARED, d)
    for run in sorted(d.glob("amp-hc-*")):
        _cluster(run, BUNDLED / run.name, changes)
        if "plan" in changes:
            shutil.copy(BUNDLED / run.name / "plan.toml", run / "plan.toml")
    if "fw" in changes:
        index = (d / "runs.csv").read_text()
        (d / "runs.csv").write_text(index.replace(
            'precision=fp16"', 'precision=fp16,framework=megatron-deepspeed"'))
    out = subprocess.run([sys.executable, "-m", "hetpar.cli", "validate", str(d / "runs.csv")],
                         capture_output=True, text=True, check=True).stdout
    return next(line for line in out.splitlines() if line.startswith("all"))


def main() -> None:
    """Print one line per variant."""
    if not SHARED.is_dir():
        sys.exit(f"needs {SHARED} beside the repository")
    with tempfile.TemporaryDirectory() as tmp:
        for name, changes in VARIANTS.items():
            print(f"{name:18s} {variant(Path(tmp), name, changes)}", flush=True)


if __name__ == "__main__":
    main()
