"""The simulator against the bundled development set of published runs (issue targets).

hetpar/catalog/validation/runs.csv is a copy of ../shared/validation/runs.csv, shipped so that
`hetpar validate` and these tests work on a fresh clone; CI checks the copy is current.
"""

import csv
import os
from pathlib import Path

import pytest

from hetpar import formulas as F
from hetpar.errors import ConfigError
from hetpar.validation.predict import mape, predict_row, validate
from hetpar.validation.rows import BUNDLED_RUNS, COLUMNS, read_runs

RUNS = BUNDLED_RUNS
SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "validation"

# Rows beyond 35% that the physics cannot explain without fitting them one by one; each is
# named with the reason, and the suite fails if any other row goes beyond 35%.
KNOWN_OUTLIERS: dict[int, str] = {
    119: "vTrain 3.6B tp8 mbs64: half the per-GPU rate of the same layout at mbs 2-32 "
         "(rows 120-128); nothing in the plan changes but the micro-batch",
    145: "vTrain 39B tp2/pp8/mbs2: 1.6x slower per GPU than tp4/pp4 and tp4/pp8 with the same "
         "per-GPU work (rows 146, 150)",
    147: "vTrain 39B tp2/pp16/mbs2: 1.6x slower per GPU than tp4/pp16 (row 153)",
    154: "vTrain 39B tp2/pp16/mbs3: 2x slower per pipeline slot than its tp4/pp8 and tp4/pp16 "
         "neighbours (rows 152, 162) with the same per-GPU work",
    35: "Llama 3 405B at 128K: attention is most of its work, and the H100's attention "
        "asymptote is its FlashAttention-2 prior 0.33 (the fit does not move it): predicted "
        "36% slow (31% at the former hand value 0.38)",
    77: "torchtitan 405B FP8 on the 500 W H100, interleaved at 512 GPUs: predicted 47% fast; "
        "that part's GEMM asymptote (0.65 fitted) is held toward its H100 prior 0.80 by two "
        "sources' rows, where the former hand value 0.50 was set on these very rows",
    225: "Sailor OPT-350M, one 2,048-token sequence through tp4: a 74 ms iteration, of which "
         "the 396-row fit's per-iteration overhead (28 ms, set by the runs with many "
         "micro-batches) is a third; predicted 35% slow",
}


@pytest.fixture(scope="module")
def rows():
    return read_runs(RUNS)


@pytest.fixture(scope="module")
def results(rows):
    return validate(rows)


def test_bundled_set_is_the_shared_one():
    # CI has ../shared beside the clone: the shipped copy must not go stale
    if not SHARED.is_dir():
        if os.environ.get("CI"):
            raise AssertionError(f"{SHARED} missing in CI")
        pytest.skip(f"{SHARED} is not beside this checkout (CI has it)")
    for name in ("runs.csv", "sources-1001-2568.md"):
        assert (RUNS.parent / name).read_bytes() == (SHARED / name).read_bytes(), name
    # the package's README is the shared one with hetpar's own sections after it (the MoE
    # columns of moe-runs.csv): the shared text must be there whole, first
    shipped, shared = (RUNS.parent / "README.md").read_bytes(), (SHARED / "README.md").read_bytes()
    assert shipped.startswith(shared), "README.md: the shared text is not its first part"


def test_every_row_is_predicted(results):
    assert len(results) == 396
    assert [r.row_id for r in results if r.status not in ("ok", "oom")] == []


def test_mean_absolute_percentage_error(results):
    # issue 33's target on the 396 rows (6.84% with the GPU asymptotes in the fit)
    assert mape(results) <= 7.0


def test_no_row_is_predicted_out_of_memory(results):
    # every run in the file ran, so none may be judged OOM (issue 33). Row 33 (Llama 3 405B,
    # 8K, tp8 pp16, 8 chunks, 32 micro-batches) was, at 88.0 of 85.5 GB, while an uncited 5%
    # fragmentation term stood; the memory outside the tensors is now framework data
    # (catalog/frameworks/*.toml) and it holds 83.9 GB
    oom = [r.row_id for r in results if r.oom or "out-of-memory" in r.reason]
    assert oom == []
    assert all(r.status == "ok" for r in results)


def test_no_row_worse_than_thirty_five_percent(results):
    bad = {r.row_id: round(r.error_pct, 1) for r in results if abs(r.error_pct) > 35}
    assert set(bad) <= set(KNOWN_OUTLIERS), bad


