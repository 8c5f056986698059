"""An uneven expert split (``Plan.experts_per_rank``): its schema, the split and its price."""

from __future__ import annotations

import dataclasses
import itertools
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetpar.catalog import load_cluster, load_model
from hetpar.cli.main import main
from hetpar.errors import ConfigError, Infeasible
from hetpar.sim.core import simulate
from hetpar.sim.expert_split import by_speed
from hetpar.specs.plan import Plan
from hetpar.specs.stage import Replica, Stage

MIXED = load_cluster("mixed-a100-h100")
POD = load_cluster("h100-pod-400g")
MIXTRAL = load_model("mixtral-8x7b")
GPT_OSS = load_model("gpt-oss-20b")
QWEN3 = load_model("qwen3-30b-a3b")


def _mixed(model, split, *, pp: int, ep: int = 2) -> Plan:
    """One replica on A100s and one on H100s (tp 1, ``pp`` stages each): the EP group of
    each pipeline rank holds one A100 and one H100."""
    cut = [model.n_layers * i // pp for i in range(pp + 1)]

    def rep(group: str) -> Replica:
        return Replica(stages=tuple(Stage(layers=(cut[i], cut[i + 1]), group=group, tp=1)
                                    for i in range(pp)), batch=32, micro_batch=1)

    return Plan(name="mixed", replicas=(rep("a100"), rep("h100")), axes=(("ep", ep),),
                experts_per_rank=split, zero=1, recompute="full")


def _uniform(split, ep: int = 8) -> Plan:
    return Plan(tp=1, pp=2, dp=8, global_batch=64, axes=(("ep", ep),), experts_per_rank=split,
                zero=1)


@pytest.mark.parametrize(("split", "says"), [
    ("fast", "experts_per_rank 'fast' unknown; allowed: even, by_speed"),
    ((4, 4), "lists 2 counts [4, 4]; it needs one per EP rank, ep = 8"),
    ((9, 0, 1, 2, 3, 4, 5, 6), "counts must be integers >= 1, got [9, 0, 1"),
])
def test_bad_split_is_a_config_error_naming_the_field(split, says: str) -> None:
    with pytest.raises(ConfigError, match="experts_per_rank") as e:
        _uniform(split)
    assert says in str(e.value)


def test_a_named_split_needs_ep() -> None:
    with pytest.raises(ConfigError, match="by_speed' needs ep > 1"):
        Plan(tp=1, dp=8, global_batch=8, experts_per_rank="by_speed")


def test_counts_must_sum_to_the_models_experts() -> None:
    with pytest.raises(ConfigError, match=r"sums to 9; model mixtral-8x7b has n_experts = 8"):
        simulate(MIXTRAL, MIXED, _mixed(MIXTRAL, (4, 5), pp=8))


def test_cli_refuses_a_bad_split_in_one_line(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    plan = "tp=1,pp=2,dp=8,gbs=64,ep=8,experts_per_rank=by_fast"
    assert main(["simulate", "--model", "qwen3-30b-a3b", "--cluster", "h100-pod-400g",
                 "--plan", plan]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "experts_per_rank 'by_fast' unknown" in err[0], err


def test_by_speed_of_equal_costs_is_the_even_split() -> None:
    assert by_speed([(0.5, 1.0)] * 8, 128) == (16,) * 8
    # an expert 3.17x as fast on the second rank: 6 / 3.17 < 3 and 2 < 7 / 3.17
    assert by_speed([(0.0, 1.0), (0.0, 1 / 3.17)], 8) == (2, 6)
    # the first rank's other work (5 expert-times) leaves it fewer experts
    assert by_speed([(5.0, 1.0), (0.0, 1.0)], 8) == (2, 6)
    with pytest.raises(ConfigError, match="4 experts < ep = 8"):
        by_speed([(0.0, 1.0)] * 8, 4)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(1, 9)), min_size=1, max_size=4),
       st.integers(0, 6))
