"""Regenerate the bundled traces in hetpar/catalog/traces (deterministic, seeded).

Each trace's shape (what changes, by how much, for how long) follows the measurement
studies named in its header; the exact times and values are drawn here from a fixed seed
so that anyone can regenerate the files byte for byte:

    .venv/bin/python bench/replay_make_traces.py
"""

from __future__ import annotations

import random
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "hetpar" / "catalog" / "traces"
COLUMNS = "t_s,kind,target,value,node,nodes"


def write(name: str, header: dict[str, str | float], sources: list[str], comments: list[str],
          rows: list[tuple[float, str, str, str, str, str]]) -> None:
    lines = [f"# {c}" for c in comments]
    lines += [f"# {k}: {v}" for k, v in header.items()]
    lines += [f"# source: {s}" for s in sources]
    lines.append(COLUMNS)
    for t, kind, target, value, node, nodes in sorted(rows, key=lambda r: r[0]):
        lines.append(f"{t:g},{kind},{target},{value},{node},{nodes}")
    (OUT / f"{name}.csv").write_text("\n".join(lines) + "\n")
    print(f"wrote {name}.csv ({len(rows)} events)")


def interzone(rng: random.Random) -> None:
    """Stationary wobble every 10 min plus rare deep excursions (the TOIT'17 decomposition)."""
    horizon = 12 * 3600
    link = "link:zone-a/zone-b"
    dips = [(2.0 * 3600, 50 * 60, 0.08), (6.5 * 3600, 90 * 60, 0.05), (10.0 * 3600, 25 * 60, 0.3)]
    rows = []
    t = 0.0
    while t < horizon:
        in_dip = [d for d in dips if d[0] <= t < d[0] + d[1]]
        if not in_dip:
            rows.append((t, "factor", link, f"{rng.uniform(0.75, 1.25):.3f}", "", ""))
        t += 600
    for start, dur, f in dips:
        rows.append((start, "factor", link, f"{f}", "", ""))
        rows.append((start + dur, "factor", link, f"{rng.uniform(0.75, 1.25):.3f}", "", ""))
    write("interzone-fluctuation", {
        "name": "interzone-fluctuation",
        "description": "cloud inter-zone bandwidth: +-25% wobble every 10 min and three deep "
                       "excursions (to 8%, 5% and 30% of nominal for 50, 90 and 25 min)",
        "cluster": "two-zone-a100", "horizon_s": horizon, "restart_s": 60,
        "storage_bandwidth_gbyte_s": 20,
    }, [
        "Garcia-Dorado and Aracil, Bandwidth Measurements within the Cloud, ACM TOIT 17(4) 2017 "
        "(arXiv:1512.01129): inter-data-center bandwidth = a stationary component plus "
        "infrequent excursions (typically downtimes)",
    ], ["Inter-zone link of two-zone-a100; values are factors of its 12.5 Gb/s per GPU."], rows)


def spine(rng: random.Random) -> None:
    """A spine that loses capacity in two steps, stays degraded for hours, then is repaired."""
    horizon = 8 * 3600
    rows = [(1.5 * 3600, "factor", "tier:spine", "0.5", "", ""),
            (1.5 * 3600 + 420, "factor", "tier:spine", "0.15", "", ""),
            (4.75 * 3600, "factor", "tier:spine", "1", "", "")]
    write("spine-degraded", {
        "name": "spine-degraded",
        "description": "hetero-1024's spine drops to 50% (a failed uplink), 7 min later to 15% "
                       "(more failed links and ECMP collisions on the rest) for ~3 h, then is "
                       "repaired",
        "cluster": "hetero-1024", "horizon_s": horizon, "restart_s": 90,
        "storage_bandwidth_gbyte_s": 40,
    }, [
        "Qian et al., Alibaba HPN, SIGCOMM 2024: LLM traffic is few bursty elephant flows, so "
        "ECMP hash polarization concentrates load on some links and a single link or ToR "
        "failure hurts the whole job",
        "Wu et al., Falcon (arXiv:2410.12588): fail-slows in a 10,000-GPU production cluster "
        "come from computation and cross-node networking and last from tens of seconds to "
        "nearly ten hours",
    ], ["Factors of the spine tier's 400 Gb/s (2:1 oversubscribed) per GPU."], rows)


