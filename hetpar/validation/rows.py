"""A runs CSV read strictly, and each row as the model, cluster and plan it ran (blanks listed).

The file itself (columns, reading, cells as numbers) is ``validation/runsfile.py``, re-exported.
"""

from __future__ import annotations

import json
import math

from hetpar import schedules
from hetpar.catalog import load_gpu
from hetpar.errors import ConfigError
from hetpar.sim.profile import resolve
from hetpar.specs.cluster import ClusterSpec, NodeGroup
from hetpar.specs.gpu import PRECISIONS, GPUSpec
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import Plan
from hetpar.validation.runsfile import (
    BUNDLED_RUNS,
    COLUMNS,
    MAX_INT,
    MOE_COLUMNS,
    OPTIONAL_COLUMNS,
    RECOMPUTE_CHOICES,
    check_words,
    int_cell,
    positive_cell,
    read_runs,
    unknown_schedule,
)

__all__ = ["BUNDLED_RUNS", "COLUMNS", "MAX_INT", "MOE_COLUMNS", "OPTIONAL_COLUMNS",
           "RECOMPUTE_CHOICES", "Choice", "check_words", "choices", "cluster_of", "combinations",
           "expert_axes", "model_of", "moe_fields", "plan_of", "read_runs", "schedule_of"]


def model_of(row: dict[str, str]) -> ModelSpec:
    """The model shape of a row; a Llama or an MoE row (``num_experts``) implies SwiGLU,
    RMSNorm, RoPE, no biases (README)."""
    moe = moe_fields(row)
    gated = "llama" in row["model"].lower() or bool(moe)
    return ModelSpec(
        name=f"row-{row['row_id']}", n_layers=int_cell(row, "n_layers"),
        hidden=int_cell(row, "hidden"),
        n_heads=int_cell(row, "n_heads"), n_kv_heads=int_cell(row, "n_kv_heads"),
        ffn_hidden=int_cell(row, "ffn_hidden"), vocab=int_cell(row, "vocab"),
        seq_len=int_cell(row, "seq_len"), mlp="swiglu" if gated else "gelu",
        norm="rmsnorm" if gated else "layernorm", position="rope" if gated else "learned",
        bias=not gated, head_dim=int_cell(row, "head_dim") if row.get("head_dim", "").strip()
        else None, **moe,  # type: ignore[arg-type]
    )


def moe_fields(row: dict[str, str]) -> dict[str, object]:
    """ModelSpec fields of a row's MoE and MLA columns ({} for a dense row); ConfigError for
    a value the columns cannot mean (one line naming the row, column and value)."""
    out: dict[str, object] = {}
    if row.get("attention", "").strip():
        out.update(_mla_fields(row))
    if not row.get("num_experts", "").strip():
        given = [c for c in ("top_k", "expert_hidden", "shared_experts", "moe_layer_freq",
                             "first_dense_layers", "capacity_factor") if row.get(c, "").strip()]
        if given:
            raise ConfigError(f"row {row['row_id']}: {given[0]}={row[given[0]]!r} needs "
                              "num_experts (blank: a dense row)")
        return out
    width = int_cell(row, "expert_hidden", int_cell(row, "ffn_hidden"))
    shared = int_cell(row, "shared_experts", 0)
    out.update(n_experts=int_cell(row, "num_experts"), experts_per_token=int_cell(row, "top_k"),
               moe_ffn_hidden=width, first_dense_layers=int_cell(row, "first_dense_layers", 0))
    if shared:
        out["shared_expert_ffn_hidden"] = shared * width  # DeepSeekMoE: one fused MLP
    if row.get("expert_load_imbalance", "").strip():  # 1.0: the source forced balanced routing
        out["expert_load_imbalance"] = positive_cell(row, "expert_load_imbalance", 1.0)
    if row.get("capacity_factor", "").strip():  # the source dropped tokens (blank: dropless)
        out["expert_capacity_factor"] = positive_cell(row, "capacity_factor", 1.0)
    freq = row.get("moe_layer_freq", "").strip()
    if freq.startswith("["):
        out["moe_layer_pattern"] = _flags(row, freq)
    elif freq:
        out["moe_layer_interval"] = int_cell(row, "moe_layer_freq")
    return out


def _flags(row: dict[str, str], text: str) -> tuple[int, ...]:
    """A moe_layer_freq list: [0,0,1,1,...], one 0/1 flag per layer (Megatron's list form)."""
    try:
        flags = json.loads(text)
    except ValueError:
        flags = None
    if not isinstance(flags, list) or not all(f in (0, 1) and f is not True and f is not False
                                              for f in flags):
        raise ConfigError(f"row {row['row_id']}: moe_layer_freq={text!r} not allowed; allowed: "
                          "an integer k or a list of 0/1 flags such as [0,1,1]")
    return tuple(flags)


def _mla_fields(row: dict[str, str]) -> dict[str, object]:
    kind = _word(row, "attention", ("mla",), "mla")
    out: dict[str, object] = {"attention": kind}
    for c in ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
        out[c] = int_cell(row, c)
    if row.get("q_lora_rank", "").strip():  # blank: queries not compressed (V2-Lite)
        out["q_lora_rank"] = int_cell(row, "q_lora_rank")
    return out


def expert_axes(row: dict[str, str]) -> tuple[tuple[str, int], ...]:
    """The row's ep and etp degrees as plan-scope axes (``Plan.axes``; blank: 1, left out)."""
    return tuple((k, d) for k in ("ep", "etp") if (d := int_cell(row, k, 1)) > 1)


