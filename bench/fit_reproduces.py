"""Check that the bundled calibration is the documented fit's output on the bundled runs file.

Re-runs the one command (`hetpar validate RUNS --fit PATH`, hetpar/fit.py) into a temporary
file and compares its [fit] and [interval] tables with hetpar/catalog/fit/simulator.toml.
Exit 1 and print the differing values if they disagree (the bundled file is stale: refit with
`hetpar validate ../shared/validation/runs.csv --fit hetpar/catalog/fit/simulator.toml`).
About 2-3 CPU-minutes, too slow for the test suite (tests/test_validation_loso.py checks the
fit is deterministic and independent of the bundled values on a small file).
Run: .venv/bin/python bench/fit_reproduces.py [RUNS.csv]
"""

from __future__ import annotations

import contextlib
import io
import sys
import tempfile
from pathlib import Path

from hetpar.cli.main import main as cli
from hetpar.io import read_document
from hetpar.sim.profile import FITTED_PATH
from hetpar.validation.rows import BUNDLED_RUNS


def main(argv: list[str]) -> int:
    runs = argv[0] if argv else str(BUNDLED_RUNS)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "simulator.toml"
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            code = cli(["validate", runs, "--fit", str(out)])
        assert code == 0, f"hetpar validate --fit exited {code}"
        fresh = read_document(out)
    bundled = read_document(FITTED_PATH)
    bad = [f"{table}.{k}: bundled {bundled.get(table, {}).get(k)!r}, fit {v!r}"
           for table in ("fit", "gpu_efficiency", "interval") for k, v in fresh[table].items()
           if bundled.get(table, {}).get(k) != v]
    bad += [f"{table}.{k}: bundled only" for table in ("fit", "gpu_efficiency", "interval")
            for k in bundled.get(table, {}) if k not in fresh[table]]
    for line in bad:
        print(line)
    print(f"bundled fit {'is' if not bad else 'is NOT'} the fit of {runs}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
