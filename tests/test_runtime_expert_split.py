"""An uneven expert split on gloo: loss and parameter parity with one process, each rank
holding the experts its EP coordinate's count says (``Plan.experts_per_rank``)."""

from __future__ import annotations

import pytest
from loadscale import deadline
from runtime_helpers import assert_parity

from hetpar.catalog import load_model
from hetpar.runtime.layout import build_layout
from hetpar.specs.plan import Plan

pytestmark = pytest.mark.timeout(deadline(120))
MOE = load_model("tiny-moe")  # 4 experts, top-2, a dense first layer, a shared expert


def _plan(split: tuple[int, ...], **kw: object) -> Plan:
    return Plan(axes=(("ep", len(split)),), global_batch=4, experts_per_rank=split,
                **kw)  # type: ignore[arg-type]


def test_each_rank_holds_its_count() -> None:
    layout = build_layout(_plan((1, 3), dp=4, zero=1), MOE)
    assert [layout.experts_of(r) for r in range(4)] == [(0, 1), (1, 4), (0, 1), (1, 4)]
    assert layout.experts_of(0) != build_layout(_plan((2, 2), dp=4), MOE).experts_of(0)


@pytest.mark.parametrize("plan", [_plan((1, 3), dp=2), _plan((3, 1), dp=4, zero=1)],
                         ids=["dp2-ep2-1:3", "dp4-ep2-3:1-zero1"])
def test_uneven_split_parity(plan: Plan) -> None:
    assert_parity(plan, MOE, steps=2)


def test_by_speed_on_one_device_type_is_even() -> None:
    layout = build_layout(_plan((2, 2), dp=2), MOE)
    speed = build_layout(Plan(axes=(("ep", 2),), dp=2, global_batch=4,
                              experts_per_rank="by_speed"), MOE)
    assert speed.expert_counts == (2, 2)
    assert [speed.experts_of(r) for r in range(2)] == [layout.experts_of(r) for r in range(2)]
