"""``hetpar export --check`` for torchtitan: the installed torchtitan's own ``ConfigManager``
on a launch script of the form hetpar writes for that release (0.3.0, the one on PyPI)."""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import importlib.util
import io
import re
import shlex
import sys
import types
from collections.abc import Callable
from typing import Any

from hetpar.export.target import Check, Export

# torchtitan 0.3.0 imports its MinimalAsyncEP Triton kernels
# (torchtitan/distributed/minimal_async_ep/kernels.py, `import triton` at module level) while
# loading any model's config registry (models/common/moe.py -> token_dispatcher.py), but does not
# declare triton (CPU torch has none). Parsing a config runs no kernel: without triton the
# module is a placeholder whose every kernel raises if called.
_KERNELS = "torchtitan.distributed.minimal_async_ep.kernels"


class _Placeholder(types.ModuleType):
    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name.startswith("__"):
            raise AttributeError(name)

        def kernel(*args: object, **kwargs: object) -> None:
            raise RuntimeError(f"{_KERNELS}.{name} needs triton, which is not installed")
        return kernel


def installed() -> str | None:
    """The installed torchtitan's version, or None."""
    if importlib.util.find_spec("torchtitan") is None:
        return None
    try:
        return importlib.metadata.version("torchtitan")
    except importlib.metadata.PackageNotFoundError:
        return "(version unknown)"


def parser() -> tuple[Any, str]:
    """torchtitan's ConfigManager class, and a note ('' or how the kernels were stood in for)."""
    note = ""
    if importlib.util.find_spec("triton") is None and _KERNELS not in sys.modules:
        sys.modules[_KERNELS] = _Placeholder(_KERNELS)
        note = " (triton is not installed: its Triton kernels module is a placeholder; " \
               "parsing runs no kernel)"
    return importlib.import_module("torchtitan.config.manager").ConfigManager, note


def argv(script: str) -> list[str]:
    """The arguments after ``-m torchtitan.train`` in a launch script (``"$@"`` dropped)."""
    body = " ".join(ln.rstrip("\\") for ln in script.splitlines()
                    if not ln.lstrip().startswith("#"))
    words = shlex.split(body)
    return [w for w in words[words.index("torchtitan.train") + 1:] if w != "$@"]


def _message(text: str) -> str:
    """tyro's boxed error as one line: the box's body up to its first rule, borders dropped."""
    lines = [re.sub(r"^[\s│╭╰|+]+|[\s│╮╯|+]+$", "", ln) for ln in text.splitlines()]
    rules = [i for i, ln in enumerate(lines) if ln and set(ln) <= set("-─")]
    body = lines[rules[0] + 1:(rules[1] if len(rules) > 1 else None)] if rules else lines
    return " ".join(ln for ln in body if ln)


def parse(script: str) -> tuple[Any, str]:
    """The config torchtitan's ConfigManager makes of a launch script; ValueError with
    torchtitan's own message when it refuses it; and the note of ``parser``."""
    manager, note = parser()
    out = io.StringIO()
    try:
        with contextlib.redirect_stderr(out), contextlib.redirect_stdout(out):
            return manager().parse_args(argv(script)), note
    except SystemExit:  # tyro prints its refusal and exits
        raise ValueError(_message(out.getvalue()) or "tyro refused the arguments") from None


def check(e: Export) -> Check:
    """The installed torchtitan's parser on ``e`` when ``e`` is of the installed release's form;
    "not checked" (saying why) otherwise."""
    version = installed()
    if version is None:
        return Check(accepted=None, message="not checked: torchtitan is not installed (pip "
                     "install torchtitan==0.3.0 parses --framework-version 0.3.0 exports); the "
                     f"export follows hetpar's torchtitan {e.version} option table only")
    if version != e.version:
        return Check(accepted=None, message=f"not checked: the installed torchtitan {version} "
                     f"reads its own form, not {e.version}'s (export with --framework-version "
                     f"{version} to check against it, if hetpar has that form); the export "
                     f"follows hetpar's torchtitan {e.version} option table only")
    where = f"torchtitan {version} ConfigManager.parse_args"
    try:
        _, note = parse(e.files[0][1])
    except Exception as err:  # the framework's own refusal, whatever its type
        text = str(err).strip().splitlines()
        return Check(accepted=False, message=f"{where} refused it: "
                     f"{type(err).__name__}: {text[0] if text else ''}")
    return Check(accepted=True, message=f"accepted by {where}{note}")
