"""Fault injection at the points of a checkpoint save, for the recovery tests and bench.

A SIGKILL sent from outside cannot aim at the few milliseconds a tiny model's save takes,
so ``HETPAR_FAULT=POINT:STEP:RANK`` makes rank RANK kill itself (SIGKILL: no cleanup, as a
lost node) at POINT of the save of step STEP. Only the first round fires: the ranks a
supervisor restarts (forked or torchrun) are disarmed, so a run recovers once.
"""

from __future__ import annotations

import os
import re
import signal

from hetpar.errors import ConfigError

ENV = "HETPAR_FAULT"
POINTS = {
    "save-begin": "before this rank writes its shards (the others may have written theirs)",
    "save-end": "after DCP wrote the step's shards and .metadata, before the manifest",
    "latest": "rank 0, after the manifest, before `latest` moves (the writer's role)",
}
"""Where a rank can die inside ``checkpoint.save_state``, in the order the save reaches them."""

_armed = [True]


def spec() -> tuple[str, int, int] | None:
    """The parsed ``HETPAR_FAULT`` (point, step, rank), or None; ConfigError when malformed."""
    text = os.environ.get(ENV, "")
    if not text:
        return None
    m = re.fullmatch(r"([a-z-]+):([0-9]+):([0-9]+)", text)
    if not m or m.group(1) not in POINTS or int(m.group(2)) < 1:
        raise ConfigError(f"{ENV}: {text!r} is not POINT:STEP:RANK with POINT one of "
                          f"{', '.join(POINTS)} and STEP >= 1")
    return m.group(1), int(m.group(2)), int(m.group(3))


def disarm() -> None:
    """This process is a restarted rank: the fault has already happened."""
    _armed[0] = False


def point(name: str, step: int, rank: int) -> None:
    """SIGKILL this process if ``HETPAR_FAULT`` names this point, step and rank."""
    assert name in POINTS, name
    if _armed[0] and spec() == (name, step, rank):
        os.kill(os.getpid(), signal.SIGKILL)