def spot(rng: random.Random) -> None:
    """Spot A100 nodes preempted in bursts and returned tens of minutes later."""
    horizon = 24 * 3600
    rows = []
    t = 1800.0
    while True:
        t += rng.expovariate(1 / (2.5 * 3600))
        if t >= horizon - 3600:
            break
        k = rng.choice([1, 2, 2, 4])
        back = t + rng.uniform(20 * 60, 90 * 60)
        if back >= horizon:
            continue
        rows.append((round(t), "leave", "group:a100", "", "", str(k)))
        rows.append((round(back), "join", "group:a100", "", "", str(k)))
        t = back
    write("spot-preemptions", {
        "name": "spot-preemptions",
        "description": "mixed-a100-h100 whose A100 nodes are spot: bursts of 1-4 node "
                       "preemptions every ~2.5 h, capacity back after 20-90 min",
        "cluster": "mixed-a100-h100", "horizon_s": horizon, "restart_s": 60,
        "storage_bandwidth_gbyte_s": 20,
    }, [
        "Wu et al., Can't Be Late, NSDI 2024 (skypilot-org/spot-traces): multi-node spot GPU "
        "availability sampled every 5 min drops by several nodes at once and recovers after "
        "tens of minutes to hours",
        "Parcae (Duan et al., NSDI 2024) and Bamboo (Thorpe et al., NSDI 2023) train on "
        "preemption traces of this shape; AWS gives a 2-minute notice (not used here)",
    ], ["Preemption gaps are exponential (mean 2.5 h); nodes leave from the end of the group."],
        rows)


def straggler(rng: random.Random) -> None:
    """One node throttles to half speed for hours; later another to 1.5x for 40 minutes."""
    horizon = 8 * 3600
    rows = [(3600, "slowdown", "group:h100", "2", "37", ""),
            (4 * 3600, "slowdown", "group:h100", "1", "37", ""),
            (5 * 3600, "slowdown", "group:h100", "1.5", "90", ""),
            (5 * 3600 + 2400, "slowdown", "group:h100", "1", "90", "")]
    write("straggler-node", {
        "name": "straggler-node",
        "description": "h100-pod-400g: node 37 runs at half speed for 3 h (thermal/power "
                       "throttling), node 90 at 1/1.5 speed for 40 min",
        "cluster": "h100-pod-400g", "horizon_s": horizon, "restart_s": 60,
        "storage_bandwidth_gbyte_s": 40,
    }, [
        "Wu et al., Falcon (arXiv:2410.12588): fail-slow GPUs last tens of seconds to ~10 h and "
        "stretched average job completion time by 1.34x",
        "Lin et al., Understanding Stragglers in Large Model Training Using What-if Analysis "
        "(ByteDance, arXiv:2505.05713): stragglers are persistent and often one worker",
    ], ["slowdown value = time multiplier of the node's GPUs (2 = half speed)."], rows)


def flapping(rng: random.Random) -> None:
    """The inter-zone link flaps between nominal and 5% every 4 s for 90 min, then holds."""
    horizon = 5 * 3600
    rows = []
    start, stop = 3600, 3600 + 90 * 60
    t, low = start, True
    while t < stop:
        rows.append((t, "factor", "link:zone-a/zone-b", "0.05" if low else "1", "", ""))
        low, t = not low, t + 4
    rows.append((stop, "factor", "link:zone-a/zone-b", "1", "", ""))
    write("flapping-link", {
        "name": "flapping-link",
        "description": "two-zone-a100's inter-zone link alternates between nominal and 5% every "
                       "4 s for 90 minutes (a flapping port until it is repaired), then holds",
        "cluster": "two-zone-a100", "horizon_s": horizon, "restart_s": 60,
        "storage_bandwidth_gbyte_s": 20,
    }, [
        "Qian et al., Alibaba HPN, SIGCOMM 2024: synchronous LLM training is sensitive to "
        "single link failures; link flapping is a standard switch port health alarm",
        "Gill, Jain and Nagappan, Understanding Network Failures in Data Centers, SIGCOMM 2011: "
        "link failures are frequent and many are short-lived",
    ], ["Period (4 s), depth (5%) and episode length (90 min) are assumptions, not measured;",
        "docs/dynamic.md also reports a 20-minute episode."], rows)


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for i, make in enumerate((interzone, spine, spot, straggler, flapping)):
        make(random.Random(1000 + i))


if __name__ == "__main__":
    main()
