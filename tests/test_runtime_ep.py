"""Expert parallelism on gloo: loss and parameter parity of EP plans with one process, the
uneven dispatch they exercise, and the plans the runtime refuses (one line, naming them)."""

from __future__ import annotations

import pytest
import torch
from loadscale import deadline
from runtime_helpers import CFG, assert_parity

from hetpar.catalog import load_model
from hetpar.errors import Infeasible, RuntimeGap
from hetpar.runtime import model as M  # noqa: N812
from hetpar.runtime import moe
from hetpar.runtime.data import global_batch
from hetpar.runtime.layout import build_layout
from hetpar.runtime.tp import SINGLE
from hetpar.specs.plan import Plan
from hetpar.specs.stage import Replica, Stage

pytestmark = pytest.mark.timeout(deadline(120))
MOE = load_model("tiny-moe")  # 4 experts, top-2, a dense first layer, a shared expert


def _plan(ep: int, **kw: object) -> Plan:
    return Plan(axes=(("ep", ep),), global_batch=4, **kw)  # type: ignore[arg-type]


def _replica(batch: int, micro_batch: int) -> Replica:
    return Replica(stages=(Stage(layers=(0, MOE.n_layers), group="local", tp=1),), batch=batch,
                   micro_batch=micro_batch)


@pytest.mark.parametrize(
    "plan",
    [_plan(2, dp=2),
     # edp groups of two (ranks 0, 2 and 1, 3 hold the same experts), ZeRO-1 over them
     _plan(2, dp=4, zero=1),
     # EP inside each pipeline stage: 1F1B runs the same microbatch order on both replicas
     _plan(2, dp=2, pp=2, schedule="1f1b"),
     # batch shares 4:2 in two microbatches each: the replicas send unequal row counts
     Plan(replicas=(_replica(4, 2), _replica(2, 1)), axes=(("ep", 2),))],
    ids=["dp2-ep2", "dp4-ep2-zero1", "pp2-dp2-ep2", "unequal-shares"],
)
def test_ep_parity(plan: Plan) -> None:
    assert_parity(plan, MOE, steps=3 if plan.num_gpus() == 2 else 2)


def test_the_parity_plans_dispatch_unevenly() -> None:
    """At step 0 the tokens of each replica of dp=2, ep=2 send different numbers of rows to
    the two EP ranks in the first MoE layer, so the parity above covers uneven splits."""
    tokens = global_batch(MOE, 0, 4, MOE.seq_len, CFG.seed, "cpu")
    infos = M.param_infos(MOE, range(2), True, False)
    p = {n: M.init_param(n, i, CFG.seed, CFG.dtype) for n, i in infos.items()}
    sends = []
    for rows in (tokens[:2], tokens[2:]):  # replica 0's batch share, replica 1's
        x = M.blocks(MOE, p, range(1), M.embed(MOE, p, rows[:, :-1], SINGLE), SINGLE)
        h = M._norm_fwd(MOE, p, "layers.1.ln2", x)
        _, chosen = moe.route(MOE, p, "layers.1.", h.reshape(-1, MOE.hidden))
        per_rank = torch.bincount(chosen.reshape(-1) // 2, minlength=2).tolist()
        sends.append(per_rank)
    assert all(a != b for a, b in sends), sends
    assert sum(map(sum, sends)) == 4 * MOE.seq_len * MOE.experts_per_token


@pytest.mark.parametrize(
    ("plan", "says"),
    [(Plan(tp=2, global_batch=4), "plan: tp=2 with a mixture-of-experts model is not "
      "supported by the runtime; allowed: tp=1"),
     (Plan(tp=2, axes=(("etp", 2),), global_batch=4),
      "plan: etp=2 is not supported by the runtime; allowed: 1"),
     (_plan(2, dp=2, zero=3), "plan: zero=3 (FSDP2) with ep=2 is not supported"),
     (Plan(replicas=(_replica(4, 2), _replica(2, 2)), axes=(("ep", 2),)),
      "plan: ep=2 needs replicas with one layer split and microbatch count; replica 0: "
      "layers [[0, 4]], 2 microbatches; replica 1: layers [[0, 4]], 1 microbatches")],
    ids=["tp", "etp", "fsdp2", "microbatches"],
)
def test_refused_expert_plans_name_the_combination(plan: Plan, says: str) -> None:
    with pytest.raises(RuntimeGap) as e:  # a capability gap, not malformed input
        build_layout(plan, MOE)
    assert says in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_an_ep_that_does_not_fit_is_the_feasibility_verdict() -> None:
    with pytest.raises(Infeasible, match=r"ep=2 does not divide dp\(1\)"):
        build_layout(_plan(2, dp=1), MOE)


def test_expert_groups_come_from_the_mesh() -> None:
    layout = build_layout(_plan(2, dp=4), MOE)
    assert layout.mesh.groups("ep") == ((0, 1), (2, 3))
    assert [layout.experts_of(r) for r in range(4)] == [(0, 2), (2, 4), (0, 2), (2, 4)]
    # an expert's gradient group is the mesh's edp group: the ranks holding it
    from hetpar.runtime.gradsync import holdings

    held = holdings(layout)
    assert {h.rank for h in held["layers.1.experts.3.w2"]} == {1, 3}
    assert set(layout.mesh.groups("edp")) == {(0, 2), (1, 3)}
    assert {h.rank for h in held["layers.1.router"]} == {0, 1, 2, 3}
