"""Hybrid sharding (``zero_scope = "group"``) on gloo: the same training as the reference."""

from __future__ import annotations

from pathlib import Path

import pytest
from loadscale import deadline, limits
from runtime_helpers import TINY_GPT, TINY_LLAMA, assert_parity

from hetpar.runtime.gradsync import Bucket, sync_groups
from hetpar.runtime.hybrid import needed_groups, shard_of
from hetpar.runtime.layout import build_layout
from hetpar.specs.cluster import ClusterSpec, NodeGroup
from hetpar.specs.plan import Plan
from hetpar.specs.stage import Replica, Stage

pytestmark = pytest.mark.timeout(deadline(120))


def two_types(a: int, b: int) -> ClusterSpec:
    """One node of ``a`` devices of one type and one of ``b`` of another (CPU ranks)."""
    return ClusterSpec(name="two-types", node_groups=(
        NodeGroup(name="a", gpu="cpu", num_nodes=1, gpus_per_node=a),
        NodeGroup(name="b", gpu="cpu", num_nodes=1, gpus_per_node=b)))


def test_shards_split_by_node_group_and_pair_across() -> None:
    plan = Plan(dp=4, zero=1, zero_scope="group", global_batch=8)
    layout = build_layout(plan, TINY_GPT, two_types(2, 2))
    assert layout.node_groups == ("a", "a", "b", "b")
    b = Bucket((0, 1, 2, 3), numel=10)
    sh = [shard_of(layout, b, r) for r in range(4)]
    assert [s.ranks for s in sh] == [(0, 1), (0, 1), (2, 3), (2, 3)]
    assert [s.cross for s in sh] == [((0, 5, (0, 2)),), ((0, 5, (1, 3)),),
                                     ((0, 5, (0, 2)),), ((0, 5, (1, 3)),)]
    # scope "all" on the same cluster: one ZeRO group, no cross step
    flat = build_layout(Plan(dp=4, zero=1, global_batch=8), TINY_GPT, two_types(2, 2))
    assert shard_of(flat, b, 2).ranks == (0, 1, 2, 3) and not shard_of(flat, b, 2).hybrid


def test_unequal_node_groups_cut_the_shards_into_pieces() -> None:
    # 2 replicas on a, 1 on b: lcm(2, 1) = 2 pieces; rank 2 holds both, one with each peer.
    layout = build_layout(Plan(dp=3, zero=2, zero_scope="group", global_batch=6), TINY_GPT,
                          two_types(2, 1))
    b = Bucket((0, 1, 2), numel=7)
    assert shard_of(layout, b, 2).cross == ((0, 4, (0, 2)), (4, 8, (1, 2)))
    assert shard_of(layout, b, 1).cross == ((0, 4, (1, 2)),)
    need = needed_groups(layout, sync_groups(layout))
    assert need == {(0, 1), (0, 2), (1, 2)}


@pytest.mark.parametrize("zero", [1, 2])
def test_parity_hybrid_two_node_groups(zero: int) -> None:
    plan = Plan(dp=4, zero=zero, zero_scope="group", global_batch=8)
    assert_parity(plan, TINY_GPT, steps=3, cluster=two_types(2, 2))


def test_parity_hybrid_unequal_groups_and_batches() -> None:
    # Two replicas on a, one on b with another batch share; pieces pair ranks unevenly.
    def rep(group: str, batch: int) -> Replica:
        return Replica(stages=(Stage(layers=(0, 4), group=group, tp=1),), batch=batch,
                       micro_batch=1)

    plan = Plan(replicas=(rep("a", 3), rep("a", 3), rep("b", 2)), zero=1, zero_scope="group")
    assert_parity(plan, TINY_LLAMA, steps=3, cluster=two_types(2, 1))


def test_parity_hybrid_with_tp_and_pp_replicas() -> None:
    # Replica 0: tp=2 on a; replica 1: pp=2 on b. Weights are resharded between the TP
    # degrees and the ZeRO groups are single ranks: everything crosses in the cross step.
    a = Replica(stages=(Stage(layers=(0, 4), group="a", tp=2),), batch=2, micro_batch=1)
    b = Replica(stages=(Stage(layers=(0, 2), group="b", tp=1),
                        Stage(layers=(2, 4), group="b", tp=1)), batch=2, micro_batch=1)
    plan = Plan(replicas=(a, b), zero=1, zero_scope="group", sequence_parallel=True)
    assert_parity(plan, TINY_LLAMA, steps=2, cluster=two_types(2, 2))


def test_parity_hybrid_fsdp2_mesh() -> None:
    # zero=3: FSDP2 on a (dp_replicate, dp_shard) mesh, one row per node group.
    plan = Plan(dp=4, zero=3, zero_scope="group", global_batch=8)
    assert_parity(plan, TINY_LLAMA, steps=3, cluster=two_types(2, 2))


def test_fsdp2_hybrid_on_unequal_groups_is_a_config_error() -> None:
    from hetpar.errors import ConfigError
    from hetpar.runtime.fsdp import _hybrid_mesh

    layout = build_layout(Plan(dp=3, zero=3, zero_scope="group", global_batch=6), TINY_LLAMA,
                          two_types(2, 1))
    with pytest.raises(ConfigError, match="as many ranks on every node group"):
        _hybrid_mesh(layout, "cpu")


