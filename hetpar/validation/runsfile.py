"""The runs CSV: its columns, strict reading, and a cell as a number (one-line errors)."""

from __future__ import annotations

import csv
import math
from pathlib import Path

from hetpar import schedules
from hetpar.errors import ConfigError
from hetpar.io import check_name, is_number
from hetpar.sim.profile import framework_names

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
    "moe_dispatcher", "ep_overlap", "capacity_factor",
)
"""Per-head width (blank: hidden / n_heads), mixture-of-experts and multi-head-latent-attention
columns, blank for dense rows (the package README beside runs.csv defines them)."""
OPTIONAL_COLUMNS = ("framework", "schedule", *MOE_COLUMNS, "cuda_graphs")
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
    check_name(row["model"], f"row {row['row_id']}: model")  # a label in every report
    fw = row.get("framework", "").strip()
    if fw and fw not in framework_names():
        raise ConfigError(f"row {row['row_id']}: framework={fw!r} is not allowed; "
                          f"allowed: {', '.join(framework_names())} (or blank)")
    sc = row.get("schedule", "").strip()
    if sc and schedules.stand_in(sc) is None:
        raise unknown_schedule(row, sc)


def unknown_schedule(row: dict[str, str], name: str) -> ConfigError:
    """The one-line error for a schedule name the row may not use."""
    return ConfigError(f"row {row['row_id']}: schedule={name!r} is not allowed; "
                       f"allowed: {', '.join(schedules.vocabulary())} (or blank)")


def int_cell(row: dict[str, str], key: str, default: int | None = None) -> int:
    """Cell ``key`` as an integer (``default`` where blank); ConfigError naming the row."""
    text = row[key].strip()
    if not text:
        if default is None:
            raise ConfigError(f"row {row['row_id']}: {key} is blank; a number is required")
        return default
    if not is_number(text):  # float() also reads "\uff12", "1_6", "nan"
        raise ConfigError(f"row {row['row_id']}: {key}={text!r} is not a number")
    value = float(text)
    if not math.isfinite(value) or abs(value) > MAX_INT:
        raise ConfigError(f"row {row['row_id']}: {key}={text!r} not allowed; allowed: integers "
                          f"of at most {MAX_INT:.0e}")
    if value != int(value):
        raise ConfigError(f"row {row['row_id']}: {key}={text!r} is not an integer")
    return int(value)


def positive_cell(row: dict[str, str], key: str, default: float) -> float:
    """Cell ``key`` as a positive number (``default`` where blank); ConfigError otherwise."""
    text = row[key].strip()
    value = default if not text else float(text) if is_number(text) else math.nan
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(f"row {row['row_id']}: {key}={text!r} must be a positive number")
    return value
