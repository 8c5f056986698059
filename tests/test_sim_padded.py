"""Padded interleaving (empty first / last chunk) and the per-rank activation stash."""

from pathlib import Path

import pytest

from hetpar.errors import Infeasible
from hetpar.sim import simulate
from hetpar.sim.pipeline import in_flight_layers
from hetpar.specs.stage import padded_split
from hetpar.validation.rows import cluster_of, model_of, plan_of, read_runs

SMALL = Path(__file__).parent / "fixtures" / "runs_small.csv"


@pytest.mark.parametrize("pp,vpp,m", [(4, 2, 8), (8, 4, 16), (16, 4, 32), (16, 8, 32)])
def test_interleaved_stash_is_1f1b_times_korthikanti_factor(pp, vpp, m):
    # Korthikanti et al. 2022 Sec. 4.2.3: the interleaved schedule multiplies the first
    # stage's stash by 1 + (p - 1) / (p v); every rank holds at least its 1F1B stash
    per_chunk = 2
    even = (per_chunk,) * (pp * vpp)
    one = [in_flight_layers("1f1b", pp, m, 1, r, (per_chunk * vpp,) * pp) for r in range(pp)]
    inter = [in_flight_layers("interleaved", pp, m, vpp, r, even) for r in range(pp)]
    assert inter[0] == pytest.approx(one[0] * (1 + (pp - 1) / (pp * vpp)))
    assert all(i >= o for i, o in zip(inter, one, strict=True))


def test_llama3_padded_stash_counts_the_empty_chunk():
    # 126 layers as 16 x 8 one-layer chunks, chunk 0 only the embedding and chunk 127 only
    # the head (Llama 3 Sec. 3.3.2); 32 micro-batches per replica (Table 4, 8,192 GPUs)
    layers = tuple(b - a for a, b in padded_split(126, 128))
    assert layers[0] == layers[-1] == 0 and sum(layers) == 126
    got = [in_flight_layers("interleaved", 16, 32, 8, r, layers) for r in range(16)]
    # rank 0: 143 in flight (2 x 15 + 7 x 16 + 1), 31 of them its empty chunk; rank 15: its
    # head-only chunk's micro-batches pass, then a forward of chunk 15 precedes each backward
    assert got[0] == 112 and got[1] == 2 * 14 + 7 * 16 + 1 and got[15] == 113


def test_simulate_pads_at_most_the_two_end_chunks():
    base = read_runs(SMALL)[0]
    row = {**base, "n_layers": "14", "pp": "4", "dp": "8", "vpp": "4", "gbs": "64",
           "mbs": "1", "schedule": "interleaved"}
    model, cluster = model_of(row), cluster_of(row)
    rep = simulate(model, cluster, plan_of(row, micro_batch=1, recompute="none"))
    first, second = rep.memory[0], rep.memory[1]
    # rank 0's first chunk holds only the embedding: fewer layers stashed than rank 1's
    assert first.activations < second.activations
    with pytest.raises(Infeasible, match="layers < pp\\*vpp"):
        row13 = {**row, "n_layers": "13"}
        simulate(model_of(row13), cluster, plan_of(row13, micro_batch=1, recompute="none"))
