"""Bundled catalogs (GPUs, models, clusters, plans, jobs) and loading by name or path."""

from __future__ import annotations

import sys
from functools import lru_cache
from pathlib import Path
from typing import Any, TypeVar

from hetpar.errors import ConfigError
from hetpar.io import from_dict, parse_float, parse_int, read_document
from hetpar.specs.cluster import ClusterSpec, NodeGroup
from hetpar.specs.gpu import GPUSpec
from hetpar.specs.job import Job
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import Plan

ROOT = Path(__file__).parent
KINDS = ("gpus", "models", "clusters", "plans", "jobs")
T = TypeVar("T")


def names(kind: str) -> list[str]:
    """Names of the bundled entries of one kind (file stems)."""
    assert kind in KINDS, kind
    return sorted(p.stem for p in (ROOT / kind).iterdir() if p.suffix in (".toml", ".json"))


def _find(kind: str, ref: str) -> Path:
    """A path if ``ref`` is an existing file, else the catalog entry named ``ref``."""
    p = Path(ref)
    if p.suffix in (".toml", ".json") and p.is_file():
        return p
    for ext in (".toml", ".json"):
        cand = ROOT / kind / f"{ref}{ext}"
        if cand.is_file():
            return cand
    if p.suffix in (".toml", ".json"):
        raise ConfigError(f"{ref}: file not found")
    what = kind[:-1]
    raise ConfigError(f"unknown {what} {ref!r}; known: {', '.join(names(kind))} (or a file path)")


def _load(cls: type[T], kind: str, ref: str) -> T:
    path = _find(kind, ref)
    where = path.name if path.is_relative_to(ROOT) else str(path)
    return from_dict(cls, read_document(path), where)


@lru_cache(maxsize=256)
def load_gpu(ref: str) -> GPUSpec:
    """A GPU type by catalog name (e.g. ``A100-SXM4-80GB``) or file path; a catalog GPU's
    matmul/attention asymptotes are the bundled fit's where it fitted them (its file holds
    the prior), a file path's are its own."""
    gpu = load_gpu_prior(ref)
    if not _find("gpus", ref).is_relative_to(ROOT):
        return gpu
    from hetpar.catalog.gpu_fit import bundled, fitted_gpu

    return fitted_gpu(gpu, bundled())


@lru_cache(maxsize=256)
def load_gpu_prior(ref: str) -> GPUSpec:
    """A GPU type with its file's efficiency tables, before any fit (the fit's prior)."""
    return _load(GPUSpec, "gpus", ref)


def gpu_spec(ref: str | GPUSpec) -> GPUSpec:
    """The GPU a node group names: the value itself, or loaded by catalog name or file path."""
    return ref if isinstance(ref, GPUSpec) else load_gpu(ref)


@lru_cache(maxsize=256)
def load_model(ref: str) -> ModelSpec:
    """A model by catalog name, model file, or Hugging Face ``config.json``."""
    path = _find("models", ref)
    data = read_document(path)
    if path.suffix == ".json" and ("model_type" in data or "architectures" in data):
        from hetpar.hf.convert import model_from_hf_config

        name = path.parent.name if path.stem == "config" else path.stem
        model = model_from_hf_config(data, name=name or path.stem)
        # the training length is hetpar's choice, not the config's: say so once per load
        print(f"hetpar: model {model.name}: {model.source}", file=sys.stderr)
        return model
    return from_dict(ModelSpec, data, path.name)


@lru_cache(maxsize=256)
def load_cluster(ref: str) -> ClusterSpec:
    """A cluster by catalog name, file path, or inline ``key=value,...`` (one node group:
    ``gpu=H100-SXM5-80GB,nodes=2,nic_gbps=400``); every node group's GPU type must be known."""
    if "=" in ref and not Path(ref).is_file():
        cluster = inline_cluster(ref)
    else:
        cluster = _load(ClusterSpec, "clusters", ref)
    for g in cluster.node_groups:
        try:
            gpu_spec(g.gpu)
        except ConfigError as e:
            raise ConfigError(f"cluster {cluster.name!r}: node group {g.name!r}: {e}") from None
    return cluster


def load_job(ref: str) -> Job:
    """A job by catalog name, file path, or inline ``key=value,...`` (``gbs=512,seq_len=4096``)."""
    if "=" in ref and not Path(ref).is_file():
        return from_dict(Job, _inline_pairs(ref, "inline job", JOB_ALIASES), "inline job")
    return _load(Job, "jobs", ref)