def test_known_outliers_are_still_outliers(results):
    # if physics improves and an outlier comes within 35%, drop it from the list
    err = {r.row_id: abs(r.error_pct) for r in results}
    assert [i for i in KNOWN_OUTLIERS if err[i] <= 35] == []


def test_pairwise_order(rows, results):
    from hetpar.ranking import pairwise_order

    right, pairs = pairwise_order(rows, results)
    # issue 33 asks for 90% with ties wrong; not reached (85.3% of 1,643 pairs, README), so
    # the bound catches a regression instead
    assert pairs > 1600 and right / pairs >= 0.83


def test_pairwise_order_of_the_zero_bubble_jobs_across_their_schedules(rows, results):
    # issue 33's target: 90% on the Zero Bubble jobs (1F1B, ZB-1p, ZB-2p, ZB-V, interleaved);
    # 127 of 130 (97.7%) with ZB-V as its V-shaped schedule (120 while timed as ZB-1p)
    from hetpar.ranking import pairwise_order

    zb = [(row, r) for row, r in zip(rows, results, strict=True)
          if row["source"].startswith("Qi et al. ICLR24")]
    right, pairs = pairwise_order([row for row, _ in zb], [r for _, r in zb])
    assert pairs >= 120 and right / pairs >= 0.90


def test_blank_fields_are_chosen_and_recorded(results):
    chosen = [r for r in results if "chose" in r.reason]
    assert chosen, "the file has rows with blank mbs / recompute"
    assert all("fastest that fits" in r.reason for r in chosen)


