"""One registered list of breakdown keys: an extra key reaches every consumer."""

import json
import re
from pathlib import Path

import pytest

from hetpar.catalog import load_cluster, load_model, parse_inline_plan
from hetpar.errors import ConfigError
from hetpar.failures.simcost import rescaled
from hetpar.report import ReportBundle, render_html
from hetpar.search import explain, robust
from hetpar.search.costmodel import Evaluation
from hetpar.sim import axis_costs, breakdown, simulate
from hetpar.sim.report import BREAKDOWN_KEYS, bottleneck_words, breakdown_keys
from hetpar.specs import axes

EXTRA = breakdown.Term(key="xx_comm", word="xx-link", per="micro_batch", scales="share",
                       kind="network", limit="the toy link", color="#123456")
BASE = {"compute": 4.0, "recompute": 1.0, "tp_comm": 0.5, "cp_comm": 0.25, "pp_comm": 0.125,
        "dp_comm": 2.0, "bubble": 0.0, "optimizer": 0.375, "overhead": 0.0625}


@pytest.fixture
def extra():
    breakdown.register(EXTRA)
    yield EXTRA
    breakdown.unregister(EXTRA.key)


def test_the_built_in_keys_are_the_registrys():
    assert BREAKDOWN_KEYS == tuple(t.key for t in breakdown.BUILTIN)
    # the bundled ep axis's cost (hetpar.sim.moe) adds its key after the built-in ones
    assert breakdown.keys() == (*BREAKDOWN_KEYS, "ep_comm")
    with pytest.raises(ConfigError, match="already registered"):
        breakdown.register(breakdown.BUILTIN[0])


def test_a_registered_key_reaches_the_simulators_report(extra):
    r = simulate(load_model("tiny-llama"), load_cluster("selene-a100"),
                 parse_inline_plan("tp=2,pp=2,dp=2,gbs=16"))
    assert breakdown_keys()[-1] == "xx_comm" and bottleneck_words()["xx_comm"] == "xx-link"
    assert r.to_dict()["breakdown"]["xx_comm"] == 0.0


def test_a_registered_key_reaches_the_failure_studies(extra):
    """A per-micro-batch key that scales with the share adds v x n / t to a replica's time
    (no bubble here, so nothing else moves); without the registry it would drop out."""
    factor = {"share": 2.0, "speed": 1.0, "tp_ring": 1.5}
    plain = rescaled(BASE, factor)
    assert rescaled(BASE | {"xx_comm": 0.75}, factor) == pytest.approx(plain + 0.75 * 2.0)
    assert plain == pytest.approx((4.0 + 1.0) * 2.0 + 0.5 * 1.5 + 0.25 + 0.125 * 2.0
                                  + 0.375 * 2.0 + 0.0625)  # dp_comm is the sync's, not here


def test_a_registered_key_reaches_the_planners_explanation_and_uncertainty(extra):
    assert explain.limits()["xx_comm"] == "the toy link"
    ev = Evaluation(iteration_time_s=10.0, tokens_per_s=1.0, num_gpus=1,
                    breakdown={"compute": 4.0, "xx_comm": 3.0})
    p = robust.parts(ev, robust.Uncertainty())
    assert (p.compute, p.network, p.rest) == (4.0, 3.0, 3.0)


def test_a_registered_key_reaches_the_html_report(extra):
    html = render_html(ReportBundle(title="t", plans=(), terms=tuple(breakdown.payload())))
    data = json.loads(re.search(r'id="hetpar-data">(.*?)</script>', html, re.S).group(1))
    assert {"key": "xx_comm", "color": "#123456", "limit": "the toy link"} in \
        data["breakdown_keys"]
    js = (Path(__file__).resolve().parents[1] / "hetpar/report/report.js").read_text()
    assert not [k for k in BREAKDOWN_KEYS if re.search(rf"\b{k}:", js)], \
        "report.js keeps no breakdown key list of its own"


def test_a_costed_axis_key_is_registered_with_its_cost():
    """The ep_comm of a plan-scope axis reaches the failure studies: it is in the list."""
    axes.register(axes.AxisDef(name="zz", scope="plan", predicate="p", collective="toy"))
    try:
        axis_costs.register("zz", axis_costs.AxisCost(key="zz_comm", word="zz-link",
                                                      op="all_to_all", nbytes=lambda la: 0.0))
        term = {t.key: t for t in breakdown.terms()}["zz_comm"]
        assert (term.per, term.scales, term.kind) == ("micro_batch", "share", "network")
        factor = {"share": 2.0, "speed": 1.0, "tp_ring": 1.0}
        assert rescaled(BASE | {"zz_comm": 1.0}, factor) == pytest.approx(
            rescaled(BASE, factor) + 2.0)
    finally:
        axis_costs.unregister("zz")
        axes.unregister("zz")
