"""Measure this machine's devices and write a GPU file and a cluster file for `hetpar simulate`.

On CPU each rank is one process with one thread, as `hetpar run` forks them, so a "device" is
one core and its peak is the best single-thread matmul rate measured. On a GPU, `--gpu NAME`
takes the peaks from that catalog entry, so the tables say what fraction of the datasheet
peak this GPU reaches; the report prints the catalog's predicted fraction beside it.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from hetpar.cli import progress
from hetpar.cli.options import check_output, check_writable, float_in, int_in

NAME = "calibrate"
HELP = "measure local matmul/attention/memory/collective speed; write GPU + cluster files"
EXAMPLES = """examples:
  hetpar calibrate --out calib/local.toml        # writes calib/local.toml + calib/local-gpu.toml
  hetpar simulate --model tiny-gpt --cluster calib/local.toml --plan tp=2,gbs=8,precision=fp32
  hetpar calibrate --device cuda --gpu H100-SXM5-80GB --out calib/h100.toml --json
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", metavar="FILE", default="calibration/local.toml",
                   help="cluster file to write; the GPU file goes beside it as <stem>-gpu.toml")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    p.add_argument("--ranks", type=int_in(1, 1024), default=2,
                   help="local ranks for the collective measurement and the cluster size")
    p.add_argument("--gpu", metavar="NAME",
                   help="catalog GPU whose peaks the measured fractions are relative to")
    p.add_argument("--seconds", type=float_in(0, 3600, lo_open=True), default=0.2, metavar="S",
                   help="measuring time per operation size (default 0.2; longer = sustained "
                        "rates, useful on a shared machine)")
    p.add_argument("--quick", action="store_true", help="fewer sizes (for tests)")
    p.add_argument("--json", action="store_true", help="print the measurements as JSON")


def _sizes(device: str, quick: bool) -> dict[str, list[int]]:
    if device.startswith("cuda"):
        return {"mm": [256, 512, 1024, 2048, 4096, 8192], "attn": [256, 512, 1024, 2048, 4096],
                "mem": [2**14, 2**17, 2**20, 2**23, 2**26], "coll": [2**10, 2**16, 2**20, 2**24]}
    if quick:
        return {"mm": [32, 128, 256], "attn": [32, 128], "mem": [2**10, 2**16, 2**20],
                "coll": [2**8, 2**14, 2**18]}
    return {"mm": [32, 64, 128, 256, 512, 768], "attn": [32, 64, 128, 256, 512],
            "mem": [2**10, 2**13, 2**16, 2**19, 2**22], "coll": [2**8, 2**12, 2**16, 2**20]}


def run(args: argparse.Namespace) -> int:
    from hetpar.catalog import load_cluster, load_gpu
    from hetpar.errors import ConfigError

    # every option is checked before minutes of measuring (and before importing torch)
    if args.device.split(":")[0] not in ("cpu", "cuda"):
        raise ConfigError(f"--device {args.device!r} unknown; allowed: cpu, cuda, cuda:N")
    ref = load_gpu(args.gpu) if args.gpu else None
    check_output(args.out, "--out")  # the string: "x.toml/" names a directory
    out = Path(args.out)
    if out.suffix != ".toml":
        raise ConfigError(f"--out {out}: the cluster file must end in .toml")
    check_writable(out.with_name(out.stem + "-gpu.toml"))
    import torch

    from hetpar.runtime import calibrate as cal

    cuda = args.device.startswith("cuda")
    # device_count asks NVML and leaves CUDA uninitialised, so forking ranks stays safe.
    if cuda and torch.cuda.device_count() < 1:
        raise ConfigError(f"--device {args.device}: no CUDA device here; allowed: cpu")
    prec = "bf16" if cuda else "fp32"
    sz = _sizes(args.device, args.quick)
    ranks = min(args.ranks, torch.cuda.device_count()) if cuda else args.ranks
    progress.note(args, f"hetpar calibrate: measuring {args.device} ({prec}) on {ranks} "
                        "rank(s)")
    if cuda:
        # Collectives first (forked ranks), then compute in this process on one GPU.
        m = cal.measure(ranks, args.device, prec, sz, compute=False) if ranks > 1 else {}
        dev = torch.device(args.device)
        m["mm"] = cal.matmul_curve(dev, cal.DTYPES[prec], sz["mm"], args.seconds)
        m["attn"] = cal.attention_curve(dev, cal.DTYPES[prec], sz["attn"], args.seconds)
        m["mem"] = cal.memory_curve(dev, sz["mem"], args.seconds)
    else:
        m = cal.measure(ranks, args.device, prec, sz, budget_s=args.seconds)
    mm, attn, mem, coll = m["mm"], m["attn"], m["mem"], m.get("coll")
    peak = ref.peak_flops(prec) if ref else max(mm.rate)
    mem_peak = ref.memory_bandwidth if ref else max(mem.rate)
    gpu_doc = _gpu_doc(args, prec, peak, mem_peak, mm, attn, mem, coll, ref, ranks)
    gpu_path = out.with_name(out.stem + "-gpu.toml")
    cluster_doc = _cluster_doc(out.stem, gpu_path, ranks, coll)
    _write(gpu_path, gpu_doc)
    _write(out, cluster_doc)
    load_gpu(str(gpu_path))  # the files must load with the strict schema loader
    load_cluster(str(out))
    result = {"gpu_file": str(gpu_path), "cluster_file": str(out), "precision": prec,
              "peak_tflops": peak / 1e12, "matmul": _pairs(mm, peak),
              "attention": _pairs(attn, peak), "memory": _pairs(mem, mem_peak),
              "collective": coll}
    if ref is not None:
        result["catalog_matmul_fraction"] = [[s, ref.matmul_efficiency(s)] for s in mm.size]
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        _print(result)
    return 0


