"""Seconds from SIGKILL of one rank of `hetpar run` to the first step of the recovered run.

For each case (forked launcher: ZeRO-0, ZeRO-1, ZeRO-2, FSDP2; torchrun --max-restarts 1:
ZeRO-0, ZeRO-1, FSDP2) runs tiny-llama for 20 steps with a checkpoint every 2, kills rank 1
once rank 0 reports step 5, and prints the time to the first completed step after the restart
as seen from outside (target < 30 s) and the run's own `recovered:` figure (from detection).
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

CASES = [
    ("forked", "tp=2,dp=2,gbs=8,mbs=2"),
    ("forked", "tp=2,dp=2,gbs=8,mbs=2,zero=1"),
    ("forked", "dp=2,gbs=8,mbs=2,zero=2"),
    ("forked", "dp=2,gbs=8,mbs=2,zero=3"),
    ("torchrun", "dp=2,gbs=8,mbs=2"),
    ("torchrun", "dp=2,gbs=8,mbs=2,zero=1"),
    ("torchrun", "dp=2,gbs=8,mbs=2,zero=3"),
]


def measure(launcher: str, plan: str, ck: str) -> tuple[float, float, str, str]:
    """(kill -> first step after restart, total wall, the launcher's recovery line, the
    run's own `recovered:` seconds)."""
    head = [sys.executable]
    if launcher == "torchrun":
        tr = shutil.which("torchrun", path=os.path.dirname(sys.executable))
        assert tr, "torchrun not found next to this Python"
        head = [tr, "--standalone", "--nproc-per-node", "2", "--max-restarts", "1"]
    cmd = [*head, "-m", "hetpar.cli.main", "run", "--model", "tiny-llama", "--plan", plan,
           "--steps", "20", "--checkpoint", ck, "--every", "2"]
    t0 = time.time()
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    assert proc.stderr is not None
    pids: list[int] = []
    killed, restarted, back, note, own = 0.0, False, -1.0, "", "-"
    for line in proc.stderr:
        if "rank pids" in line or line.startswith("hetpar run: forked"):
            pids = [int(p) for p in line.split("pids ")[1].split()]
            restarted = bool(killed)
        if "died" in line and line.startswith("hetpar run:"):
            note = line.strip()[:120]
        if "recovered: step" in line:
            own = line.split(" done ")[1].split(" s ")[0]
        if not killed and line.startswith("step 5:"):
            os.kill(pids[1], signal.SIGKILL)
            killed = time.time()
        elif restarted and back < 0 and line.startswith("step "):
            back = time.time() - killed
    proc.wait()
    assert proc.returncode == 0, f"{launcher} {plan}: exit {proc.returncode}"
    return back, time.time() - t0, note, own


def main() -> None:
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    for launcher, plan in CASES:
        with tempfile.TemporaryDirectory() as d:
            back, total, note, own = measure(launcher, plan, os.path.join(d, "ck"))
        print(f"{launcher:8s} {plan:30s} recovered in {back:5.1f} s (own line {own:>4s} s, "
              f"run {total:5.1f} s)"
              + (f"  [{note}]" if note else ""))


if __name__ == "__main__":
    main()