def test_by_speed_minimises_the_slowest_rank(costs: list[tuple[int, int]], extra: int) -> None:
    """No split (each >= 1) has a shorter slowest rank (rest + experts x one expert's
    seconds): checked by brute force."""
    total = len(costs) + extra
    got = by_speed([(float(r), float(o)) for r, o in costs], total)
    assert sum(got) == total and min(got) >= 1

    def worst(c) -> float:
        return max(r + e * o for e, (r, o) in zip(c, costs, strict=True))

    best = min(worst(c) for c in itertools.product(range(1, total + 1), repeat=len(costs))
               if sum(c) == total)
    assert worst(got) == pytest.approx(best)


def _same(a, b, rel: float = 0.0) -> None:
    assert a.iteration_time_s == pytest.approx(b.iteration_time_s, rel=rel)
    assert a.breakdown == pytest.approx(b.breakdown, rel=rel)
    assert [m.total for m in a.memory] == pytest.approx([m.total for m in b.memory], rel=rel)


@pytest.mark.parametrize(("model", "cluster", "plan"), [
    (QWEN3, POD, _uniform),
    (GPT_OSS, MIXED, lambda s: _mixed(GPT_OSS, s, pp=4)),
])
def test_even_counts_give_todays_numbers(model, cluster, plan) -> None:
    """The even split written out as counts runs the uneven path and changes nothing."""
    ep = plan("even").degree("ep")
    even = simulate(model, cluster, plan("even"))
    counts = simulate(model, cluster, plan((model.n_experts // ep,) * ep))
    _same(even, counts, rel=1e-12)


def test_by_speed_on_one_gpu_type_is_the_even_split() -> None:
    _same(simulate(QWEN3, POD, _uniform("even")), simulate(QWEN3, POD, _uniform("by_speed")))


@pytest.mark.parametrize("counts", [(17, 15, 16, 16, 16, 16, 16, 16), (9,) * 4 + (23,) * 4,
                                    (1,) * 7 + (121,), (32, 16, 16, 16, 16, 16, 8, 8)])
def test_on_one_gpu_type_even_is_never_slower(counts) -> None:
    even = simulate(QWEN3, POD, _uniform("even"))
    uneven = simulate(QWEN3, POD, _uniform(counts))
    assert even.iteration_time_s < uneven.iteration_time_s
    assert even.breakdown["compute"] < uneven.breakdown["compute"]
    assert even.breakdown["ep_comm"] < uneven.breakdown["ep_comm"]  # the busiest receiver


def test_on_a_mixed_group_by_speed_beats_even_when_compute_bound() -> None:
    """Mixtral's wide experts (14,336) make its MoE layers compute-bound: the H100 taking
    7 of 8 experts (an expert's GEMMs take 2.7x as long on the A100, whose attention is
    slower too) shortens the A100 replica's layers more than it lengthens the H100's and the
    all-to-all's (whose busiest receiver gets 1.75x)."""
    even = simulate(MIXTRAL, MIXED, _mixed(MIXTRAL, "even", pp=8))
    fast = simulate(MIXTRAL, MIXED, _mixed(MIXTRAL, "by_speed", pp=8))
    assert fast.experts is not None and fast.experts["experts_per_rank"] == [1, 7]
    assert fast.iteration_time_s < 0.9 * even.iteration_time_s
    assert fast.breakdown["ep_comm"] == pytest.approx(even.breakdown["ep_comm"] * 7 / 4,
                                                      rel=0.05)


def test_expert_memory_follows_the_split() -> None:
    """The H100 rank holds 7 of 8 experts, the A100 rank 1; the even split holds 4 on each:
    each rank's params move by 3 experts' weights, in opposite directions."""
    fast = simulate(MIXTRAL, MIXED, _mixed(MIXTRAL, "by_speed", pp=8))
    even = simulate(MIXTRAL, MIXED, _mixed(MIXTRAL, "even", pp=8))

    def params(r, replica: int) -> float:
        return next(m.params for m in r.memory if m.replica == replica and m.rank == 1)

    experts = params(even, 0) - params(fast, 0)  # 3 experts' weights of one pipeline rank
    assert experts > 0
    assert params(fast, 1) - params(even, 1) == pytest.approx(experts, rel=1e-9)
    assert fast.oom and not even.oom  # 7 experts of 4 layers do not fit an 80 GB H100


DOC = Path(__file__).resolve().parents[1] / "docs" / "simulator.md"


def _doc_example() -> tuple[str, str, list[str], str]:
    """docs/simulator.md's uneven-split example: the plan file, the command, the lines it
    shows and the prose about the even split."""
    text = DOC.read_text(encoding="utf-8")
    at = text.index("(`mixtral-a100-h100.toml`):")
    toml = text[text.index("```toml\n", at) + 8:text.index("  ```", text.index("```toml", at))]
    block = text[text.index("  $ hetpar simulate", at):]
    block = block[:block.index("  ```")]
    command, *shown = [line[2:] for line in block.splitlines()]
    prose = text[text.index("The same file without", at):text.index("test_the_docs_example", at)]
    return "\n".join(line[2:] for line in toml.splitlines()), command, shown, prose


def test_the_docs_example(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    toml, command, shown, prose = _doc_example()
    path = tmp_path / "mixtral-a100-h100.toml"
    path.write_text(toml, encoding="utf-8")
    argv = command.split()[2:]  # after "$ hetpar"
    argv[argv.index("mixtral-a100-h100.toml")] = str(path)
    assert main(argv) == 0
    printed = capsys.readouterr().out.splitlines()
    i = 0
    for line in shown:  # in order, exactly
        while i < len(printed) and printed[i] != line:
            i += 1
        assert i < len(printed), f"docs line not printed: {line!r}"
    path.write_text(toml.replace('experts_per_rank = "by_speed"\n', ""), encoding="utf-8")
    assert main(argv) == 0
    even = capsys.readouterr().out
    assert "experts per GPU           4\n" in even
    stated = re.findall(r"(iteration time|compute|ep_comm) ([\d.]+) s", prose)
    assert len(stated) == 3, prose
    for key, value in stated:
        assert re.search(rf"{key} +{re.escape(value)}\b", even), (key, value)


@pytest.mark.parametrize("split", ["by_speed", (3, 5), "even"])
def test_a_plan_file_round_trips_the_split(split) -> None:
    import tomllib

    from hetpar.io import dump_toml, from_dict, to_dict

    plan = Plan(dp=2, global_batch=4, axes=(("ep", 2),), experts_per_rank=split)
    text = dump_toml(to_dict(plan))
    assert from_dict(Plan, tomllib.loads(text), "plan") == plan
    assert ("experts_per_rank" in text) == (split != "even")  # even files stay as they were


def test_an_ep_group_runs_one_micro_batch_count() -> None:
    """Replicas of one EP group meet in every micro-batch's all-to-all: different batch
    shares (the planner's way to balance replicas of different speeds) are infeasible
    there; outside EP they stay allowed."""
    plan = _mixed(GPT_OSS, "even", pp=4)
    a, b = plan.replicas
    shares = (dataclasses.replace(a, batch=24), dataclasses.replace(b, batch=40))
    with pytest.raises(Infeasible, match=r"ep group of replicas \[0, 1\] would run 24/40"):
        simulate(GPT_OSS, MIXED, dataclasses.replace(plan, replicas=shares))
    dense = dataclasses.replace(plan, replicas=shares, axes=())
    assert simulate(GPT_OSS, MIXED, dense).iteration_time_s > 0


def test_a_changed_ep_keeps_by_speed_and_drops_counts_of_another_ep() -> None:
    """What a failure study or a recovery that lowers ep writes (``Plan.split_at``)."""
    assert _uniform("by_speed").split_at(4) == "by_speed"
    assert _uniform("by_speed").split_at(1) == "even"
    counts = (9, 23, 16, 16, 16, 16, 16, 16)
    assert _uniform(counts).split_at(8) == counts
    assert _uniform(counts).split_at(4) == "even"
