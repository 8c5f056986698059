"""The planner searches ZeRO scope (hybrid sharding per GPU type) with a named pruning rule,
valid bounds and plan files that `hetpar simulate` loads unchanged."""

import dataclasses
import json

import pytest

from hetpar.catalog import load_cluster, load_model, load_plan
from hetpar.cli.main import main
from hetpar.errors import ConfigError
from hetpar.io import dump_toml, to_dict
from hetpar.search import SearchSpace, search
from hetpar.search.candidates import Knobs
from hetpar.search.coster import Coster
from hetpar.search.simcost import SimCostModel
from hetpar.search.structures import ReplicaClass, Slot, Structure, enumerate_structures
from hetpar.search.zeroscope import spans_groups, zero_degrees
from hetpar.sim import simulate
from hetpar.specs.job import Job
from hetpar.specs.plan import Plan
from hetpar.specs.stage import Replica, Stage

MODEL = load_model("llama3.1-8b")
JOB = Job(name="fp16", global_batch=256, seq_len=4096, precision="fp16")
_FULL = load_cluster("v100-a100")


def _nodes(n: int):
    """The bundled v100-a100 (50 Gb/s NIC share per V100, 200 per A100) with n nodes a group."""
    return dataclasses.replace(_FULL, name=f"v100-a100-{n}", node_groups=tuple(
        dataclasses.replace(g, num_nodes=n) for g in _FULL.node_groups))


# 64 + 64 GPUs: a ZeRO-3 group over both types runs its per-micro-batch gathers at the V100
# NICs' pace; per type, the A100s keep theirs, and the cross-type all-reduce moves 1/64 of
# the gradients per rank once per iteration.
CLUSTER = _nodes(8)
SPACE = SearchSpace(tp=(1,), pp=(1,), vpp=(1,), micro_batch=(1,), schedule=("1f1b",),
                    recompute=("none",), zero=(3,), families=("split",))


def _split(v100: int, a100: int) -> Structure:
    return Structure(family="split", classes=(
        ReplicaClass(count=v100, ranks=(Slot("v100", 1),)),
        ReplicaClass(count=a100, ranks=(Slot("a100", 1),))))


@pytest.fixture(scope="module")
def both():
    scoped = search(MODEL, CLUSTER, JOB, SPACE, workers=1, top=3)
    flat = search(MODEL, CLUSTER, JOB, dataclasses.replace(SPACE, zero_scope=("all",)),
                  workers=1, top=3)
    return scoped, flat


def test_search_picks_group_scope_where_it_is_faster(both):
    scoped, flat = both
    best = scoped.ranked[0]
    assert best.plan.zero_scope == "group"
    assert best.plan.name.endswith("zero3/group")
    assert best.evaluation.tokens_per_s > 1.1 * flat.ranked[0].evaluation.tokens_per_s
    # the same plan with a global ZeRO group simulates slower (the scope is what wins)
    same = dataclasses.replace(best.plan, zero_scope="all")
    assert simulate(MODEL, CLUSTER, same, JOB).tokens_per_s < best.evaluation.tokens_per_s


def test_search_keeps_the_global_scope_where_group_is_slower():
    # 16 + 16 GPUs: a shard is 1/16 of the gradients, and its all-reduce over the V100 NIC
    # costs more than the A100s gain from gathering among themselves
    small, job = _nodes(2), dataclasses.replace(JOB, global_batch=64)
    res = search(MODEL, small, job, SPACE, workers=1, top=2)
    assert [r.plan.zero_scope for r in res.ranked] == ["all", "group"]


def test_pruning_count_names_the_moot_group_scope(both):
    scoped, flat = both
    # split structures on one GPU type only: no DP group spans two types, scope moot
    moot = [s for s in enumerate_structures(CLUSTER, SPACE, 1, SPACE.min_gpu_fraction, 256)
            if not spans_groups(s.classes)]
    assert moot
    assert scoped.stats.removed["zero_scope"] == len(moot)  # one knob set each: zero 3
    assert flat.stats.removed["zero_scope"] == 0
    assert "zero_scope" in scoped.stats.summary()
    n = sum(1 for _ in enumerate_structures(CLUSTER, SPACE, 1, SPACE.min_gpu_fraction, 256))
    assert scoped.stats.candidates == flat.stats.candidates + n  # one more knob set each


