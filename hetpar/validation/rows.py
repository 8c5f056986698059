"""A runs CSV read strictly, and each row as the model, cluster and plan it ran (blanks listed)."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

from hetpar import schedules
from hetpar.catalog import load_gpu
from hetpar.errors import ConfigError
from hetpar.sim.profile import framework_names, resolve
from hetpar.specs.cluster import ClusterSpec, NodeGroup
from hetpar.specs.gpu import PRECISIONS, GPUSpec
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import Plan

COLUMNS = (
    "row_id", "source", "source_url", "tier", "model", "n_layers", "hidden", "n_heads",
    "n_kv_heads", "ffn_hidden", "vocab", "seq_len", "gpu", "num_gpus", "gpus_per_node",
    "scaleout_gbps_per_gpu", "tp", "pp", "dp", "cp", "vpp", "sequence_parallel", "mbs", "gbs",
    "precision", "recompute", "zero", "measured_tokens_per_s_per_gpu", "measured_from", "notes",
)
MOE_COLUMNS = (
    "head_dim", "num_experts", "top_k", "ep", "etp", "expert_hidden", "shared_experts",
    "moe_layer_freq", "first_dense_layers", "attention", "q_lora_rank", "kv_lora_rank",
    "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "expert_load_imbalance",
    "moe_dispatcher", "ep_overlap",
)
"""Per-head width (blank: hidden / n_heads), mixture-of-experts and multi-head-latent-attention
columns, blank for dense rows (the package README beside runs.csv defines them)."""
OPTIONAL_COLUMNS = ("framework", "schedule", *MOE_COLUMNS)
"""Columns a runs file may leave out (then every row's value is blank)."""
RECOMPUTE_CHOICES = ("none", "selective", "full")
BUNDLED_RUNS = Path(__file__).resolve().parents[1] / "catalog" / "validation" / "runs.csv"
"""The development set (396 published runs; its README and sources beside it), shipped with the
package."""
MAX_INT = 1e9
"""Largest count a row may give (layers, GPUs, batch): beyond it a typo, not a training run."""


def read_runs(path: str | Path) -> list[dict[str, str]]:
    """Rows of a runs CSV; ConfigError unless its columns are exactly ``COLUMNS``."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: file not found")
    try:
        return _read_rows(p)
    except (csv.Error, UnicodeDecodeError) as e:  # a NUL byte, a huge field, not UTF-8
        raise ConfigError(f"{p}: not a readable CSV: {e}") from None


def _read_rows(p: Path) -> list[dict[str, str]]:
    with p.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        cols = tuple(reader.fieldnames or ())
        if not cols:
            raise ConfigError(f"{p}: empty file; expected a header row of the columns "
                              f"{', '.join(COLUMNS)} and at least one run")
        missing = [c for c in COLUMNS if c not in cols]
        extra = [c for c in cols if c not in COLUMNS + OPTIONAL_COLUMNS]
        if missing or extra:
            what = f"missing column {missing[0]!r}" if missing else f"unknown column {extra[0]!r}"
            raise ConfigError(f"{p}: {what}; expected columns: {', '.join(COLUMNS)} "
                              f"(optional: {', '.join(OPTIONAL_COLUMNS)})")
        rows = []
        seen: dict[str, int] = {}  # row_id -> line: results are reported and joined by it
        for row in reader:
            if None in row or None in row.values():  # too many or too few cells
                raise ConfigError(f"{p}: line {reader.line_num}: {len(row) - (None in row)} "
                                  f"cells where the header has {len(cols)} (a stray quote?)")
            rid = row["row_id"].strip()
            if rid in seen:
                raise ConfigError(f"{p}: row_id {rid!r} on line {seen[rid]} and line "
                                  f"{reader.line_num}; row ids must be unique")
            seen[rid] = reader.line_num
            rows.append({**dict.fromkeys(OPTIONAL_COLUMNS, ""), **row})
    if not rows:  # an MAPE over no rows is no result, not a pass
        raise ConfigError(f"{p}: no runs (a header row and no data rows); "
                          "expected at least one row")
    for row in rows:
        check_words(row)
    return rows


def check_words(row: dict[str, str]) -> None:
    """ConfigError (one line, allowed values) for an unknown framework or schedule."""
    fw = row.get("framework", "").strip()
    if fw and fw not in framework_names():
        raise ConfigError(f"row {row['row_id']}: framework={fw!r} is not allowed; "
                          f"allowed: {', '.join(framework_names())} (or blank)")
    sc = row.get("schedule", "").strip()
    if sc and schedules.stand_in(sc) is None:
        raise _unknown_schedule(row, sc)


def _unknown_schedule(row: dict[str, str], name: str) -> ConfigError:
    return ConfigError(f"row {row['row_id']}: schedule={name!r} is not allowed; "
                       f"allowed: {', '.join(schedules.vocabulary())} (or blank)")


def _int(row: dict[str, str], key: str, default: int | None = None) -> int:
    text = row[key].strip()
    if not text:
        if default is None:
            raise ConfigError(f"row {row['row_id']}: {key} is blank; a number is required")
        return default
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"row {row['row_id']}: {key}={text!r} is not a number") from None
    if not math.isfinite(value) or abs(value) > MAX_INT:
        raise ConfigError(f"row {row['row_id']}: {key}={text!r} not allowed; allowed: integers "
                          f"of at most {MAX_INT:.0e}")
    if value != int(value):
        raise ConfigError(f"row {row['row_id']}: {key}={text!r} is not an integer")
    return int(value)


def _positive(row: dict[str, str], key: str, default: float) -> float:
    text = row[key].strip()
    try:
        value = float(text) if text else default
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(f"row {row['row_id']}: {key}={text!r} must be a positive number")
    return value


def model_of(row: dict[str, str]) -> ModelSpec:
    """The model shape of a row; a Llama or an MoE row (``num_experts``) implies SwiGLU,
    RMSNorm, RoPE, no biases (README)."""
    moe = moe_fields(row)
    gated = "llama" in row["model"].lower() or bool(moe)
    return ModelSpec(
        name=f"row-{row['row_id']}", n_layers=_int(row, "n_layers"), hidden=_int(row, "hidden"),
        n_heads=_int(row, "n_heads"), n_kv_heads=_int(row, "n_kv_heads"),
        ffn_hidden=_int(row, "ffn_hidden"), vocab=_int(row, "vocab"),
        seq_len=_int(row, "seq_len"), mlp="swiglu" if gated else "gelu",
        norm="rmsnorm" if gated else "layernorm", position="rope" if gated else "learned",
        bias=not gated, head_dim=_int(row, "head_dim") if row.get("head_dim", "").strip()
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
                             "first_dense_layers") if row.get(c, "").strip()]
        if given:
            raise ConfigError(f"row {row['row_id']}: {given[0]}={row[given[0]]!r} needs "
                              "num_experts (blank: a dense row)")
        return out
    width = _int(row, "expert_hidden", _int(row, "ffn_hidden"))
    shared = _int(row, "shared_experts", 0)
    out.update(n_experts=_int(row, "num_experts"), experts_per_token=_int(row, "top_k"),
               moe_ffn_hidden=width, first_dense_layers=_int(row, "first_dense_layers", 0))
    if shared:
        out["shared_expert_ffn_hidden"] = shared * width  # DeepSeekMoE: one fused MLP
    if row.get("expert_load_imbalance", "").strip():  # 1.0: the source forced balanced routing
        out["expert_load_imbalance"] = _positive(row, "expert_load_imbalance", 1.0)
    freq = row.get("moe_layer_freq", "").strip()
    if freq.startswith("["):
        out["moe_layer_pattern"] = _flags(row, freq)
    elif freq:
        out["moe_layer_interval"] = _int(row, "moe_layer_freq")
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
        out[c] = _int(row, c)
    if row.get("q_lora_rank", "").strip():  # blank: queries not compressed (V2-Lite)
        out["q_lora_rank"] = _int(row, "q_lora_rank")
    return out


def expert_axes(row: dict[str, str]) -> tuple[tuple[str, int], ...]:
    """The row's ep and etp degrees as plan-scope axes (``Plan.axes``; blank: 1, left out)."""
    return tuple((k, d) for k in ("ep", "etp") if (d := _int(row, k, 1)) > 1)


def cluster_of(row: dict[str, str], gpu: GPUSpec | None = None) -> ClusterSpec:
    """One node group of the row's GPUs, every node on a non-blocking network at its NIC rate
    (``gpu``: the row's GPU type with other efficiency tables, e.g. a fit's candidate)."""
    n, per = _int(row, "num_gpus"), _int(row, "gpus_per_node")
    if n < 1 or per < 1:
        raise ConfigError(f"row {row['row_id']}: num_gpus={n}, gpus_per_node={per} not allowed; "
                          "allowed: both >= 1")
    name = row["gpu"].strip()
    load_gpu(name)
    return ClusterSpec(
        name=f"row-{row['row_id']}",
        node_groups=(NodeGroup(
            name="g", gpu=gpu or name, num_nodes=math.ceil(n / per), gpus_per_node=min(per, n),
            nic_bandwidth_gbps=_positive(row, "scaleout_gbps_per_gpu", 200.0),
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
        raise _unknown_schedule(row, named)
    return near, f"schedule {named} simulated as {near} (nearest registered; an upper bound)"


def plan_of(
    row: dict[str, str], *, micro_batch: int, recompute: str, vpp: int | None = None
) -> Plan:
    """The row's plan with the blanks filled by the given choices."""
    vpp = vpp if vpp is not None else _int(row, "vpp", 1)
    precision = _word(row, "precision", PRECISIONS, "bf16")
    recompute = _word({**row, "recompute": recompute}, "recompute", RECOMPUTE_CHOICES, "none")
    return Plan(
        name=f"row-{row['row_id']}", tp=_int(row, "tp", 1), pp=_int(row, "pp", 1),
        dp=_int(row, "dp", 1), cp=_int(row, "cp", 1), vpp=vpp,
        sequence_parallel=bool(_int(row, "sequence_parallel", 0)),
        micro_batch=micro_batch, global_batch=_int(row, "gbs"),
        schedule=schedule_of(row, vpp)[0],
        recompute=recompute,  # type: ignore[arg-type]
        zero=_int(row, "zero", 0),
        precision=precision,  # type: ignore[arg-type]
        axes=expert_axes(row),
    )


Choice = tuple[int, str, int]
"""(micro-batch, recompute, vpp) filled in for a row's blanks."""


def choices(row: dict[str, str]) -> tuple[list[int], list[str], list[int]]:
    """The micro-batches, recomputes and vpps to try for a row: its value, or where blank
    every allowed one (``predict_row`` keeps the fastest that fits)."""
    per_replica = _int(row, "gbs") // max(_int(row, "dp", 1), 1)
    vpps = _vpp_choices(row)
    mbs = [_int(row, "mbs")] if row["mbs"].strip() else _default_mbs(row, per_replica, vpps) or [
        b for b in range(1, per_replica + 1) if per_replica % b == 0
    ]
    rec = [row["recompute"].strip()] if row["recompute"].strip() else list(RECOMPUTE_CHOICES)
    return mbs, rec, vpps


def _default_mbs(row: dict[str, str], per_replica: int, vpps: list[int]) -> list[int]:
    """A blank mbs on a pipeline whose framework cuts the batch into one micro-batch per
    stage (``pipeline_microbatches = "stages"``): that micro-batch; [] when it has no such
    default, the row names no single chunk count, or the stages do not divide the batch."""
    pp = _int(row, "pp", 1)
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
    pp = _int(row, "pp", 1)
    named = schedules.stand_in(row.get("schedule", "").strip() or schedules.DEFAULT)
    if row["vpp"].strip() or pp == 1 or named is None \
            or schedules.traits(named).chunks == "single":
        return [_int(row, "vpp", 1)]
    if schedules.traits(named).chunks == "v":  # one V: two chunks per rank
        return [2]
    per_rank = -(-_int(row, "n_layers") // pp)
    return [v for v in range(2, per_rank + 1) if per_rank % v == 0] or [1]


def combinations(row: dict[str, str]) -> list[Choice]:
    """Every (micro-batch, recompute, vpp) to try for a row's blanks; a framework's default
    micro-batch follows the chunk count tried (torchtitan: one per stage, pp x vpp)."""
    mbs, rec, vpps = choices(row)
    return [(b, r, v) for v in vpps
            for b in (mbs if len(vpps) == 1 else choices({**row, "vpp": str(v)})[0])
            for r in rec]
