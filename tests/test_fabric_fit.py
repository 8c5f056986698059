"""A fabric kind's latency and efficiency: fitted on the bundled rows only, and recoverable."""

import shutil

import pytest

from hetpar.errors import ConfigError
from hetpar.fabric_fit import BUNDLED, fit_kind, terms
from hetpar.net.links import load_link_kind
from hetpar.validation_collectives import bus_factor, read_rows

TCPXO_ROWS = [str(i) for i in range(60, 71)]
"""dstack's 2 x A3 Mega all_gather log: the rows tcpxo.toml names as its values' source."""


def test_tcpxo_catalog_values_are_the_fit_of_the_rows_it_names():
    f = fit_kind("tcpxo", TCPXO_ROWS)
    kind = load_link_kind("tcpxo")
    assert kind.net_latency_us == pytest.approx(f.net_latency_us, abs=0.05)
    assert kind.efficiency == pytest.approx(f.efficiency, abs=0.005)
    assert f.mape_pct < 5.0


def test_the_fit_gives_back_the_values_that_made_its_rows(tmp_path):
    """Rows priced at (L, e) = (60 us, 0.7) on the model's own lines fit back to (60, 0.7)."""
    rows = [m for m in read_rows(BUNDLED) if m.row_id in TCPXO_ROWS[:6]]
    lines = ["row_id,system,collective,gpus,gpus_per_node,size_bytes,measured_busbw_gbyte_s,"
             "source"]
    for m in rows:
        a, c, d = terms(m, "tcpxo", 60.0, 0.7)
        busbw = m.size * bus_factor(m.collective, m.gpus) / (a + c * 60e-6 + d / 0.7) / 1e9
        lines.append(f"{m.row_id},{m.system},{m.collective},{m.gpus},{m.per_node},{m.size},"
                     f"{busbw!r},synthetic")
    shutil.copytree(BUNDLED.parent / "systems", tmp_path / "systems")
    csv = tmp_path / "rows.csv"
    csv.write_text("\n".join(lines) + "\n", encoding="utf-8")
    f = fit_kind("tcpxo", [m.row_id for m in rows], path=csv)
    assert f.net_latency_us == pytest.approx(60.0, rel=1e-4)
    assert f.efficiency == pytest.approx(0.7, rel=1e-4)
    assert f.mape_pct < 1e-6


def test_a_row_without_the_kind_or_not_bound_by_it_is_refused():
    with pytest.raises(ConfigError, match="no 'tcpxo' level"):
        fit_kind("tcpxo", ["1"])  # a 2-GPU NVLink-bridge row
    with pytest.raises(ConfigError, match="no rows 999"):
        fit_kind("tcpxo", ["999"])
