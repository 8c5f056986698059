"""Pictures: throughput loss versus failed fraction for every policy, and throughput over time."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from hetpar.errors import ConfigError
from hetpar.failures.montecarlo import MonteCarloResult
from hetpar.failures.policies import POLICIES
from hetpar.failures.sweep import SweepResult
from hetpar.io import file_mode


def _style(policy: str) -> dict[str, str]:
    """One colour per policy in both panels; dashed where it often coincides with another."""
    i = POLICIES.index(policy) if policy in POLICIES else len(POLICIES)
    return {"color": f"C{i}", "linestyle": "--" if policy in ("spare", "checkpoint") else "-"}


def plot(path: str | Path, sweep: SweepResult | None, mc: MonteCarloResult | None) -> None:
    """Write a figure (format from the extension: png, svg, pdf) with one panel per result."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("--plot needs matplotlib; install the 'plot' extra") from None
    p = Path(path)
    if p.suffix.lower() not in (".png", ".svg", ".pdf"):
        raise ConfigError(f"--plot {p}: unknown extension {p.suffix!r}; allowed: .png, .svg, .pdf")
    panels = [x for x in (sweep, mc) if x is not None]
    fig, axes = plt.subplots(1, max(len(panels), 1), figsize=(6.5 * max(len(panels), 1), 4.2),
                             squeeze=False)
    i = 0
    if sweep is not None:
        ax = axes[0][i]
        i += 1
        xs = [100 * f for f in sweep.fractions]
        stopped = [n for n, loss in sweep.loss.items() if min(loss) > 0.999]
        for name, loss in sweep.loss.items():
            if name not in stopped:  # a policy that never runs would flatten the others
                ax.plot(xs, [100 * v for v in loss], marker="o", label=name, **_style(name))
        ax.set_xlabel("failed GPUs (%)")
        ax.set_ylabel("throughput loss (%)")
        title = f"loss vs failed fraction ({sweep.samples} placements each)"
        if stopped:
            title += f"\n{', '.join(stopped)}: 100% (no spares), not drawn"
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if mc is not None:
        ax = axes[0][i]
        days = mc.hours / 24
        for name, r in mc.runs.items():
            label = f"{name} (goodput {r.goodput:.3f})"
            ax.step(days, 100 * r.throughput, where="post", label=label, **_style(name))
        ax.set_xlabel("day")
        ax.set_ylabel("throughput (% of fault-free)")
        ax.set_title("throughput over time")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fd, tmp = tempfile.mkstemp(dir=p.parent if str(p.parent) else ".", suffix=p.suffix)
    os.close(fd)
    try:
        fig.savefig(tmp)
        os.chmod(tmp, file_mode())  # mkstemp made it 0600
        os.replace(tmp, p)
    except BaseException:
        os.unlink(tmp)
        raise
    finally:
        plt.close(fig)
