"""List the bundled catalogs, or show one model, GPU, cluster, plan or job with derived figures.

Without arguments: every catalog (GPUs, models, clusters, plans, jobs) with a one-line summary.
With a kind: that catalog. With a kind and a name (or a file, or a Hugging Face config.json for
models): the entry in detail; for a model, its parameter count, FLOPs per token (model and
hardware per recompute mode), bytes per layer and activation bytes per layer per sequence.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from hetpar import catalog, feasibility
from hetpar import formulas as F
from hetpar.cli.options import int_in
from hetpar.errors import ConfigError
from hetpar.io import to_dict
from hetpar.specs.cluster import ClusterSpec
from hetpar.specs.gpu import GPUSpec
from hetpar.specs.job import Job
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import Plan

NAME = "describe"
HELP = "list the catalogs, or describe a model, GPU, cluster, plan or job"
EXAMPLES = """examples:
  hetpar describe                                  # every catalog, one line per entry
  hetpar describe models
  hetpar describe model llama3.1-70b --seq-len 8192
  hetpar describe model path/to/config.json --json # a Hugging Face config
  hetpar describe gpu H100-SXM5-80GB
  hetpar describe cluster mixed-a100-h100 --json
"""

KIND_ALIASES = {k[:-1]: k for k in catalog.KINDS} | {k: k for k in catalog.KINDS}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("kind", nargs="?", metavar="KIND",
                   help=f"one of: {', '.join(k[:-1] for k in catalog.KINDS)} (plural lists them)")
    p.add_argument("name", nargs="?", metavar="NAME", help="catalog name or file path")
    p.add_argument("--seq-len", type=int_in(1, 1 << 24), default=None,
                   help="models: sequence length for FLOPs and activations (default: the model's)")
    p.add_argument("--micro-batch", type=int_in(1, 1 << 20), default=None,
                   help="models: sequences per micro-batch for activation bytes (default 1)")
    p.add_argument("--tp", type=int_in(1, 1 << 16), default=None,
                   help="models: tensor-parallel degree for activation bytes (default 1); one "
                        "that does not split the heads, KV heads or MLP evenly is infeasible")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")


def run(args: argparse.Namespace) -> int:
    _warn_unused(args)
    if args.kind is None:
        data: Any = {kind: _summaries(kind) for kind in catalog.KINDS}
        _emit(args, data, _text_catalogs(data))
        return 0
    kind = KIND_ALIASES.get(args.kind)
    if kind is None:
        allowed = ", ".join(sorted(KIND_ALIASES))
        raise ConfigError(f"describe: unknown kind {args.kind!r}; allowed: {allowed}")
    if args.name is None:
        data = {kind: _summaries(kind)}
        _emit(args, data, _text_catalogs(data))
        return 0
    if kind == "models":
        model = catalog.load_model(args.name)
        # the tp_shards rule simulate, run and export apply: no byte counts for a split
        # that cannot exist
        feasibility.tp_shards(model, args.tp or 1).raise_if_failed()
        data = describe_model(model, args.seq_len, args.micro_batch or 1, args.tp or 1)
        _emit(args, data, _text_model(data))
        return 0
    data = DETAIL[kind](args.name)
    _emit(args, data, _text_tree(data))
    return 0


def _warn_unused(args: argparse.Namespace) -> None:
    """--seq-len, --micro-batch and --tp shape one model's figures; elsewhere they do nothing."""
    if args.name is not None and KIND_ALIASES.get(args.kind or "") == "models":
        return
    for opt in ("seq_len", "micro_batch", "tp"):
        if getattr(args, opt) is not None:
            print(f"hetpar: warning: --{opt.replace('_', '-')} {getattr(args, opt)} applies "
                  "only to `describe model NAME`; ignored", file=sys.stderr)


def _emit(args: argparse.Namespace, data: Any, text: str) -> None:
    if args.json:
        json.dump(data, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(text)


# ----------------------------------------------------------------------------- summaries


def _summary_model(m: ModelSpec) -> str:
    moe = f", MoE {m.n_experts}x top-{m.experts_per_token}" if m.n_experts > 1 else ""
    return (f"{_count(F.params(m))} params, {m.n_layers} layers, hidden {m.hidden}, "
            f"{m.n_heads}/{m.n_kv_heads} heads/kv, {m.mlp}{moe}, seq {m.seq_len}")


def _count(n: float) -> str:
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.4g}{suffix}"
    return f"{n:g}"


