"""The planner's throughput bounds are bounds: against brute force and against evaluations."""

import itertools
import random

import pytest

from hetpar.search import SearchSpace
from hetpar.search.bounds import (
    ClassBound,
    best_rank_line,
    equal_weights,
    least_makespan,
    line_over_splits,
    relax_weights,
)
from hetpar.search.coster import Coster
from hetpar.search.generate import SearchState, expand_group, generate_groups
from hetpar.search.objectives import Objective
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


def _brute_makespan(classes, ranks, n_layers, microbatches, fill, vpp, least):
    """Least makespan over every contiguous split and every share vector (>= least each),
    each replica timed by its largest proven rank line ``k t_c + fill sum_{q<c} n_q tau_q``."""
    per_class = []
    for (count, pp), rc in zip(classes, ranks, strict=True):
        best = {}
        for cuts in itertools.combinations(range(1, n_layers), pp - 1):
            bounds = (0, *cuts, n_layers)
            layers = [bounds[i + 1] - bounds[i] for i in range(pp)]
            if min(layers) < vpp:
                continue
            times = [n * r.layer_times[0] + r.extra_s for n, r in zip(layers, rc, strict=True)]
            before = [fill * sum(layers[q] * rc[q].layer_times[0] for q in range(c))
                      for c in range(pp)]
            for k in range(least, microbatches + 1):
                t = max(k * x + y for x, y in zip(times, before, strict=True))
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
    n_layers, vpp = 8, rng.choice([1, 2])
    fill = rng.choice([0.0, 1.0 / vpp])
    classes = [(rng.randint(1, 2), rng.randint(1, 3)) for _ in range(rng.randint(1, 2))]
    ranks = [[RankCost(layer_times=(rng.uniform(0.5, 2.0),) * n_layers,
                       extra_s=rng.uniform(0.0, 1.0)) for _ in range(pp)] for _, pp in classes]
    m = rng.randint(sum(c for c, _ in classes), 8)
    least = 1
    exact = _brute_makespan(classes, ranks, n_layers, m, fill, vpp, least)
    for kind in ("relax", "equal"):
        rows = []
        for (count, _), rc in zip(classes, ranks, strict=True):
            taus = [r.layer_times[0] for r in rc]
            ext = [r.extra_s for r in rc]
            lam = relax_weights(taus) if kind == "relax" else equal_weights(taus, m, fill)
            rows.append(ClassBound(count, *line_over_splits(lam, taus, ext, n_layers, vpp,
                                                            least, fill)))
        assert least_makespan(rows, m, least) <= exact * (1 + 1e-12), kind


def test_rank_lines_hold_on_the_executed_schedules_and_the_formula_does_not():
    # The event-driven executor's makespan of uneven GPipe, 1F1B and interleaved pipelines
    # (chunks laid out as the planner builds them) is at least every rank line
    # k t_c + sum_{q<c} n_q tau_q / vpp (the argument in bounds.py); the schedule formula
    # (k - a) max + b sum that the bounds used before is not (it over-counts the fill).
    from hetpar.schedules import build, traits
    from hetpar.schedules.execute import ChunkTimes, execute
    from hetpar.search.split import chunk_ranges
    rng = random.Random(7)
    over = 0
    for _ in range(120):
        pp, vpp = rng.randint(2, 5), rng.choice([1, 1, 2, 3])
        name = rng.choice(["1f1b", "gpipe"]) if vpp == 1 else "interleaved"
        m = pp * rng.randint(1, 3)
        layers = [rng.randint(vpp, 4 * vpp) for _ in range(pp)]
        taus = [rng.uniform(0.2, 3.0) for _ in range(pp)]
        sizes = [hi - lo for lo, hi in chunk_ranges(layers, vpp)]
        per = [sizes[j] * taus[j % pp] for j in range(pp * vpp)]
        span = execute(build(name, pp, m, vpp), ChunkTimes(
            forward=[x / 3 for x in per], backward=[2 * x / 3 for x in per])).makespan
        times = [n * t for n, t in zip(layers, taus, strict=True)]
        before = 0.0
        for c in range(pp):
            assert m * times[c] + before <= span * (1 + 1e-9), (name, pp, vpp, layers, c)
            before += layers[c] * taus[c] / vpp
        x, y = best_rank_line(taus, layers, times, 1.0 / vpp, m)
        assert m * x + y == pytest.approx(max(
            m * times[c] + sum(layers[q] * taus[q] for q in range(c)) / vpp for c in range(pp)))
        a, b = traits(name).weights(pp, vpp, m)
        over += a * max(times) + b * sum(times) > span * (1 + 1e-9)
    assert over > 0


def test_fill_line_tightens_the_bound():
    # 8 replicas of a 4-rank pipeline (1 layer-second per rank, 8 layers), 2 micro-batches
    # each: k * max alone gives 2 x 2 = 4 s; the rank lines force the fill in (a split that
    # empties the early ranks makes the last one slower).
    taus, ext = [1.0] * 4, [0.0] * 4
    plain = least_makespan([ClassBound(8, 2.0)], 16, 1)
    assert plain == pytest.approx(4.0)
    line = line_over_splits(equal_weights(taus, 2, 1.0), taus, ext, 8, 1, 1, 1.0)
    assert least_makespan([ClassBound(8, *line)], 16, 1) > plain * 1.2


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


def test_a_vpp_deeper_than_the_model_is_refused_before_any_bound() -> None:
    """A space's vpp above the layer count fits no pp: its knob sets are counted as
    ``layers_per_chunk`` and never costed (a fuzzed vpp of 95,985 summed that many chunk
    boundaries per bound and searched for minutes)."""
    job = Job(global_batch=32)
    space = SearchSpace(tp=(1, 2), pp=(1, 2), micro_batch=(1,), vpp=(95985, 2),
                        schedule=("interleaved",), recompute=("none",), zero=(1,))
    cost = SyntheticCostModel(MODEL, CLUSTER, job, seed=0)
    coster = Coster(MODEL, CLUSTER, cost, job.global_batch, MODEL.seq_len)
    state = SearchState(SearchStats())
    groups = generate_groups(MODEL, CLUSTER, job, space, Objective(), coster, state)
    assert groups and all(k.vpp == 2 for g in groups for k in g.variants)
    deep = state.stats.predicates["layers_per_chunk"]
    assert deep > 0 and state.stats.removed["divisibility"] >= deep
