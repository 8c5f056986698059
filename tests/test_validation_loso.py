"""validate: framework / schedule columns, leave-one-source-out, pairwise order (issue 12)."""

import csv
import json
from pathlib import Path

import pytest

from hetpar.cli.main import main
from hetpar.errors import ConfigError
from hetpar.fit import leave_one_source_out, source_key
from hetpar.ranking import pairwise_order
from hetpar.validation.predict import predict_row
from hetpar.validation.rows import COLUMNS, read_runs

SMALL = Path(__file__).parent / "fixtures" / "runs_small.csv"


def _write(path: Path, rows: list[dict[str, str]], columns: list[str]) -> Path:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    return path


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as e:
        code = int(e.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_leave_one_source_out_predicts_every_row_with_the_same_contract(capsys):
    code, out, _ = _cli(["validate", str(SMALL), "--leave-one-source-out", "--json"], capsys)
    assert code == 0
    held = json.loads(out)
    code, out, _ = _cli(["validate", str(SMALL), "--json"], capsys)
    full = json.loads(out)
    assert [r["row_id"] for r in held["rows"]] == [r["row_id"] for r in full["rows"]]
    assert set(held) == set(full) and set(held["rows"][0]) == set(full["rows"][0])
    assert all(r["status"] == "ok" and r["predicted_tokens_per_s_per_gpu"] > 0
               for r in held["rows"])
    assert held["mape_pct"] > 0


def test_held_out_rows_are_predicted_without_their_source():
    rows = read_runs(SMALL)
    assert len({source_key(r) for r in rows}) >= 3
    held = leave_one_source_out(rows)
    # Changing what a source measured changes the fit on every other source, never its own
    # held-out predictions.
    key = source_key(rows[0])
    scaled = [{**r, "measured_tokens_per_s_per_gpu":
               str(3 * float(r["measured_tokens_per_s_per_gpu"]))}
              if source_key(r) == key else r for r in rows]
    again = leave_one_source_out(scaled)
    for r, a, b in zip(rows, held, again, strict=True):
        assert a.predicted is not None and b.predicted is not None
        if source_key(r) == key:
            assert b.predicted == pytest.approx(a.predicted, rel=1e-12)
    assert any(b.predicted != a.predicted for a, b in zip(held, again, strict=True))


def test_pairwise_order_counts_only_pairs_of_the_same_job():
    rows = read_runs(SMALL)
    results = [predict_row(r) for r in rows]
    right, pairs = pairwise_order(rows, results)
    # rows 40 and 41 are the same job shape on different GPU counts: never compared
    assert pairs == 0 and right == 0
    half = float(rows[0]["measured_tokens_per_s_per_gpu"]) / 2
    twin = {**rows[0], "row_id": "9001", "mbs": "8", "measured_tokens_per_s_per_gpu": str(half)}
    rows2 = [rows[0], twin]
    right, pairs = pairwise_order(rows2, [predict_row(r) for r in rows2])
    assert pairs == 1 and right in (0, 1)


def test_pairwise_order_scores_a_predicted_tie_as_wrong():
    import dataclasses

    rows = read_runs(SMALL)[:1]
    base = predict_row(rows[0])
    twin = {**rows[0], "row_id": "9001"}
    for first, second in ((100.0, 200.0), (200.0, 100.0)):  # either row measured lower
        a = dataclasses.replace(base, measured=first, predicted=150.0)
        b = dataclasses.replace(base, row_id=9001, measured=second, predicted=150.0)
        assert pairwise_order([rows[0], twin], [a, b]) == (0, 1)
    a = dataclasses.replace(base, measured=100.0, predicted=140.0)
    b = dataclasses.replace(base, row_id=9001, measured=200.0, predicted=150.0)
    assert pairwise_order([rows[0], twin], [a, b]) == (1, 1)


def test_misordered_pairs_name_the_rows_and_the_columns_that_differ():
    import dataclasses

    from hetpar.ranking import misordered_pairs

    rows = read_runs(SMALL)[:1]
    base = predict_row(rows[0])
    twin = {**rows[0], "row_id": "9001", "mbs": "8"}
    a = dataclasses.replace(base, measured=100.0, predicted=150.0)
    b = dataclasses.replace(base, row_id=9001, measured=200.0, predicted=140.0)
    (pair,) = misordered_pairs([rows[0], twin], [a, b])
    assert pair["rows"] == [base.row_id, 9001] and pair["differs"] == ["mbs"]
    assert pair["measured_ratio"] == 0.5 and pair["predicted_ratio"] == pytest.approx(150 / 140)
    # the same plan measured twice: a tie no prediction can order, nothing differs
    (tie,) = misordered_pairs([rows[0], {**rows[0], "row_id": "9001"}],
                              [a, dataclasses.replace(b, predicted=150.0)])
    assert tie["differs"] == []
    # put in order, nothing is listed
    assert misordered_pairs([rows[0], twin], [a, dataclasses.replace(b, predicted=160.0)]) == []


@pytest.mark.parametrize(("n", "reachable", "p"), [
    (3, False, 0.0),            # 0, 33, 67, 100%: no share between 70 and 90%
    (4, True, 4 * 0.8**3 * 0.2),  # only 3 of 4 (75%): binomial by hand
    (5, True, 5 * 0.8**4 * 0.2),  # only 4 of 5 (80%)
])
def test_source_coverage_says_what_its_row_count_allows(n, reachable, p):
    import dataclasses

    from hetpar.ranking import source_coverage

    base = dataclasses.replace(predict_row(read_runs(SMALL)[0]), measured=100.0)
    rs = [dataclasses.replace(base, interval=(90.0, 110.0) if i else (10.0, 20.0))
          for i in range(n)]
    got = source_coverage(rs)
    assert got["rows"] == n and got["inside"] == n - 1
    assert got["coverage_pct"] == pytest.approx(100 * (n - 1) / n)
    assert got["band_reachable"] is reachable
    assert got["p_in_band_if_calibrated"] == pytest.approx(p)


def test_files_without_framework_and_schedule_still_validate(tmp_path):
    rows = read_runs(SMALL)
    path = _write(tmp_path / "old.csv", rows, list(COLUMNS))
    old = read_runs(path)
    assert all(r["framework"] == "" and r["schedule"] == "" for r in old)
    assert predict_row(old[0]).status == "ok"


@pytest.mark.parametrize("column,value,allowed", [
    ("framework", "jax", "megatron-core"),
    ("schedule", "zb-9p", "zb-2p"),
])
def test_unknown_framework_or_schedule_is_a_one_line_error_exit_2(tmp_path, capsys, column,
                                                                   value, allowed):
    rows = read_runs(SMALL)
    rows[1] = {**rows[1], column: value}
    path = _write(tmp_path / "bad.csv", rows, list(rows[0]))
    with pytest.raises(ConfigError,
                       match=f"{column}='{value}' is not allowed; allowed: .*{allowed}"):
        read_runs(path)
    code, out, err = _cli(["validate", str(path)], capsys)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and allowed in err


def test_zero_bubble_schedules_map_to_a_registered_one_and_say_so():
    row = {**read_runs(SMALL)[0], "pp": "2", "dp": "16", "schedule": "zb-h2", "vpp": "1"}
    res = predict_row(row)
    assert res.status == "ok" and "schedule zb-h2 simulated as zb-2p" in res.reason
    # ZB-V is registered: its one V (vpp 2) fills a blank vpp
    res = predict_row({**row, "schedule": "zbv", "vpp": ""})
    assert res.status == "ok" and "simulated as" not in res.reason and res.choice[2] == 2
    for named in ("zb-1p", "zb-2p"):  # registered: simulated as themselves
        res = predict_row({**row, "schedule": named})
        assert res.status == "ok" and "simulated as" not in res.reason


def test_padded_layers_run_as_more_chunks_than_layers():
    # 22 layers as 8 stages x 3 chunks, two chunks empty at the ends (runs README); the
    # simulator admits the embedding-only first and head-only last chunk, run does not
    base = read_runs(SMALL)[0]
    row = {**base, "n_layers": "22", "pp": "8", "dp": "4", "vpp": "3", "gbs": "64", "mbs": "1",
           "schedule": "interleaved"}
    res = predict_row(row)
    assert res.status == "ok", res.reason
    three = {**row, "n_layers": "21"}  # three empty chunks: one would hold nothing at all
    assert predict_row(three).status == "infeasible"


def test_fit_writes_parameters_within_their_ranges_and_intervals(tmp_path, capsys):
    from hetpar.fit import PARAMETERS
    from hetpar.io import read_document
    from hetpar.sim.profile import bundled_fit, read_fitted

    out = tmp_path / "fit.toml"
    code, _, err = _cli(["validate", str(SMALL), "--fit", str(out)], capsys)
    assert code == 0 and out.is_file() and "wrote" in err
    for params in (read_fitted(out), bundled_fit()):
        for p in PARAMETERS:
            assert p.low <= getattr(params, p.name) <= p.high, p.name
    bands = read_document(out)["interval"]
    assert "all" in bands and all(lo <= hi for lo, hi in bands.values())


def test_fit_is_deterministic_and_independent_of_the_bundled_fit(monkeypatch):
    """The bundled values are reproducible by one command only if the fit is a function of
    the runs file alone: the same file gives the same parameters, whatever the bundled ones."""
    import dataclasses

    from hetpar.fit import PARAMETERS, fit
    from hetpar.sim import profile

    rows = read_runs(SMALL)
    first = fit(rows, rounds=1)
    assert fit(rows, rounds=1) == first
    # a bundled fit at the far end of every range must not move the result
    far = dataclasses.replace(profile.FittedParams(),
                              **{p.name: p.high for p in PARAMETERS})
    monkeypatch.setattr(profile, "bundled_fit", lambda: far)
    assert profile.resolve().microbatch_overhead_s == pytest.approx(
        far.microbatch_overhead_ms * 1e-3)  # the patch is seen by the simulator
    assert fit(rows, rounds=1) == first
    assert first != profile.FittedParams()  # the descent moved: the check is not vacuous


def _held(errors: dict[str, list[float]], sources: dict[str, int] | None = None
          ) -> tuple[list[dict[str, str]], list]:
    """Rows of the given frameworks (each over that many sources, default 10) and held-out
    results with those log errors."""
    import math

    from hetpar.validation.predict import RowResult

    rows, res = [], []
    for i, (fw, errs) in enumerate(errors.items()):
        n = (sources or {}).get(fw, 10)
        for j, e in enumerate(errs):
            src = f"s{i}-{j % n}"
            rows.append({"framework": fw, "source": src})
            res.append(RowResult(row_id=len(res), source=src, measured=100.0,
                                 predicted=100.0 * math.exp(e), status="ok", reason=""))
    return rows, res


def test_interval_bands_shrink_a_thin_framework_toward_the_pool():
    from hetpar.ranking import residual_bands

    spread = [(k - 20) / 100 for k in range(41)]  # -0.2 .. 0.2, centred
    thin = [-0.3, -0.31, -0.29]
    rows, res = _held({"big": spread, "also": spread[::-1], "thin": thin}, {"thin": 1})
    one = residual_bands(rows, res)
    rows, res = _held({"big": spread, "also": spread[::-1], "thin": thin}, {"thin": 3})
    three = residual_bands(rows, res)
    # the same three rows all on one side (issue 33's "other"): from one source they are
    # pulled toward the pooled band, and further than when three sources agree on them
    pooled_hi, raw_hi = one["all"][1], max(thin)
    assert raw_hi < three["thin"][1] < one["thin"][1] < pooled_hi
    assert one["thin"][1] - raw_hi > 0.1 * (pooled_hi - raw_hi)
    # a kind whose errors differ consistently over many rows keeps its own band
    rows, res = _held({"a": [e - 0.3 for e in spread], "b": [e + 0.3 for e in spread]})
    bands = residual_bands(rows, res)
    assert bands["a"][1] < 0 < bands["b"][0]


def test_held_out_intervals_never_use_their_own_source():
    from hetpar.ranking import coverage, held_out_intervals

    spread = [(k - 20) / 100 for k in range(41)]
    rows, res = _held({"x": spread})
    far = dataclasses_replace(res[0], predicted=1e6)  # a wild error in source s0-0
    spans = held_out_intervals(rows, [far, *res[1:]], lambda r: r["source"])
    assert spans[0] is not None
    rows_other = [i for i, r in enumerate(rows) if r["source"] != "s0-0"]
    again = held_out_intervals(rows, res, lambda r: r["source"])
    # the other source's intervals were built from s0-0's errors, so they move; s0-0's
    # own (besides the changed row) do not, as its own errors never reach them
    assert any(spans[i] != again[i] for i in rows_other)
    assert all(spans[i] == again[i] for i, r in enumerate(rows)
               if r["source"] == "s0-0" and i != 0)
    placed = [dataclasses_replace(r, interval=s) for r, s in zip(res, again, strict=True)]
    assert 60 <= coverage(placed) <= 95


def dataclasses_replace(obj, **kw):
    import dataclasses

    return dataclasses.replace(obj, **kw)


def test_simulator_doc_lists_every_fitted_number_with_its_range_start_and_value():
    import dataclasses

    from hetpar.fit import PARAMETERS
    from hetpar.sim.profile import FittedParams, bundled_fit

    doc = (Path(__file__).parents[1] / "docs" / "simulator.md").read_text()
    rows = {r.split("|")[1].strip(" `"): [c.strip() for c in r.split("|")[2:-1]]
            for r in doc.splitlines() if r.startswith("| `") and r.count("|") == 5}
    fitted, start = bundled_fit(), FittedParams()
    assert set(rows) == {f.name for f in dataclasses.fields(FittedParams)} - {"gpu_efficiency"}
    for p in PARAMETERS:
        rng, first, value = rows[p.name]
        assert rng == f"{p.low:g} - {p.high:g}", p.name
        assert float(first) == getattr(start, p.name), p.name
        assert float(value) == getattr(fitted, p.name), p.name


def test_simulator_doc_lists_every_fitted_gpu_asymptote_with_its_prior_range_and_value():
    from hetpar.catalog import load_gpu_prior
    from hetpar.catalog.gpu_fit import KERNELS, prior
    from hetpar.fit_gpu import gpu_parameters
    from hetpar.sim.profile import bundled_fit

    doc = (Path(__file__).parents[1] / "docs" / "simulator.md").read_text()
    rows = {tuple(c.strip(" `") for c in r.split("|")[1:3]): [c.strip() for c in
                                                              r.split("|")[3:-1]]
            for r in doc.splitlines() if r.startswith("| `") and r.count("|") == 6}
    fitted = bundled_fit().gpu_efficiency
    assert set(rows) == {(n, k) for n, _, _ in fitted for k in KERNELS}
    coords = {c.name: c for c in gpu_parameters(
        [{"gpu": n, "source": "s"} for n, _, _ in fitted], scale=1.0)}
    for name, m, a in fitted:
        for k, value in zip(KERNELS, (m, a), strict=True):
            first, rng, got = rows[(name, k)]
            c = coords[f"{name}.{k}"]
            assert float(first) == prior(load_gpu_prior(name))[KERNELS.index(k)], (name, k)
            assert rng == f"{c.low:g} - {c.high:g}", (name, k)
            assert float(got) == value, (name, k)