def _pairs(c: Any, peak: float) -> list[list[float]]:
    return [[s, r / peak] for s, r in zip(c.size, c.rate, strict=True)]


def _gpu_doc(args: argparse.Namespace, prec: str, peak: float, mem_peak: float, mm: Any,
             attn: Any, mem: Any, coll: dict[str, Any] | None, ref: Any,
             ranks: int) -> dict[str, Any]:
    from hetpar.net.links import kind_of_link
    from hetpar.runtime.calibrate import host_memory_gib

    if ref is not None:
        peaks = dict(ref.peak_tflops)
        mem_gib, power = ref.memory_gib, ref.power_w
    else:
        peaks = {prec: round(peak / 1e12, 6)}
        mem_gib, power = round(host_memory_gib(ranks), 3), 1.0
    # the written link rate is the one that, at the link kind's achieved share, gives what was
    # measured (the file names the link 'measured all-reduce', priced as kind_of_link reads it)
    eff = kind_of_link("measured all-reduce").efficiency
    link = coll["bandwidth_bytes_s"] * 8 / 1e9 / eff if coll else (
        ref.scaleup_bandwidth_gbps if ref else 1.0)
    return {
        "name": Path(args.out).stem + "-gpu", "vendor": ref.vendor if ref else "local",
        "peak_tflops": peaks, "memory_gib": mem_gib,
        "memory_bandwidth_gbyte_s": round(mem_peak / 1e9, 3),
        "scaleup_bandwidth_gbps": round(link, 4), "scaleup_link": "measured all-reduce",
        "power_w": power,
        "matmul_efficiency": mm.table(peak), "attention_efficiency": attn.table(peak),
        "memory_efficiency": mem.table(mem_peak),
        "sources": [f"hetpar calibrate on {os.uname().nodename} ({args.device}); "
                    + ("power not measured" if ref is None else f"peaks from {ref.name}")],
    }


def _cluster_doc(stem: str, gpu_path: Path, ranks: int,
                 coll: dict[str, Any] | None) -> dict[str, Any]:
    group: dict[str, Any] = {"name": "local", "gpu": str(gpu_path.resolve()), "num_nodes": 1,
                             "gpus_per_node": ranks}
    if coll:
        group["scaleup_latency_us"] = round(coll["latency_s"] * 1e6, 3)
    return {"name": stem, "node_groups": [group],
            "description": "measured by hetpar calibrate"}


def _write(path: Path, doc: dict[str, Any]) -> None:
    from hetpar.io import dump_toml, write_text_atomic

    write_text_atomic(path, dump_toml(doc))


def _print(r: dict[str, Any]) -> None:
    print(f"wrote {r['gpu_file']} and {r['cluster_file']}")
    print(f"peak {r['precision']}: {r['peak_tflops'] * 1e3:.2f} GFLOP/s")
    cat = dict((s, f) for s, f in r.get("catalog_matmul_fraction", []))
    for s, f in r["matmul"]:
        extra = f"   catalog predicts {cat[s]:.3f}" if s in cat else ""
        print(f"  matmul {s:10.3g} FLOP: {f:.3f} of peak{extra}")
    for s, f in r["attention"]:
        print(f"  attention {s:7.3g} FLOP: {f:.3f} of peak")
    for s, f in r["memory"]:
        print(f"  copy {s:12.3g} B: {f:.3f} of best")
    c = r["collective"]
    if c:
        print(f"all-reduce: latency {c['latency_s'] * 1e6:.1f} us/hop, "
              f"bandwidth {c['bandwidth_bytes_s'] / 1e9:.3f} GB/s")
