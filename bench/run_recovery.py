"""Seconds from each fault of `hetpar run` to the first step of the recovered run.

The fault matrix of docs/runtime.md ("Faults beyond one killed worker"), each case
tiny-llama for 20 steps with a checkpoint every 2:
- kill: SIGKILL rank 1 once rank 0 reports step 5 (forked ZeRO-0/1/2, FSDP2, pp=2;
  torchrun --max-restarts 1: ZeRO-0/1/2, FSDP2, pp=2);
- two kills: rank 1 at step 5, then rank 0 of the 3-rank round at step 9 (forked, and
  torchrun --max-restarts 2);
- a rank killed inside the save of step 6 (HETPAR_FAULT: before its shards, after them,
  and rank 0, the writer, between the manifest and `latest`);
- a corrupt latest checkpoint (one flipped bit in step-20 of a finished run, resumed to 24).
Prints, per recovery, the seconds from the fault to the first completed step after it as
seen from outside (from the kill; for injected faults from the supervisor's `died` line,
which follows the death by milliseconds; for the corrupt checkpoint from the command's
start, beside a clean resume's), and the run's own `recovered:` figure.
Usage: .venv/bin/python bench/run_recovery.py
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, kw_only=True)
class Case:
    name: str
    plan: str
    launcher: str = "forked"
    kills: tuple[tuple[int, int], ...] = ()
    """(step, rank) SIGKILLed in turn, the rank numbered in the round then running."""
    fault: str = ""
    """HETPAR_FAULT for the run."""


TP, DP = "tp=2,dp=2,gbs=8,mbs=2", "dp=2,gbs=8,mbs=2"
CASES = [
    Case(name="kill ZeRO-0", plan=TP, kills=((5, 1),)),
    Case(name="kill ZeRO-1", plan=TP + ",zero=1", kills=((5, 1),)),
    Case(name="kill ZeRO-2", plan=DP + ",zero=2", kills=((5, 1),)),
    Case(name="kill FSDP2", plan=DP + ",zero=3", kills=((5, 1),)),
    Case(name="kill pp=2", plan="pp=2," + DP, kills=((5, 1),)),
    Case(name="kill ZeRO-0", plan=DP, launcher="torchrun", kills=((5, 1),)),
    Case(name="kill ZeRO-1", plan=DP + ",zero=1", launcher="torchrun", kills=((5, 1),)),
    Case(name="kill ZeRO-2", plan=DP + ",zero=2", launcher="torchrun", kills=((5, 1),)),
    Case(name="kill FSDP2", plan=DP + ",zero=3", launcher="torchrun", kills=((5, 1),)),
    Case(name="kill pp=2", plan="pp=2," + DP, launcher="torchrun", kills=((5, 1),)),
    Case(name="two kills", plan=TP, kills=((5, 1), (9, 0))),
    Case(name="two kills", plan=TP, launcher="torchrun", kills=((5, 1), (9, 0))),
    Case(name="kill in save, before shards", plan=TP, fault="save-begin:6:1"),
    Case(name="kill in save, after shards", plan=TP, fault="save-end:6:1"),
    Case(name="kill the writer (rank 0)", plan=TP, fault="latest:6:0"),
]


def _world(plan: str) -> int:
    from hetpar.catalog import load_model, load_plan
    from hetpar.runtime.layout import build_layout

    return build_layout(load_plan(plan), load_model("tiny-llama")).world_size


def _cmd(case: Case, ck: str, steps: int = 20) -> list[str]:
    head = [sys.executable]
    if case.launcher == "torchrun":
        tr = shutil.which("torchrun", path=os.path.dirname(sys.executable))
        assert tr, "torchrun not found next to this Python"
        head = [tr, "--standalone", "--nproc-per-node", str(_world(case.plan)),
                "--max-restarts", str(max(1, len(case.kills)))]
    return [*head, "-m", "hetpar.cli.main", "run", "--model", "tiny-llama", "--plan",
            case.plan, "--steps", str(steps), "--checkpoint", ck, "--every", "2"]


def measure(case: Case, ck: str) -> tuple[list[float], list[str], float]:
    """(fault -> first step after it, per recovery; the run's own `recovered:` seconds;
    total wall)."""
    t0 = time.time()
    env = {**os.environ, "HETPAR_FAULT": case.fault}
    proc = subprocess.Popen(_cmd(case, ck), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            text=True, env=env)
    assert proc.stderr is not None
    pids: list[int] = []
    kills, backs, own, lines = list(case.kills), [], [], []
    fault_at = 0.0
    for line in proc.stderr:
        lines.append(line)
        if "rank pids" in line or line.startswith("hetpar run: forked"):
            pids = [int(p) for p in line.split("pids ")[1].split()]
        elif case.fault and not fault_at and "(SIGKILL) died" in line:
            fault_at, pids = time.time(), []
        if "recovered: step" in line:
            own.append(line.split(" done ")[1].split(" s ")[0])
        if kills and pids and line.startswith(f"step {kills[0][0]}:"):
            os.kill(pids[kills.pop(0)[1]], signal.SIGKILL)
            fault_at, pids = time.time(), []
        elif fault_at and pids and line.startswith("step "):
            backs.append(time.time() - fault_at)
            fault_at = 0.0
    proc.wait()
    if proc.returncode != 0:
        raise RuntimeError(f"{case}: exit {proc.returncode}\n" + "".join(lines[-20:]))
    return backs, own, time.time() - t0


def _first_step_s(case: Case, ck: str, steps: int) -> tuple[float, str]:
    """Seconds from the command's start to its first step, and the fallback note if any."""
    t0 = time.time()
    proc = subprocess.Popen(_cmd(case, ck, steps), stderr=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, text=True)
    assert proc.stderr is not None
    first, note = -1.0, ""
    for line in proc.stderr:
        if "falling back" in line:
            note = "falls back to step-18"
        if first < 0 and line.startswith("step "):
            first = time.time() - t0
    proc.wait()
    assert proc.returncode == 0, f"{case}: exit {proc.returncode}"
    return first, note


def corrupt_latest(d: str) -> None:
    """A clean resume and a resume over a corrupt step-20, each from a copy of one run."""
    case = Case(name="corrupt latest", plan=TP)
    ck = os.path.join(d, "ck")
    measure(case, ck)
    clean, bad = os.path.join(d, "clean"), os.path.join(d, "bad")
    shutil.copytree(ck, clean)
    shutil.copytree(ck, bad)
    shard = sorted(Path(bad, "step-20").glob("*.distcp"))[0]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x40
    shard.write_bytes(bytes(data))
    t_clean, _ = _first_step_s(case, clean, 24)
    t_bad, note = _first_step_s(case, bad, 24)
    assert note, "the corrupt step-20 was not reported"
    print(f"forked   {'corrupt latest':30s} {TP:30s} first step {t_bad:5.1f} s after start "
          f"({note}; a clean resume: {t_clean:5.1f} s)")


def main() -> None:
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    for case in CASES:
        with tempfile.TemporaryDirectory() as d:
            try:
                backs, own, total = measure(case, os.path.join(d, "ck"))
            except RuntimeError as e:  # report it and go on with the other cases
                print(f"{case.launcher:8s} {case.name:30s} {case.plan:30s} FAILED: {e}")
                continue
        back = " + ".join(f"{b:.1f}" for b in backs)
        print(f"{case.launcher:8s} {case.name:30s} {case.plan:30s} recovered in {back} s "
              f"(own line {' + '.join(own) or '-'} s, run {total:5.1f} s)")
    with tempfile.TemporaryDirectory() as d:
        corrupt_latest(d)


if __name__ == "__main__":
    main()
