"""The GPU efficiency asymptotes in the one fit: priors, rescaled tables, refit per fold."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from hetpar.catalog import ROOT, load_gpu, load_gpu_prior
from hetpar.catalog.gpu_fit import bundled, parse, prior, rescaled, with_efficiency
from hetpar.errors import ConfigError
from hetpar.fit import _objective, coordinate_descent, leave_one_source_out, source_key
from hetpar.fit_gpu import gpu_parameters, keep_gpus
from hetpar.sim.profile import FittedParams, bundled_fit
from hetpar.specs.gpu import EfficiencyTable
from hetpar.validation.predict import predict_row
from hetpar.validation.rows import BUNDLED_RUNS, read_runs

SMALL = Path(__file__).parent / "fixtures" / "runs_small.csv"


def test_rescaling_keeps_the_fixed_kernel_cost_and_moves_the_asymptote() -> None:
    # the documented shape 1 / f(s) = rate t0 / s + 1 / f_inf (docs/catalog.md), A100 matmul
    rate, t0 = 312e12, 5e-6
    size = (1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13)

    def shape(f_inf: float) -> list[float]:
        return [1 / (rate * t0 / s + 1 / f_inf) for s in size]

    moved = rescaled(EfficiencyTable(size=size, fraction=tuple(shape(0.82))), 0.70)
    # (the last point stands for f_inf itself: 1e-4 off the curve there)
    assert list(moved.fraction) == pytest.approx(shape(0.70), rel=5e-4)


def test_a_catalog_gpu_loads_at_its_fitted_asymptotes_and_a_file_at_its_own(tmp_path) -> None:
    fitted = dict((n, (m, a)) for n, m, a in bundled())
    assert fitted, "the bundled fit lists no GPU"
    for name, (m, a) in fitted.items():
        g = load_gpu(name)
        assert (g.matmul_efficiency.fraction[-1], g.attention_efficiency.fraction[-1]) == (m, a)
        assert g.memory_efficiency == load_gpu_prior(name).memory_efficiency
    name = next(iter(fitted))
    path = tmp_path / f"{name}.toml"
    path.write_text((ROOT / "gpus" / f"{name}.toml").read_text())
    own = load_gpu(str(path))  # a user's file: its tables, whatever the bundled fit says
    assert prior(own) == prior(load_gpu_prior(name))


def test_every_dev_set_gpu_is_fitted_and_its_file_says_where_the_value_comes_from() -> None:
    gpus = {r["gpu"].strip() for r in read_runs(BUNDLED_RUNS)}
    assert gpus == {n for n, _, _ in bundled_fit().gpu_efficiency}
    for name in gpus:
        lines = (ROOT / "gpus" / f"{name}.toml").read_text().splitlines()
        text = " ".join(line.lstrip("#").strip() for line in lines)  # comments unwrapped
        assert "PRIORS" in text and "--fit hetpar/catalog/fit/simulator.toml" in text, name


def test_a_fit_file_with_a_bad_gpu_entry_is_a_config_error_naming_it() -> None:
    with pytest.raises(ConfigError, match="gpu_efficiency.X: matmul=1.5"):
        parse({"X": {"matmul": 1.5, "attention": 0.4}}, "simulator.toml")
    with pytest.raises(ConfigError, match="gpu_efficiency.X must have exactly the keys"):
        parse({"X": {"matmul": 0.5}}, "simulator.toml")


def test_the_penalty_counts_a_source_once_and_is_zero_at_the_prior() -> None:
    rows = read_runs(SMALL)
    coords = {c.name: c for c in gpu_parameters(rows, scale=0.1)}
    a100 = coords["A100-SXM4-80GB.matmul"]
    start = FittedParams()
    assert a100.penalty(start) == 0.0 and a100.get(start) == a100.prior
    moved = a100.put(start, a100.prior * 0.8)
    assert a100.penalty(moved) > 0 and a100.get(moved) == pytest.approx(a100.prior * 0.8)
    # the H100-96GB rows are one source: a weight of rows / sources = 1 unit of scale / N
    h = coords["H100-SXM5-96GB-500W.matmul"]
    n = sum(r["gpu"] == "H100-SXM5-96GB-500W" for r in rows)
    assert h.weight == pytest.approx(n / 1 * 0.1 / len(rows))


def test_the_fit_moves_a_gpu_asymptote_as_far_as_its_sources_support() -> None:
    # the small file's H100-96GB row as if four publications had measured it, 15% slower:
    # the global parameters cannot take that without the A100 rows, so that GPU's fitted
    # GEMM asymptote drops; one publication alone does not outweigh the prior
    rows = read_runs(SMALL)
    gpu = "H100-SXM5-96GB-500W"
    a100 = [r for r in rows if r["gpu"] == "A100-SXM4-80GB"][:5]  # most rows: the scale
    h100 = next(r for r in rows if r["gpu"] == gpu)

    def fitted(scale: float, sources: int) -> float:
        copies = [{**h100, "row_id": str(900 + k), "source": f"paper {k}",
                   "measured_tokens_per_s_per_gpu":
                   str(scale * float(h100["measured_tokens_per_s_per_gpu"]))}
                  for k in range(4)]
        if sources == 1:
            copies = [{**c, "source": "paper 0"} for c in copies]
        runs = [*a100, *copies]
        start = bundled_fit()
        # the fit's objective and its GPU coordinate alone (the global ones would take some
        # of the shift first, as they do in a full fit), from the bundled fit
        f, coords = _objective(runs, [predict_row(r).choice for r in runs], start)
        mm = [c for c in coords if c.name == f"{gpu}.matmul"]
        return mm[0].get(coordinate_descent(f, start, rounds=2, coords=mm))

    assert fitted(0.85, 4) < fitted(1.0, 4)
    assert abs(fitted(0.85, 1) - fitted(1.0, 1)) < fitted(1.0, 4) - fitted(0.85, 4)


def test_a_fold_without_a_gpus_rows_puts_it_back_to_its_prior() -> None:
    rows = read_runs(SMALL)
    p = dataclasses.replace(FittedParams(), gpu_efficiency=(
        ("A100-SXM4-80GB", 0.7, 0.4), ("H100-SXM5-96GB-500W", 0.5, 0.3)))
    kept = keep_gpus(p, [r for r in rows if r["gpu"] == "A100-SXM4-80GB"])
    assert kept.gpu_efficiency == (("A100-SXM4-80GB", 0.7, 0.4),)
    # the held-out predictions of the H100's only source never see the start's H100 value
    h100 = [r for r in rows if r["gpu"] == "H100-SXM5-96GB-500W"]
    assert len({source_key(r) for r in h100}) == 1
    other = dataclasses.replace(p, gpu_efficiency=(
        ("A100-SXM4-80GB", 0.7, 0.4), ("H100-SXM5-96GB-500W", 0.6, 0.2)))
    a = leave_one_source_out(rows, start=p, rounds=1)
    b = leave_one_source_out(rows, start=other, rounds=1)
    for r, x, y in zip(rows, a, b, strict=True):
        if r["gpu"] == "H100-SXM5-96GB-500W":
            assert x.predicted == y.predicted
    assert predict_row(h100[0], fitted=p).predicted != predict_row(h100[0],
                                                                  fitted=other).predicted


def test_with_efficiency_returns_one_object_per_value() -> None:
    g = load_gpu_prior("A100-SXM4-80GB")
    assert with_efficiency(g, 0.7, 0.5) is with_efficiency(g, 0.7, 0.5)
    assert with_efficiency(g, *prior(g)) is g