def cluster_of(row: dict[str, str], gpu: GPUSpec | None = None) -> ClusterSpec:
    """One node group of the row's GPUs, every node on a non-blocking network at its NIC rate
    (``gpu``: the row's GPU type with other efficiency tables, e.g. a fit's candidate)."""
    n, per = int_cell(row, "num_gpus"), int_cell(row, "gpus_per_node")
    if n < 1 or per < 1:
        raise ConfigError(f"row {row['row_id']}: num_gpus={n}, gpus_per_node={per} not allowed; "
                          "allowed: both >= 1")
    name = row["gpu"].strip()
    load_gpu(name)
    return ClusterSpec(
        name=f"row-{row['row_id']}",
        node_groups=(NodeGroup(
            name="g", gpu=gpu or name, num_nodes=math.ceil(n / per), gpus_per_node=min(per, n),
            nic_bandwidth_gbps=positive_cell(row, "scaleout_gbps_per_gpu", 200.0),
        ),),
    )


def _word(row: dict[str, str], key: str, allowed: tuple[str, ...], default: str) -> str:
    text = row[key].strip() or default
    if text not in allowed:
        raise ConfigError(
            f"row {row['row_id']}: {key}={text!r} is not allowed; allowed: {', '.join(allowed)}"
        )
    return text


def schedule_of(row: dict[str, str], vpp: int) -> tuple[str, str]:
    """(registered schedule to simulate, note for ``reason``) of a row."""
    named = row.get("schedule", "").strip() or schedules.default_for(vpp)
    near = schedules.stand_in(named)
    if near == named:
        return named, ""
    if near is None:
        raise unknown_schedule(row, named)
    return near, f"schedule {named} simulated as {near} (nearest registered; an upper bound)"


def plan_of(
    row: dict[str, str], *, micro_batch: int, recompute: str, vpp: int | None = None
) -> Plan:
    """The row's plan with the blanks filled by the given choices."""
    vpp = vpp if vpp is not None else int_cell(row, "vpp", 1)
    precision = _word(row, "precision", PRECISIONS, "bf16")
    recompute = _word({**row, "recompute": recompute}, "recompute", RECOMPUTE_CHOICES, "none")
    return Plan(
        name=f"row-{row['row_id']}", tp=int_cell(row, "tp", 1), pp=int_cell(row, "pp", 1),
        dp=int_cell(row, "dp", 1), cp=int_cell(row, "cp", 1), vpp=vpp,
        sequence_parallel=bool(int_cell(row, "sequence_parallel", 0)),
        micro_batch=micro_batch, global_batch=int_cell(row, "gbs"),
        schedule=schedule_of(row, vpp)[0],
        recompute=recompute,  # type: ignore[arg-type]
        zero=int_cell(row, "zero", 0),
        precision=precision,  # type: ignore[arg-type]
        axes=expert_axes(row),
    )


Choice = tuple[int, str, int]
"""(micro-batch, recompute, vpp) filled in for a row's blanks."""


def choices(row: dict[str, str]) -> tuple[list[int], list[str], list[int]]:
    """The micro-batches, recomputes and vpps to try for a row: its value, or where blank
    every allowed one (``predict_row`` keeps the fastest that fits)."""
    per_replica = int_cell(row, "gbs") // max(int_cell(row, "dp", 1), 1)
    vpps = _vpp_choices(row)
    mbs = [int_cell(row, "mbs")] if row["mbs"].strip() else _default_mbs(
        row, per_replica, vpps) or [b for b in range(1, per_replica + 1) if per_replica % b == 0]
    rec = [row["recompute"].strip()] if row["recompute"].strip() else list(RECOMPUTE_CHOICES)
    return mbs, rec, vpps


def _default_mbs(row: dict[str, str], per_replica: int, vpps: list[int]) -> list[int]:
    """A blank mbs on a pipeline whose framework cuts the batch into one micro-batch per
    stage (``pipeline_microbatches = "stages"``): that micro-batch; [] when it has no such
    default, the row names no single chunk count, or the stages do not divide the batch."""
    pp = int_cell(row, "pp", 1)
    profile = resolve(row.get("framework", "").strip() or None)
    if pp == 1 or profile.pipeline_microbatches != "stages" or len(vpps) != 1:
        return []
    stages = pp * vpps[0]
    return [per_replica // stages] if per_replica % stages == 0 else []


def _vpp_choices(row: dict[str, str]) -> list[int]:
    """A blank vpp: 1, unless the row names a looped schedule (``interleaved``: the source
    interleaved without stating the chunk count), then every chunk count per rank that divides
    its (padded) layer count, as Megatron pads uneven splits (runs README: a blank schedule is
    ``1f1b``, or ``interleaved`` when vpp > 1, whatever the framework's habit)."""
    pp = int_cell(row, "pp", 1)
    named = schedules.stand_in(row.get("schedule", "").strip() or schedules.DEFAULT)
    if row["vpp"].strip() or pp == 1 or named is None \
            or schedules.traits(named).chunks == "single":
        return [int_cell(row, "vpp", 1)]
    if schedules.traits(named).chunks == "v":  # one V: two chunks per rank
        return [2]
    per_rank = -(-int_cell(row, "n_layers") // pp)
    return [v for v in range(2, per_rank + 1) if per_rank % v == 0] or [1]


def combinations(row: dict[str, str]) -> list[Choice]:
    """Every (micro-batch, recompute, vpp) to try for a row's blanks; a framework's default
    micro-batch follows the chunk count tried (torchtitan: one per stage, pp x vpp)."""
    mbs, rec, vpps = choices(row)
    return [(b, r, v) for v in vpps
            for b in (mbs if len(vpps) == 1 else choices({**row, "vpp": str(v)})[0])
            for r in rec]