def _mesh_rank(rank: int, store: object, layout: object) -> object:
    from hetpar.runtime.fsdp import _hybrid_mesh

    mesh = _hybrid_mesh(layout, "cpu")  # type: ignore[arg-type]
    return mesh.mesh.tolist(), mesh.mesh_dim_names


def test_fsdp2_hybrid_mesh_has_one_row_per_node_group() -> None:
    from hetpar.runtime.launch import launch

    layout = build_layout(Plan(dp=4, zero=3, zero_scope="group", global_batch=8), TINY_LLAMA,
                          two_types(2, 2))
    for got in launch(_mesh_rank, 4, layout, **limits()):
        assert got == ([[0, 1], [2, 3]], ("dp_replicate", "dp_shard"))


def _ck_rank(rank: int, store: object, layout: object, steps: int, ck: str | None) -> object:
    from runtime_helpers import CFG

    from hetpar.runtime.trainer import train_rank

    return train_rank(layout, CFG, steps, checkpoint=ck, every=2)  # type: ignore[arg-type]


@pytest.mark.parametrize("zero", [1, 3])
def test_hybrid_checkpoint_resumes_exactly(zero: int, tmp_path: Path) -> None:
    import shutil

    from runtime_helpers import CFG

    from hetpar.runtime.launch import launch
    from hetpar.runtime.trainer import gather_full, reference

    layout = build_layout(Plan(dp=4, zero=zero, zero_scope="group", global_batch=8),
                          TINY_LLAMA, two_types(2, 2))
    straight = launch(_ck_rank, 4, layout, 4, None, **limits())
    launch(_ck_rank, 4, layout, 2, str(tmp_path / "ck"), **limits())
    shutil.copytree(tmp_path / "ck", tmp_path / "copy")
    second = launch(_ck_rank, 4, layout, 4, str(tmp_path / "ck"), **limits())
    for a, c in zip(straight, second, strict=True):
        assert c.losses == a.losses[2:]  # type: ignore[attr-defined]
        for name, p in a.params.items():  # type: ignore[attr-defined]
            assert (c.params[name] - p).abs().max().item() == 0.0, name  # type: ignore[attr-defined]
    if zero == 3:
        return  # FSDP2's DTensor checkpoint resumes zero=3 plans (test_runtime_checkpoint)
    # the moments are saved per parameter: a ZeRO-over-all plan on one node group resumes them
    other = build_layout(Plan(dp=2, zero=1, global_batch=8), TINY_LLAMA)
    res = launch(_ck_rank, 2, other, 4, str(tmp_path / "copy"), **limits())
    ref_losses, ref_params = reference(TINY_LLAMA, 8, 4, CFG)
    for a, b in zip(res[0].losses, ref_losses[2:], strict=True):  # type: ignore[attr-defined]
        assert abs(a - b) <= 1e-5 * abs(b)
    for name, p in gather_full(other, res, 0).items():  # type: ignore[arg-type]
        assert (p - ref_params[name]).abs().max().item() <= 1e-6, name


CLUSTER_TOML = """name = "two-types"
description = "one A100 node and one H100 node of 2 GPUs each (test fixture)"
sources = ["test fixture"]
[[node_groups]]
name = "a100"
gpu = "A100-SXM4-80GB"
num_nodes = 1
gpus_per_node = 2
[[node_groups]]
name = "h100"
gpu = "H100-SXM5-80GB"
num_nodes = 1
gpus_per_node = 2
"""

SPACE_TOML = """tp = [1]
pp = [1]
dp = []
sequence_parallel = [false]
micro_batch = [1]
schedule = ["1f1b"]
recompute = ["none"]
zero = [1]
zero_scope = ["group"]
families = ["uniform"]
"""


def test_cli_plan_with_group_scope_simulates_dry_runs_and_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from hetpar.cli.main import main

    (tmp_path / "c.toml").write_text(CLUSTER_TOML)
    (tmp_path / "s.toml").write_text(SPACE_TOML)
    c, out = str(tmp_path / "c.toml"), tmp_path / "plans"
    assert main(["plan", "--model", "tiny-llama", "--cluster", c, "--space",
                 str(tmp_path / "s.toml"), "--job", "gbs=8", "--out", str(out), "--quiet"]) == 0
    plan = str(out / "plan-1.toml")
    assert 'zero_scope = "group"' in (out / "plan-1.toml").read_text()
    capsys.readouterr()
    assert main(["simulate", "--model", "tiny-llama", "--cluster", c, "--plan", plan]) == 0
    capsys.readouterr()
    assert main(["run", "--model", "tiny-llama", "--cluster", c, "--plan", plan,
                 "--dry-run", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    # ZeRO groups {0, 1}, {2, 3} and cross-group pairs {0, 2}, {1, 3}
    assert d["world_size"] == 4 and d["groups"]["hybrid"] == 4
    assert main(["run", "--model", "tiny-llama", "--cluster", c, "--plan", plan,
                 "--steps", "3", "--json", "--quiet"]) == 0
    losses = json.loads(capsys.readouterr().out)["losses"]
    assert len(losses) == 3 and losses[-1] < losses[0]
