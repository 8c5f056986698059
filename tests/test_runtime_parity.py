"""Loss and parameter parity of every plan kind against the single-process reference."""

from __future__ import annotations

from dataclasses import replace

import pytest
from loadscale import deadline
from runtime_helpers import CFG, TINY_GPT, TINY_LLAMA, assert_parity, run_plan

from hetpar.runtime.trainer import reference
from hetpar.runtime.worker import RunConfig
from hetpar.specs.plan import Plan
from hetpar.specs.stage import Replica, Stage

pytestmark = pytest.mark.timeout(deadline(120))


def _stage(a: int, b: int, tp: int) -> Stage:
    return Stage(layers=(a, b), group="local", tp=tp)


@pytest.mark.parametrize(
    ("plan", "model"),
    [
        (Plan(tp=2, global_batch=4), TINY_GPT),
        (Plan(tp=2, sequence_parallel=True, global_batch=4), TINY_LLAMA),
        (Plan(dp=2, global_batch=4), TINY_GPT),
        (Plan(dp=2, zero=1, global_batch=4, micro_batch=2), TINY_LLAMA),
        (Plan(tp=2, dp=2, zero=1, sequence_parallel=True, global_batch=4), TINY_GPT),
        (Plan(tp=2, sequence_parallel=True, recompute="full", global_batch=4), TINY_LLAMA),
        (Plan(tp=2, recompute="selective", global_batch=4), TINY_GPT),
    ],
    ids=["tp", "sp", "dp", "zero1", "tp-sp-dp-zero1", "recompute-full", "recompute-selective"],
)
def test_parity_tp_dp(plan: Plan, model) -> None:
    assert_parity(plan, model)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "interleaved", "zb-h1"])
def test_parity_pipeline_schedules(schedule: str) -> None:
    vpp = 2 if schedule == "interleaved" else 1
    # Full recompute under the split backward of zero-bubble reruns blocks between B and W.
    recompute = "full" if schedule == "zb-h1" else "none"
    assert_parity(Plan(pp=2, vpp=vpp, schedule=schedule, global_batch=4, recompute=recompute),
                  TINY_LLAMA)


@pytest.mark.parametrize(("schedule", "dp"),
                         [("gpipe", 2), ("1f1b", 1), ("interleaved", 1), ("zb-h1", 1)])
def test_parity_torch_pipelining_engine(schedule: str, dp: int) -> None:
    # The same hetpar action lists, executed by torch.distributed.pipelining's runtime.
    vpp = 2 if schedule == "interleaved" else 1
    plan = Plan(pp=2, dp=dp, vpp=vpp, schedule=schedule, global_batch=4)
    assert_parity(plan, TINY_LLAMA, cfg=replace(CFG, pp_engine="torch"))


def test_parity_fsdp2() -> None:
    assert_parity(Plan(dp=2, zero=3, recompute="full", global_batch=4), TINY_LLAMA)


def test_parity_uneven_layer_split() -> None:
    rep = Replica(stages=(_stage(0, 1, 1), _stage(1, 4, 1)), batch=4, micro_batch=1)
    assert_parity(Plan(replicas=(rep,)), TINY_GPT)


def test_parity_tp_pp_dp_eight_ranks() -> None:
    plan = Plan(tp=2, pp=2, dp=2, sequence_parallel=True, schedule="1f1b", global_batch=8)
    assert_parity(plan, TINY_LLAMA, steps=2)


def test_parity_ntp_two_tp_degrees_unequal_batches() -> None:
    # Nonuniform TP: one replica at tp=2 (pipelined, uneven split), one at tp=1 with a
    # third of its batch; their gradients are resharded between the two layouts.
    a = Replica(stages=(_stage(0, 3, 2), _stage(3, 4, 2)), batch=6, micro_batch=2)
    b = Replica(stages=(_stage(0, 4, 1),), batch=2, micro_batch=1)
    assert_parity(Plan(replicas=(a, b), sequence_parallel=True), TINY_LLAMA)


def test_parity_tied_embeddings_across_pipeline_stages() -> None:
    # The tied embedding lives on the first and the last stage; their gradients must meet.
    tied = replace(TINY_GPT, tied_embeddings=True)
    assert_parity(Plan(pp=2, tp=2, sequence_parallel=True, global_batch=4), tied)


def test_parity_replicas_of_different_depth_with_zero1() -> None:
    # One replica pipelined over two ranks, one on a single rank, batch shares 3:1.
    a = Replica(stages=(_stage(0, 2, 1), _stage(2, 4, 1)), batch=3, micro_batch=1)
    b = Replica(stages=(_stage(0, 4, 1),), batch=1, micro_batch=1)
    assert_parity(Plan(replicas=(a, b), zero=1), TINY_GPT)


def test_parity_ntp_degrees_four_and_two() -> None:
    # lcm(4, 2) = 4 pieces per weight: each tp=2 rank reduces two pieces, each with a
    # different tp=4 rank of the other replica.
    a = Replica(stages=(_stage(0, 4, 4),), batch=2, micro_batch=1)
    b = Replica(stages=(_stage(0, 4, 2),), batch=2, micro_batch=2)
    assert_parity(Plan(replicas=(a, b), sequence_parallel=True), TINY_GPT, steps=2)


def test_parity_ntp_with_zero1() -> None:
    a = Replica(stages=(_stage(0, 3, 2), _stage(3, 4, 2)), batch=6, micro_batch=2)
    b = Replica(stages=(_stage(0, 4, 1),), batch=2, micro_batch=1)
    assert_parity(Plan(replicas=(a, b), zero=1), TINY_LLAMA)


def test_parity_check_detects_a_different_model() -> None:
    # The comparison itself must be able to fail: a run with another seed differs.
    plan = Plan(dp=2, global_batch=4)
    layout, res = run_plan(plan, TINY_GPT, steps=2, cfg=RunConfig(seed=1))
    ref, _ = reference(TINY_GPT, 4, 2, RunConfig(seed=0))
    assert abs(res[0].losses[0] - ref[0]) > 1e-5 * abs(ref[0])
