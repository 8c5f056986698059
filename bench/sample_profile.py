"""Sampling profile of a bench script: where one process spends its CPU, by function.

    .venv/bin/python bench/sample_profile.py bench/replay_decision.py --cost sim --events 4

Runs the script (with its arguments) in this process and, every 5 ms of this process's CPU
time (SIGPROF), records the Python stack: prints each function's inclusive share (on the
stack) and self share (running) of the samples. cProfile's per-call overhead inflates the
many small calls of the simulator and the planner; sampling does not. Only this process is
sampled (a search's pool workers are not: this is the driver's view).
"""

from __future__ import annotations

import collections
import runpy
import signal
import sys
from types import FrameType

INTERVAL_S = 0.005
inclusive: collections.Counter[str] = collections.Counter()
own: collections.Counter[str] = collections.Counter()
samples = [0]


def _name(frame: FrameType) -> str:
    path = frame.f_code.co_filename
    return f"{path.split('/hetpar/')[-1]}:{frame.f_code.co_name}"


def _sample(_sig: int, frame: FrameType | None) -> None:
    samples[0] += 1
    if frame is None:
        return
    own[_name(frame)] += 1
    seen: set[str] = set()
    while frame is not None:
        name = _name(frame)
        if name not in seen:  # a recursive function counts once per sample
            inclusive[name] += 1
            seen.add(name)
        frame = frame.f_back


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    sys.argv = sys.argv[1:]
    signal.signal(signal.SIGPROF, _sample)
    signal.setitimer(signal.ITIMER_PROF, INTERVAL_S, INTERVAL_S)
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    except SystemExit:
        pass
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0, 0)
    n = max(samples[0], 1)
    print(f"{samples[0]} samples of {INTERVAL_S * 1e3:g} ms CPU", file=sys.stderr)
    for name, k in inclusive.most_common(40):
        print(f"{k / n:6.1%} incl {own[name] / n:6.1%} self  {name}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
