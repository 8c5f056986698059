"""bench/mutation.py patches hetpar's private names: each must still exist, or the bench stops."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# In a child process: checking the targets applies every mutation (bench/mutants.py).
CHILD = """
import sys
sys.path.insert(0, "bench")
import mutants, mutation
from hetpar.sim import structure
print(mutation.check_targets([(m, t) for m in mutants.MUTATORS for t in mutants.TERMS]))
del structure._tied_sync  # as a rename would leave it
print(mutation.check_targets([("sim", "dp_sync")]))
"""


def test_every_name_the_mutation_bench_patches_exists_and_a_rename_is_named() -> None:
    # a renamed target would make setattr add a new name: the mutation would change nothing
    # and count as a survivor, or a kill would turn into an error the table only shows
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    out = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    every, renamed = out.stdout.strip().splitlines()
    assert every == "None"
    assert renamed == ("bench/mutation.py: sim:dp_sync patches hetpar.sim.structure._tied_sync, "
                       "which no longer exists in hetpar: update the mutation to the new name")
