"""Plot replay results: throughput over time per policy, with the switches marked."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from hetpar.dynamic.replay import ReplayResult
from hetpar.errors import ConfigError
from hetpar.io import file_mode

FORMATS = (".png", ".svg", ".pdf")


def plot_results(results: list[ReplayResult], path: str) -> None:
    """Write a step plot of tokens/s against hours to ``path`` (format from its extension).

    The file is written to a temporary name and renamed, so it is never half-written.
    """
    out = Path(path)
    if out.suffix not in FORMATS:
        raise ConfigError(
            f"--plot {path}: unknown format {out.suffix!r}; allowed: {', '.join(FORMATS)}")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("--plot needs matplotlib (pip install 'hetpar[plot]')") from None
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for res in results:
        xs, ys = [], []
        for s in res.segments:
            # A segment partly spent switching is drawn at its average rate.
            rate = s.tokens_per_s * s.training_s / max(s.end_s - s.t_s, 1e-9)
            xs += [s.t_s / 3600, s.end_s / 3600]
            ys += [rate, rate]
        (line,) = ax.plot(xs, ys, label=f"{res.policy} ({res.tokens:.3g} tokens)", lw=1.2)
        for sw in res.switches:
            ax.axvline(sw.t_s / 3600, color=line.get_color(), ls=":", lw=0.8)
    ax.set_xlabel("time (h)")
    ax.set_ylabel("tokens/s")
    ax.set_title(f"replay of {results[0].trace}" if results else "replay")
    ax.set_ylim(bottom=0)
    ax.legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    fd, tmp = tempfile.mkstemp(suffix=out.suffix, dir=out.parent if str(out.parent) else ".")
    os.close(fd)
    try:
        fig.savefig(tmp)
        os.chmod(tmp, file_mode())  # mkstemp made it 0600
        os.replace(tmp, out)
    finally:
        plt.close(fig)
        if os.path.exists(tmp):
            os.unlink(tmp)