def _summary_gpu(g: GPUSpec) -> str:
    peak = g.peak_tflops.get("bf16", g.peak_tflops.get("fp16", 0.0))
    return (f"{g.vendor}, {g.memory_gib:g} GiB, {g.memory_bandwidth_gbyte_s:g} GB/s, "
            f"{peak:g} TFLOP/s bf16/fp16, {g.scaleup_link} {g.scaleup_bandwidth_gbps:g} Gb/s")


def _summary_cluster(c: ClusterSpec) -> str:
    groups = ", ".join(f"{g.num_nodes}x{g.gpus_per_node} {g.gpu_name}" for g in c.node_groups)
    tiers = "/".join(t.name for t in c.tiers) or "no tiers"
    return f"{c.num_gpus} GPUs: {groups}; {tiers}"


def _summary_plan(p: Plan) -> str:
    if p.uniform:
        return (f"tp={p.tp} pp={p.pp} dp={p.dp} cp={p.cp} vpp={p.vpp} mbs={p.micro_batch} "
                f"gbs={p.batch} {p.schedule} recompute={p.recompute} zero={p.zero}")
    return f"{len(p.replicas)} explicit replicas, gbs={p.batch} {p.schedule}"


def _summary_job(j: Job) -> str:
    seq = j.seq_len if j.seq_len is not None else "model's"
    return f"gbs={j.global_batch} seq={seq} {j.precision} {j.optimizer}"


LOADERS: dict[str, tuple[Callable[[str], Any], Callable[[Any], str]]] = {
    "gpus": (catalog.load_gpu, _summary_gpu),
    "models": (catalog.load_model, _summary_model),
    "clusters": (catalog.load_cluster, _summary_cluster),
    "plans": (catalog.load_plan, _summary_plan),
    "jobs": (catalog.load_job, _summary_job),
}


def _summaries(kind: str) -> dict[str, str]:
    load, summary = LOADERS[kind]
    out = {}
    for name in catalog.names(kind):
        try:
            out[name] = summary(load(name))
        except ConfigError as e:  # a broken bundled file shows up, it does not hide the rest
            out[name] = f"ERROR: {e}"
    return out


def _text_catalogs(data: dict[str, dict[str, str]]) -> str:
    lines = []
    for kind, entries in data.items():
        lines.append(f"{kind} ({len(entries)}):")
        width = max((len(n) for n in entries), default=0)
        lines.extend(f"  {n:<{width}}  {s}" for n, s in entries.items())
        if not entries:
            lines.append("  (none bundled)")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- details


def describe_model(m: ModelSpec, seq_len: int | None, micro_batch: int, tp: int) -> dict[str, Any]:
    """A model's spec plus derived figures (params, FLOPs per token, bytes per layer)."""
    s = seq_len or m.seq_len
    i = F.first_moe_layer(m)  # per-layer figures of an MoE layer (DeepSeek-V3: layer 3)
    hw = {r: F.hardware_flops_per_token(m, s, r) for r in F.RECOMPUTE_MODES}
    acts: dict[str, float] = {
        r: F.activation_bytes_per_layer(m, s, micro_batch, tp=tp, recompute=r, index=i)
        for r in F.RECOMPUTE_MODES}
    acts["flash_no_dropout"] = F.activation_bytes_per_layer(
        m, s, micro_batch, tp=tp, dropout=False, flash_attention=True, index=i
    )
    derived: dict[str, Any] = {
        "params": F.params(m),
        "active_params": F.active_params(m),
        "embedding_params": F.embedding_params(m),
        "layer_params": F.layer_params(m, i),
        "bytes_per_layer_bf16": F.bytes_per_layer(m, 2, i),
        "param_bytes_bf16": F.param_bytes(m, 2),
        "seq_len": s,
        "model_flops_per_token": F.model_flops_per_token(m, s),
        "six_n_flops_per_token": 6.0 * F.active_params(m),
        "hardware_flops_per_token": hw,
        "activation_bytes_per_layer": {"micro_batch": micro_batch, "tp": tp, **acts},
        "head_activation_bytes": F.head_activation_bytes(m, s, micro_batch, tp=tp),
    }
    return {"model": to_dict(m), "derived": derived}


def _si(x: float, unit: str) -> str:
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.4g} {prefix}{unit}"
    return f"{x:.4g} {unit}"


def _gib(x: float) -> str:
    return f"{x / 2**30:.4g} GiB" if x >= 2**30 else f"{x / 2**20:.4g} MiB"


