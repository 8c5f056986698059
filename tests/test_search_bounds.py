"""The planner's throughput bounds are bounds: against brute force and against evaluations."""

import itertools
import random

import pytest

from hetpar.search import SearchSpace
from hetpar.search.bounds import ClassBound, least_makespan
from hetpar.search.coster import Coster
from hetpar.search.generate import SearchState, expand_group, generate_groups
from hetpar.search.objectives import Objective
from hetpar.search.pipeline import pipeline_weights
from hetpar.search.rules import SearchStats
from hetpar.search.split import RankCost
from hetpar.search.synthetic import SyntheticCostModel
from hetpar.specs.cluster import ClusterSpec, NodeGroup
from hetpar.specs.job import Job
from hetpar.specs.model import ModelSpec

MODEL = ModelSpec(name="m12", n_layers=12, hidden=4096, n_heads=32, n_kv_heads=8,
                  ffn_hidden=14336, vocab=128256, seq_len=4096, mlp="swiglu")
CLUSTER = ClusterSpec(name="ab", node_groups=(
    NodeGroup(name="a", gpu="type-A", num_nodes=2, gpus_per_node=8),
    NodeGroup(name="b", gpu="type-B", num_nodes=2, gpus_per_node=8, nic_bandwidth_gbps=400.0),
))


def _brute_makespan(classes, ranks, n_layers, microbatches, sched, vpp, least):
    """Least makespan over every contiguous split and every share vector (>= least each)."""
    per_class = []
    for (count, pp), rc in zip(classes, ranks, strict=True):
        best = {}
        for cuts in itertools.combinations(range(1, n_layers), pp - 1):
            bounds = (0, *cuts, n_layers)
            layers = [bounds[i + 1] - bounds[i] for i in range(pp)]
            if min(layers) < vpp:
                continue
            times = [n * r.layer_times[0] + r.extra_s for n, r in zip(layers, rc, strict=True)]
            for k in range(least, microbatches + 1):
                a, b = pipeline_weights(sched, pp, vpp, k)
                t = a * max(times) + b * sum(times)
                best[k] = min(best.get(k, float("inf")), t)
        per_class.append((count, best))
    out = float("inf")
    counts = [c for c, _ in per_class]
    for shares in itertools.product(*(sorted(b) for _, b in per_class)):
        if sum(c * s for c, s in zip(counts, shares, strict=True)) != microbatches:
            continue
        out = min(out, max(b[s] for (_, b), s in zip(per_class, shares, strict=True)))
    return out


@pytest.mark.parametrize("seed", range(12))
def test_least_makespan_is_below_every_split_and_share(seed):
    rng = random.Random(seed)
    n_layers, vpp = 8, 1
    sched = rng.choice(["1f1b", "zb-h1", "gpipe"])
    classes = [(rng.randint(1, 2), rng.randint(1, 3)) for _ in range(rng.randint(1, 2))]
    ranks = [[RankCost(layer_times=(rng.uniform(0.5, 2.0),) * n_layers,
                       extra_s=rng.uniform(0.0, 1.0)) for _ in range(pp)] for _, pp in classes]
    m = rng.randint(sum(c for c, _ in classes), 8)
    rows = []
    for (count, pp), rc in zip(classes, ranks, strict=True):
        t = [r.layer_times[0] for r in rc]
        e = [r.extra_s for r in rc]
        relax = (n_layers + sum(x / y for x, y in zip(e, t, strict=True))) / sum(1 / y for y in t)
        mx = max(relax, max(vpp * y + x for x, y in zip(e, t, strict=True)))
        sm = sum(e) + vpp * sum(t) + (n_layers - pp * vpp) * min(t)
        a, b = pipeline_weights(sched, pp, vpp, m)
        rows.append(ClassBound(replicas=count, max_lb=mx, sum_lb=sm, a_offset=m - a, b=b))
    lb = least_makespan(rows, m, 1)
    exact = _brute_makespan(classes, ranks, n_layers, m, sched, vpp, 1)
    assert lb <= exact * (1 + 1e-12)


def test_fill_term_tightens_the_bound():
    # 8 replicas of a 4-rank pipeline with 2 micro-batches each: 1F1B's fill costs 3 of 5
    # rank-slots, which the bound without it (k * max) misses.
    row = ClassBound(replicas=8, max_lb=1.0, sum_lb=4.0, a_offset=1.0, b=1.0)
    assert least_makespan([row], 16, 1) == pytest.approx(5.0)
    plain = row._replace(a_offset=0.0, b=0.0)
    assert least_makespan([plain], 16, 1) == pytest.approx(2.0)


@pytest.mark.parametrize("seed", [0, 3])
def test_group_bound_covers_its_refined_candidates(seed):
    job = Job(global_batch=32)
    space = SearchSpace(tp=(1, 2, 4, 8), pp=(1, 2, 4), micro_batch=(1, 2), vpp=(1, 2),
                        schedule=("1f1b", "interleaved", "zb-h1", "gpipe"),
                        recompute=("none", "full"), zero=(0, 1, 3))
    cost = SyntheticCostModel(MODEL, CLUSTER, job, seed=seed)
    coster = Coster(MODEL, CLUSTER, cost, job.global_batch, MODEL.seq_len)
    state = SearchState(SearchStats())
    groups = generate_groups(MODEL, CLUSTER, job, space, Objective(), coster, state)
    rng = random.Random(seed)
    checked = 0
    for g in rng.sample(groups, 60):
        for c in expand_group(g, MODEL, coster, job, state):
            if not coster.refine(c, fixed=c.structure.uniform is not None):
                continue
            assert c.bound <= g.bound * (1 + 1e-9), (c.key, c.bound, g.bound)
            checked += 1
    assert checked > 20