def load_plan(ref: str) -> Plan:
    """A plan by catalog name, file path, or inline ``key=value,...`` (``tp=8,pp=2,gbs=64``)."""
    if "=" in ref and not Path(ref).is_file():
        return parse_inline_plan(ref)
    return _load(Plan, "plans", ref)


CLUSTER_ALIASES = {"nodes": "num_nodes", "nic_gbps": "nic_bandwidth_gbps",
                   "scaleup_gbps": "scaleup_bandwidth_gbps", "per_node": "gpus_per_node"}


def inline_cluster(text: str) -> ClusterSpec:
    """One node group from ``gpu=...,nodes=N,gpus_per_node=G,nic_gbps=B`` (any NodeGroup key).

    The quick form for the common case, a number of identical nodes: ``nodes`` defaults to 1,
    ``gpus_per_node`` to 8, the rest to NodeGroup's defaults (NVLink inside a node as the GPU
    file states, one NIC per GPU, a non-blocking network between nodes). Racks, zones and
    links between groups need a cluster file.
    """
    data = _inline_pairs(text, "inline cluster", CLUSTER_ALIASES)
    if "gpu" not in data:
        raise ConfigError(f"inline cluster: missing key 'gpu' in {text!r} (e.g. "
                          f"gpu=H100-SXM5-80GB,nodes=2); known GPUs: {', '.join(names('gpus'))}")
    try:
        group = from_dict(NodeGroup, {"name": "g", "num_nodes": 1, "gpus_per_node": 8, **data},
                          "inline cluster")
    except ConfigError as e:
        short = ", ".join(f"{k}={v}" for k, v in CLUSTER_ALIASES.items())
        raise ConfigError(f"{e} (short forms: {short})") from None
    n = group.num_nodes * group.gpus_per_node
    return ClusterSpec(name=f"{n}x{data['gpu']}", node_groups=(group,),
                       description=f"inline cluster {text!r}: {group.num_nodes} node(s) of "
                                   f"{group.gpus_per_node} {data['gpu']}, non-blocking network")


INLINE_ALIASES = {"mbs": "micro_batch", "gbs": "global_batch", "sp": "sequence_parallel",
                  "v": "vpp", "zero_stage": "zero"}
INLINE_COLLECTIVES = ("algorithm", "protocol", "dp_sync")
"""Inline keys of a plan's ``collectives`` table (``specs/collectives.py``)."""
JOB_ALIASES = {"gbs": "global_batch", "seq": "seq_len"}


def parse_inline_plan(text: str) -> Plan:
    """Parse ``tp=8,pp=4,dp=2,mbs=1,gbs=512,schedule=1f1b`` into a uniform Plan."""
    data = _inline_pairs(text, "inline plan", INLINE_ALIASES)
    nested = {k: data.pop(k) for k in INLINE_COLLECTIVES if k in data}
    if nested:  # algorithm=ring,dp_sync=hierarchical: the plan's [collectives] table
        data["collectives"] = nested
    if "global_batch" not in data:
        raise ConfigError(f"inline plan: missing key 'global_batch' in {text!r}: add gbs=N "
                          "(sequences per iteration)")
    return from_dict(Plan, data, "inline plan")


def _inline_pairs(text: str, what: str, aliases: dict[str, str]) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        if "=" not in item:
            raise ConfigError(f"{what}: {item!r} is not key=value")
        k, v = (s.strip() for s in item.split("=", 1))
        if not k:  # "=2" would otherwise surface as an unrelated missing or unknown key
            raise ConfigError(f"{what}: {item.strip()!r} in {text!r} has an empty key; "
                              "give key=value")
        key = aliases.get(k, k)
        if key in data:  # tp=2,tp=4 (or mbs=1,micro_batch=2): no silent "last one wins"
            raise ConfigError(f"{what}: key {key!r} given twice in {text!r}")
        data[key] = _inline_value(v)
    if not data:
        raise ConfigError(f"{what}: {text!r} gives no key=value")
    return data


def _inline_value(v: str) -> Any:
    low = v.lower()
    if low in ("true", "false"):
        return low == "true"
    for parse in (parse_int, parse_float):  # the one strict parser: "２" and "1_6" stay text
        try:
            return parse(v, "")
        except ConfigError:
            pass
    return v
