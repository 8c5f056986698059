"""Hybrid sharding (plan zero_scope = 'group'): ZeRO groups per GPU type, shards across."""

import dataclasses

import pytest

from hetpar.catalog import load_cluster, load_model
from hetpar.errors import ConfigError
from hetpar.io import from_dict
from hetpar.runtime.layout import _check_supported
from hetpar.sim import network as net
from hetpar.sim.core import simulate
from hetpar.sim.layout import layouts
from hetpar.specs.job import Job
from hetpar.specs.plan import Plan
from hetpar.specs.stage import Replica, Stage

CLUSTER, MODEL = load_cluster("v100-a100"), load_model("llama3.1-8b")
JOB = Job(name="fp16", global_batch=512, seq_len=4096, precision="fp16")


def _plan(scope: str, zero: int = 3) -> Plan:
    """128 V100 and 128 A100 replicas, tp1, one stage each, 1 and 3 sequences."""
    def reps(group: str, batch: int) -> tuple[Replica, ...]:
        st = Stage(layers=(0, MODEL.n_layers), group=group, tp=1)
        return tuple(Replica(stages=(st,), batch=batch, micro_batch=1) for _ in range(128))
    return Plan(name="h", replicas=reps("v100", 1) + reps("a100", 3), zero=zero,
                zero_scope=scope, precision="fp16")


def test_zero_scope_is_checked_and_loads_from_a_file_dict():
    with pytest.raises(ConfigError, match="zero_scope"):
        Plan(global_batch=8, zero=0, zero_scope="group")
    with pytest.raises(ConfigError, match="zero_scope"):
        Plan(global_batch=8, zero=1, zero_scope="node")
    p = from_dict(Plan, {"global_batch": 8, "zero": 2, "zero_scope": "group"}, "p.toml")
    assert p.zero_scope == "group"


def test_group_scope_shards_inside_each_gpu_type_and_all_reduces_shards_across():
    lays, topo = layouts(MODEL, CLUSTER, _plan("group"))
    for lay in lays:
        group = lay.chunks[0].group
        assert lay.dp_sizes[0] == 128
        shape = lay.dp_shapes[0]
        assert shape == topo.shape([(group, i) for i in range(128)])
        cross, smallest = lay.cross[0]
        assert (cross.n, smallest) == (2, 128)
    flat, _ = layouts(MODEL, CLUSTER, _plan("all"))
    assert flat[0].dp_sizes[0] == 256 and not flat[0].cross


def test_group_scope_keeps_a_copy_per_type_in_memory_and_frees_the_a100_side():
    hyb, flat = simulate(MODEL, CLUSTER, _plan("group"), JOB), simulate(
        MODEL, CLUSTER, _plan("all"), JOB)
    # sharded over 128 instead of 256 ranks: twice the optimizer state per GPU
    assert hyb.memory[0].optimizer == pytest.approx(2 * flat.memory[0].optimizer, rel=1e-9)
    # the A100 replicas no longer wait on ZeRO-3 gathers paced by the V100 NICs
    assert hyb.iteration_time_s < flat.iteration_time_s


def test_cross_type_all_reduce_is_one_ring_of_the_largest_shard():
    from hetpar.sim.structure import _cross_sync
    lays, _ = layouts(MODEL, CLUSTER, _plan("group"))
    lay = lays[0]
    cross, smallest = lay.cross[0]
    g = 1e9
    assert _cross_sync(lay, 0, g) == pytest.approx(net.all_reduce(cross, g / smallest))
    flat, _ = layouts(MODEL, CLUSTER, _plan("all"))
    assert _cross_sync(flat[0], 0, g) == 0.0


def test_the_runtime_accepts_hybrid_sharding():
    # executed by hetpar.runtime.hybrid (tests/test_runtime_hybrid.py trains it)
    plan = dataclasses.replace(_plan("group"), replicas=_plan("group").replicas[:2])
    _check_supported(plan, MODEL)
