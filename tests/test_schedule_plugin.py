"""A schedule registered in one module (here) reaches simulate, search, bounds and export."""

import random
from collections.abc import Iterator

import pytest

from hetpar import schedules
from hetpar.errors import Infeasible
from hetpar.export import export
from hetpar.schedules import Action, RankTimes, Traits
from hetpar.search import SearchSpace, search
from hetpar.search.pipeline import inflight, pipeline_weights
from hetpar.sim import simulate
from hetpar.sim.pipeline import makespan
from hetpar.specs.cluster import ClusterSpec, NodeGroup
from hetpar.specs.job import Job
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import Plan

NAME = "toy-looped-bfs"
MODEL = ModelSpec(name="m8", n_layers=8, hidden=2048, n_heads=16, n_kv_heads=8,
                  ffn_hidden=5632, vocab=32000, seq_len=2048, mlp="swiglu")
CLUSTER = ClusterSpec(name="a100x16", node_groups=(
    NodeGroup(name="a", gpu="A100-SXM4-80GB", num_nodes=2, gpus_per_node=8),))


def looped_bfs(pp: int, m: int, vpp: int) -> list[list[Action]]:
    """Breadth-first looped schedule: every micro-batch through local chunk 0, then chunk 1...,
    then the backwards in reverse chunk order (like torch.distributed.pipelining's LoopedBFS)."""
    out = []
    for r in range(pp):
        chunks = [j * pp + r for j in range(vpp)]
        acts = [Action(kind="F", chunk=c, microbatch=i) for c in chunks for i in range(m)]
        acts += [Action(kind="B", chunk=c, microbatch=i)
                 for c in reversed(chunks) for i in range(m)]
        out.append(acts)
    return out


@pytest.fixture(scope="module", autouse=True)
def toy() -> Iterator[None]:
    schedules.register(NAME, Traits(chunks="looped", min_pp=2))(looped_bfs)
    yield
    schedules.unregister(NAME)


def test_traits_reject_what_the_chunk_shape_forbids() -> None:
    with pytest.raises(Infeasible, match="vpp >= 2"):
        schedules.build(NAME, 2, 4, 1)
    with pytest.raises(Infeasible, match="pp >= 2"):
        schedules.build(NAME, 1, 4, 2)
    assert schedules.build(NAME, 2, 4, 2).num_chunks == 4


def test_simulated_with_its_action_lists() -> None:
    plan = Plan(tp=8, pp=2, dp=1, vpp=2, micro_batch=1, global_batch=8, schedule=NAME)
    rep = simulate(MODEL, CLUSTER, plan)
    assert rep.tokens_per_s > 0
    # Breadth-first holds every micro-batch of every chunk: m * vpp chunks, 2 * m rank-units.
    assert inflight(NAME, 2, 2, 8) == (8.0, 8.0)
    base = simulate(MODEL, CLUSTER, Plan(tp=8, pp=2, dp=1, vpp=2, micro_batch=1,
                                         global_batch=8, schedule="interleaved"))
    assert rep.memory[0].activations > base.memory[0].activations


def test_searched_with_vpp_above_one() -> None:
    space = SearchSpace(tp=(8,), pp=(2,), vpp=(1, 2), micro_batch=(1,), schedule=(NAME,),
                        recompute=("none",), families=("uniform",))
    res = search(MODEL, CLUSTER, Job(global_batch=8, seq_len=2048), space, workers=1, top=1)
    best = res.ranked[0].plan
    assert best.schedule == NAME and best.vpp > 1
    # vpp beyond the space's is widened for any looped schedule, not only ``interleaved``
    assert res.stats.widened_vpp == {3, 4}
    assert res.stats.bound_violations == 0


def test_default_bound_never_exceeds_the_executed_makespan() -> None:
    rng = random.Random(3)
    for _ in range(30):
        pp, vpp, m = rng.choice((2, 3, 4)), rng.choice((2, 3)), rng.choice((2, 4, 6))
        ranks = [RankTimes(rng.uniform(0.5, 2), rng.uniform(0.5, 3), 0.0) for _ in range(pp)]
        a, b = pipeline_weights(NAME, pp, vpp, m)
        bound = a * max(r.total for r in ranks) + b * sum(r.total for r in ranks)
        assert bound <= makespan(NAME, ranks, m, vpp) * (1 + 1e-12)


@pytest.mark.parametrize(("target", "label"), [
    ("megatron", "Megatron-LM"), ("torchtitan", "torchtitan"), ("deepspeed", "DeepSpeed")])
def test_exported_with_a_named_fallback(target: str, label: str) -> None:
    plan = Plan(tp=2, pp=2, dp=2, vpp=2, micro_batch=1, global_batch=16, schedule=NAME)
    # torchtitan's TOML form (2025-10) takes any llama-shaped model; its 2026-02 registry
    # form has configs for the published Llama 3 sizes only
    e = export(plan, MODEL, target, version="2025-10" if target == "torchtitan" else None)
    assert (e.plan.schedule, e.plan.vpp) == (schedules.DEFAULT, 1)
    assert any(NAME in w and label in w for w in e.warnings), e.warnings
