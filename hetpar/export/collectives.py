"""A plan's forced collectives in every export: NCCL's environment variables in the launcher."""

from __future__ import annotations

import shlex
from dataclasses import replace

from hetpar.export.target import Export
from hetpar.specs.plan import Plan


def carry(e: Export, plan: Plan) -> Export:
    """``e`` with the plan's ``NCCL_ALGO`` / ``NCCL_PROTO``: exported in each launch script
    (after its comments, before the command) unless it sets them already, and named in the
    first comment of a main file that is not a script (a TOML or JSON job configuration)."""
    env = plan.collectives.env() if plan.collectives else {}
    if not env:
        return e
    lines = [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
    files, scripted = [], False
    for name, text in e.files:
        if text.startswith("#!"):
            scripted = True
            if not all(line in text for line in lines):
                text = _insert(text, lines)
        files.append((name, text))
    if not scripted:
        name, text = files[0]
        mark = "//" if name.endswith(".json") else "#"
        if not name.endswith(".json"):  # JSON has no comments: the warning says it instead
            files[0] = (name, f"{mark} launch with {' '.join(f'{k}={v}' for k, v in env.items())}"
                        f" in the environment (the plan's collectives)\n{text}")
    warn = () if scripted or not files[0][0].endswith(".json") else (
        f"set {' '.join(f'{k}={v}' for k, v in env.items())} where the job starts",)
    return replace(e, files=tuple(files), env={**e.env, **env}, warnings=e.warnings + warn)


def _insert(text: str, lines: list[str]) -> str:
    """``lines`` after the script's leading shebang and comment lines."""
    rows = text.split("\n")
    i = 1
    while i < len(rows) and rows[i].startswith("#"):
        i += 1
    return "\n".join(rows[:i] + lines + rows[i:])