def test_bounds_hold_for_group_scoped_plans():
    space = dataclasses.replace(SPACE, tp=(1, 2), pp=(1, 2), zero=(0, 2, 3), micro_batch=(1, 2),
                                families=("uniform", "mixed", "split"))
    res = search(MODEL, CLUSTER, JOB, space, workers=1, top=50)
    scoped = [r for r in res.evaluated if r.plan.zero_scope == "group"]
    assert len(scoped) >= 10 and {r.plan.zero for r in scoped} == {2, 3}
    assert res.stats.bound_violations == 0
    for r in scoped:
        assert r.evaluation.tokens_per_s <= r.bound * (1 + 1e-9), r.plan.name


def test_tail_bound_is_below_the_simulated_tail_for_group_scope():
    cost = SimCostModel(MODEL, CLUSTER, JOB, zero_dominated=())
    coster = Coster(MODEL, CLUSTER, cost, JOB.global_batch, JOB.seq_len)
    s = _split(64, 64)
    for zero in (1, 2):
        k = Knobs(zero=zero, zero_scope="group")
        flat = coster.tails(s, k._replace(zero_scope="all"), (MODEL.n_layers,) * 2)
        tails = coster.tails(s, k, (MODEL.n_layers,) * 2)
        assert tails != flat  # priced on the per-type groups, not the global one
        st = {g: Stage(layers=(0, MODEL.n_layers), group=g, tp=1) for g in ("v100", "a100")}
        reps = tuple(Replica(stages=(st[g],), batch=2, micro_batch=1)
                     for g in ("v100", "a100") for _ in range(64))
        plan = Plan(replicas=reps, zero=zero, zero_scope="group", precision="fp16")
        rep = simulate(MODEL, CLUSTER, plan, JOB)
        added = rep.breakdown["optimizer"] + rep.breakdown["dp_comm"] + rep.breakdown["overhead"]
        # equal batches: the V100 replicas (class 0) are the slowest, their tail is shown
        assert tails[0] <= added * (1 + 1e-9)
        assert tails[0] > 0.5 * added  # not vacuous


def test_memory_rule_shards_over_the_group_not_the_whole_dp_degree():
    s = _split(64, 64)
    assert zero_degrees(s, 0, "all") == (128,) and zero_degrees(s, 1, "group") == (64,)
    mixed = Structure(family="hybrid", classes=(
        ReplicaClass(count=4, ranks=(Slot("v100", 1), Slot("a100", 1))),
        ReplicaClass(count=8, ranks=(Slot("a100", 1), Slot("a100", 1)))))
    # rank 0's peers: 4 V100 + 8 A100; rank 1's: 12 A100
    assert zero_degrees(mixed, 0, "group") == (4, 12)
    assert zero_degrees(mixed, 1, "group") == (8, 12)
    assert spans_groups(mixed.classes) and not spans_groups(mixed.classes[:1])
    cost = SimCostModel(MODEL, CLUSTER, JOB)
    coster = Coster(MODEL, CLUSTER, cost, JOB.global_batch, JOB.seq_len)
    k = Knobs(zero=3)
    caps = [coster.rank_costs(s.classes[0], k, d, 2)[0].max_layers for d in ((128,), (64,))]
    assert caps[0] >= caps[1]
    assert coster.memory_fit(s, k._replace(zero_scope="group")) <= coster.memory_fit(s, k)


def test_space_rejects_an_unknown_scope():
    with pytest.raises(ConfigError, match="zero_scope"):
        SearchSpace(zero_scope=("node",))


def test_written_group_plan_loads_unchanged_into_simulate(tmp_path, capsys):
    cluster_file = tmp_path / "cluster.toml"
    cluster_file.write_text(dump_toml(to_dict(CLUSTER)))
    job_file = tmp_path / "job.toml"
    job_file.write_text(dump_toml(to_dict(JOB)))
    space_file = tmp_path / "space.toml"
    space_file.write_text(dump_toml(to_dict(SPACE)))
    out = tmp_path / "plans"
    assert main(["plan", "--model", "llama3.1-8b", "--cluster", str(cluster_file), "--job",
                 str(job_file), "--space", str(space_file), "--top", "1", "--workers", "1",
                 "--json", "--out", str(out)]) == 0
    entry = json.loads(capsys.readouterr().out)["plans"][0]
    plan = load_plan(entry["file"])
    assert plan.zero_scope == "group"
    assert main(["simulate", "--model", "llama3.1-8b", "--cluster", str(cluster_file),
                 "--job", str(job_file), "--plan", entry["file"], "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["tokens_per_s"] == pytest.approx(entry["report"]["tokens_per_s"], rel=1e-9)