def test_framework_default_microbatches_fill_a_blank_mbs(rows, results):
    # torchtitan (framework fsdp) cuts a replica's batch into one micro-batch per pipeline
    # stage when pipeline_parallel_microbatches is unset; Megatron has no such default
    from hetpar.validation.rows import choices

    by_id = {int(r["row_id"]): r for r in rows}
    row76 = by_id[76]  # torchtitan 405B, pp 8, local batch 256 / 8 = 32
    assert row76["mbs"] == "" and row76["framework"] == "fsdp"
    assert choices(row76)[0] == [32 // 8]
    res = {r.row_id: r for r in results}[76]
    assert "one micro-batch per pipeline stage" in res.reason
    other = dict(row76, framework="megatron-lm", vpp="1")
    assert choices(other)[0] == [b for b in range(1, 33) if 32 % b == 0]
    # stages that do not divide the batch fall back to trying every micro-batch
    odd = dict(row76, gbs="240")
    assert choices(odd)[0] == [b for b in range(1, 31) if 30 % b == 0]


def test_blank_schedule_is_1f1b_whatever_the_framework(rows, results):
    # runs README: a blank schedule is 1f1b (interleaved when vpp > 1), not the framework's
    # habit; row 1048 is Megatron-Core (whose recipes usually interleave) at pp 2, vpp blank
    from hetpar.validation.rows import choices, combinations

    row = {int(r["row_id"]): r for r in rows}[1048]
    assert row["schedule"] == "" and row["vpp"] == "" and row["framework"] == "megatron-core"
    assert choices(row)[2] == [1]
    assert {v for _, _, v in combinations(row)} == {1}
    res = {r.row_id: r for r in results}[1048]
    assert res.choice is not None and res.choice[2] == 1 and "vpp" not in res.reason


def test_interleaved_with_a_blank_vpp_tries_the_chunk_counts_and_says_which(rows, results):
    from hetpar.validation.rows import choices

    by_id = {int(r["row_id"]): r for r in rows}
    res = {r.row_id: r for r in results}
    # 96 layers on 12 ranks: 8 per rank, so 2, 4 or 8 chunks
    assert by_id[11]["schedule"] == "interleaved" and by_id[11]["vpp"] == ""
    assert choices(by_id[11])[2] == [2, 4, 8]
    assert res[11].choice is not None and res[11].choice[2] in (2, 4, 8)
    assert f"vpp blank: chose {res[11].choice[2]} (fastest that fits)" in res[11].reason
    # 105 layers on 35 ranks: 3 per rank, one choice, still named
    assert choices(by_id[14])[2] == [3]
    assert "vpp blank: 3, the one chunk count" in res[14].reason


def test_framework_default_microbatches_follow_the_chunk_count(rows, results):
    # torchtitan interleaved with both blank (row 77): one micro-batch per stage, pp x vpp
    from hetpar.validation.rows import combinations

    row = {int(r["row_id"]): r for r in rows}[77]
    per_replica = int(row["gbs"]) // int(row["dp"])
    assert row["framework"] == "fsdp" and row["mbs"] == "" and row["vpp"] == ""
    pp = int(row["pp"])
    tried = {(b, v) for b, _, v in combinations(row)}
    for v in (2, 4):  # 32 sequences per replica, pp 8: 16 and 32 stages divide them
        assert {b for b, w in tried if w == v} == {per_replica // (pp * v)}
    # 64 and 128 stages do not divide 32 sequences: every micro-batch is tried
    assert {b for b, w in tried if w == 16} == {1, 2, 4, 8, 16, 32}
    res = {r.row_id: r for r in results}[77]
    assert res.choice is not None and f"vpp blank: chose {res.choice[2]}" in res.reason


def test_columns_must_match_exactly(tmp_path):
    bad = tmp_path / "bad.csv"
    with bad.open("w", newline="") as f:
        csv.writer(f).writerow([c for c in COLUMNS if c != "gbs"])
    with pytest.raises(ConfigError, match="missing column 'gbs'"):
        read_runs(bad)


def test_unknown_gpu_is_unsupported_not_a_crash():
    row = {**read_runs(RUNS)[0], "gpu": "TPU-v9"}
    res = predict_row(row)
    assert res.status == "unsupported" and "TPU-v9" in res.reason and res.predicted is None


@pytest.mark.parametrize("field,value,needle", [
    ("precision", "int4", "precision='int4' is not allowed"),
    ("recompute", "half", "recompute='half' is not allowed"),
    ("gbs", "", "gbs is blank"),
    ("tp", "two", "tp='two' is not a number"),
    ("measured_tokens_per_s_per_gpu", "", "must be a positive number"),
])
def test_malformed_rows_are_unsupported_with_the_field_named(field, value, needle):
    row = {**read_runs(RUNS)[0], field: value}
    res = predict_row(row)
    assert res.status == "unsupported" and needle in res.reason
    assert res.error_pct is None


MOE_RUNS = Path(__file__).parents[1] / "hetpar" / "catalog" / "validation" / "moe-runs.csv"


def test_moe_runs_are_predicted_with_their_expert_parallelism() -> None:
    """The collected MoE runs load with their extra columns; a row's ep and etp go into its
    plan (``Plan.axes``) and every row is predicted and fits (they all ran), never refused;
    35 rows, 4 sources. MAPE: issue 31 asks for 15%; not met, so the bound is the measured
    25.8% (README's MoE table) plus half a point, to catch a regression."""
    from hetpar.validation.predict import mape, predict_row
    from hetpar.validation.rows import plan_of, read_runs

    rows = read_runs(MOE_RUNS)
    assert len(rows) == 35
    readme = (MOE_RUNS.parent / "README.md").read_text()
    assert f"`moe-runs.csv` holds {len(rows)} published" in readme.replace("\n", " ")
    assert len({r["source_url"].split("/blob/")[0] for r in rows}) == 4
    results = []
    for row in rows:
        ep = int(row["ep"] or 1)
        plan = plan_of(row, micro_batch=1, recompute="none")
        assert dict(plan.axes).get("ep", 1) == ep
        results.append(res := predict_row(row))
        assert res.status == "ok", (row["row_id"], res.reason)
    assert (m := mape(results)) is not None and m <= 26.3


def test_moe_columns_build_the_model() -> None:
    """A DeepSeek-V3 row's columns build the catalog preset's shape (counts equal)."""
    from hetpar.catalog import load_model
    from hetpar.validation.rows import model_of, read_runs

    row = next(r for r in read_runs(MOE_RUNS) if r["model"] == "DeepSeek-V3")
    assert F.params(model_of(row)) == F.params(load_model("deepseek-v3"))
    bad = {**row, "moe_layer_freq": "[0,2]"}
    with pytest.raises(ConfigError, match="moe_layer_freq='\\[0,2\\]' not allowed"):
        model_of(bad)
    with pytest.raises(ConfigError, match="top_k='8' needs num_experts"):
        model_of({**row, "num_experts": ""})


def test_a_rows_ep_overlap_reaches_its_profile() -> None:
    """``ep_overlap`` sets the profile's share; outside 0..1 the row is refused, naming it."""
    from hetpar.validation.predict import predict_row, row_profile
    from hetpar.validation.rows import read_runs

    row = next(r for r in read_runs(MOE_RUNS) if r["row_id"] == "3032")
    assert row_profile(row).ep_overlap == 1.0
    assert row_profile({**row, "ep_overlap": ""}).ep_overlap == 0.0  # megatron-core's own
    res = predict_row({**row, "ep_overlap": "2"})
    assert res.status == "unsupported" and "ep_overlap='2' not allowed" in res.reason
