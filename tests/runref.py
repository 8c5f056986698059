"""The documented reference of a recovered run, computed once per case for every test."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from hetpar.catalog import load_model, load_plan
from hetpar.runtime.api import run as run_plan

# The reference (docs/runtime.md, "Losing a rank") is deterministic: the same plan, steps
# and numerics give the same bits. Tests whose kills resume from the same step (forked and
# torchrun, several fault cases on one plan) therefore share one run of the original plan
# to that step (copied before it is continued), and those that also wrote the same
# degraded plans share the final state. Keys hold the plans' text, so a different degraded
# plan is run anew.
_PREFIX: dict[tuple[str, int, int, str], Path] = {}
_FINAL: dict[tuple[Any, ...], dict[str, Any]] = {}


def reference_state(plan: str, resumed: list[int], degraded: list[Path], *, steps: int,
                    every: int, cfg: Any, work: Path,
                    model_name: str = "tiny-llama") -> dict[str, Any]:
    """The final state of ``plan`` run to ``resumed[0]``, then ``degraded[i]`` from
    ``resumed[i]`` to the next resumed step (the last to ``steps``), all through one
    checkpoint directory (under ``work`` when it must be run)."""
    from test_runtime_cli_recovery import _final_state

    texts = tuple(p.read_text() for p in degraded)
    key = (model_name, plan, tuple(resumed), texts, steps, every, repr(cfg))
    if key in _FINAL:
        return _FINAL[key]
    model = load_model(model_name)
    pkey = (model_name, plan, resumed[0], every, repr(cfg))
    if pkey not in _PREFIX:
        prefix = work / "ref-prefix"
        run_plan(model, load_plan(plan), steps=resumed[0], checkpoint=str(prefix), every=every,
                 cfg=cfg)
        _PREFIX[pkey] = prefix
    ref = work / "ref"
    shutil.copytree(_PREFIX[pkey], ref)
    for path, until in zip(degraded, [*resumed[1:], steps], strict=True):
        run_plan(model, load_plan(str(path)), steps=until, checkpoint=str(ref), every=every,
                 cfg=cfg)
    _FINAL[key] = _final_state(ref / f"step-{steps}")
    return _FINAL[key]