def _text_model(data: dict[str, Any]) -> str:
    m, d = data["model"], data["derived"]
    a = d["activation_bytes_per_layer"]
    lines = [f"model {m['name']}" + (f"  ({m['source']})" if m.get("source") else "")]
    lines += [f"  {k}: {v}" for k, v in m.items() if k not in ("name", "source")]
    lines += [
        "derived:",
        f"  params               {d['params']:,} ({_si(d['params'], '')})",
        f"  active params        {d['active_params']:,}",
        f"  embedding params     {d['embedding_params']:,}",
        f"  params per layer     {d['layer_params']:,} ({_gib(d['bytes_per_layer_bf16'])} bf16)",
        f"  all params, bf16     {_gib(d['param_bytes_bf16'])}",
        f"  FLOPs/token at seq {d['seq_len']}:",
        f"    model (MFU):         {_si(d['model_flops_per_token'], 'FLOP')}"
        f"  (6N = {_si(d['six_n_flops_per_token'], 'FLOP')})",
    ]
    lines += [f"    hardware, {r + ':':<10} {_si(v, 'FLOP')}"
              for r, v in d["hardware_flops_per_token"].items()]
    lines.append(f"  activation bytes per layer (micro-batch {a['micro_batch']}, tp {a['tp']}):")
    lines += [f"    {r:<18} {_gib(a[r])}" for r in (*F.RECOMPUTE_MODES, "flash_no_dropout")]
    lines.append(f"  head activation bytes  {_gib(d['head_activation_bytes'])}")
    return "\n".join(lines) + "\n"


def _detail_gpu(ref: str) -> dict[str, Any]:
    g = catalog.load_gpu(ref)
    sizes = (1e8, 1e10, 1e12)
    eff = {t: {f"{s:.0e}": getattr(g, t)(s) for s in sizes}
           for t in ("matmul_efficiency", "attention_efficiency", "memory_efficiency")}
    return {"gpu": to_dict(g), "efficiency_at": eff}


def _detail_cluster(ref: str) -> dict[str, Any]:
    c = catalog.load_cluster(ref)
    groups = []
    for g in c.node_groups:
        gpu = catalog.gpu_spec(g.gpu)
        groups.append({
            "name": g.name, "gpu": gpu.name, "gpus": g.num_gpus, "nodes": g.num_nodes,
            "gpus_per_node": g.gpus_per_node, "scaleup_domain": g.domain_size,
            "scaleup_bandwidth_gbps": g.scaleup_bandwidth_gbps or gpu.scaleup_bandwidth_gbps,
            "nic_bandwidth_gbps": g.nic_bandwidth_gbps, "zone": g.zone,
            "memory_gib_total": gpu.memory_gib * g.num_gpus,
            "peak_pflops_bf16_total": gpu.peak_tflops.get("bf16", 0.0) * g.num_gpus / 1e3,
        })
    return {"cluster": c.name, "description": c.description, "num_gpus": c.num_gpus,
            "node_groups": groups, "tiers": [to_dict(t) for t in c.tiers],
            "links": [to_dict(x) for x in c.links]}


def _detail_plan(ref: str) -> dict[str, Any]:
    p = catalog.load_plan(ref)
    return {"plan": to_dict(p), "num_gpus": p.num_gpus(), "summary": _summary_plan(p)}


def _detail_job(ref: str) -> dict[str, Any]:
    return {"job": to_dict(catalog.load_job(ref))}


DETAIL: dict[str, Callable[[str], dict[str, Any]]] = {
    "gpus": _detail_gpu, "clusters": _detail_cluster, "plans": _detail_plan, "jobs": _detail_job,
}


def _text_tree(data: Any, indent: int = 0) -> str:
    pad = "  " * indent
    lines = []
    for k, v in data.items():
        if isinstance(v, dict):
            lines.append(f"{pad}{k}:")
            lines.append(_text_tree(v, indent + 1).rstrip("\n"))
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            lines.append(f"{pad}{k}:")
            for x in v:  # "- first: ..." then the other keys aligned under it
                body = _text_tree(x, indent + 2).rstrip("\n")
                lines.append(f"{pad}  - " + body[len(pad) + 4:])
        else:
            shown = f"{v:.4g}" if isinstance(v, float) else v
            lines.append(f"{pad}{k}: {shown}")
    return "\n".join(line for line in lines if line) + "\n"
