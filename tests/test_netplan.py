"""A plan's collectives (NCCL algorithm / protocol, DP sync): parsed, simulated, exported."""

from dataclasses import replace

import pytest

from hetpar.catalog import load_cluster, load_model, parse_inline_plan
from hetpar.errors import ConfigError
from hetpar.export import export, names
from hetpar.io import dump_toml, from_dict, parse_json, to_dict
from hetpar.search import alternatives, search
from hetpar.search.collsearch import RULE, choices, saving_bound
from hetpar.search.costmodel import Evaluation
from hetpar.search.explain import explain
from hetpar.search.generate import Ranked
from hetpar.search.objectives import Objective
from hetpar.search.space import SearchSpace
from hetpar.sim import simulate
from hetpar.specs.collectives import Collectives, NetworkModel
from hetpar.specs.job import Job
from hetpar.specs.plan import Plan

GCP_DP = "tp=1,dp=128,gbs=256,group=a100,zero=0"


@pytest.fixture(scope="module")
def llama():
    return load_model("llama3.1-8b")


@pytest.fixture(scope="module")
def gcp():
    return load_cluster("gcp-a100-v100")


def _dp_use(report):
    return [u for u in report.to_dict()["collectives"] if u["axis"] == "dp"]


def test_inline_keys_fill_the_collectives_table():
    p = parse_inline_plan("tp=2,dp=4,gbs=64,algorithm=tree,protocol=LL128,dp_sync=flat")
    assert p.collectives == Collectives(algorithm="tree", protocol="LL128", dp_sync="flat")
    assert parse_inline_plan("tp=2,gbs=8,algorithm=auto").collectives is None


@pytest.mark.parametrize("text,field", [("algorithm=bus", "algorithm"),
                                        ("protocol=simple", "protocol"),
                                        ("dp_sync=2d", "dp_sync")])
def test_a_bad_value_names_the_field(text, field):
    with pytest.raises(ConfigError, match=f"collectives.{field}: .* allowed"):
        parse_inline_plan(f"tp=2,gbs=8,{text}")


def test_a_plan_file_keeps_its_collectives_and_refuses_unknown_keys():
    p = parse_inline_plan("tp=2,dp=4,gbs=64,algorithm=ring")
    data = parse_json(__import__("json").dumps(to_dict(p)), "plan")
    assert "[collectives]" in dump_toml(to_dict(p))
    assert from_dict(Plan, data, "plan").collectives == p.collectives
    data["collectives"]["nccl_algo"] = "ring"
    with pytest.raises(ConfigError, match="plan.collectives: unknown key 'nccl_algo'"):
        from_dict(Plan, data, "plan")


def test_forced_tree_prices_and_names_the_tree_on_the_dp_all_reduce(llama, gcp):
    auto = simulate(llama, gcp, parse_inline_plan(GCP_DP), collectives=True)
    tree = simulate(llama, gcp, parse_inline_plan(GCP_DP + ",algorithm=tree"), collectives=True)
    assert [u["algorithm"] for u in _dp_use(auto)] == ["ring"]  # NCCL's own pick here
    assert [u["algorithm"] for u in _dp_use(tree)] == ["tree"]
    assert tree.breakdown["dp_comm"] > auto.breakdown["dp_comm"]


def test_forced_protocol_is_what_every_communicator_runs(llama, gcp):
    r = simulate(llama, gcp, parse_inline_plan("tp=4,dp=32,gbs=256,group=a100,protocol=LL"),
                 collectives=True)
    assert {u["protocol"] for u in r.to_dict()["collectives"]} == {"LL"}


def test_hierarchical_sync_replaces_the_flat_call_across_nodes(llama, gcp):
    r = simulate(llama, gcp, parse_inline_plan(GCP_DP + ",dp_sync=hierarchical"),
                 collectives=True)
    flat = simulate(llama, gcp, parse_inline_plan(GCP_DP + ",dp_sync=flat"), collectives=True)
    assert [u["algorithm"] for u in _dp_use(r)] == ["hierarchical"]
    assert [u["algorithm"] for u in _dp_use(flat)] == ["ring"]
    assert r.breakdown["dp_comm"] != flat.breakdown["dp_comm"]


def test_the_per_gpu_ring_model_charges_what_peer_planners_charge(llama, gcp):
    """Issue 32: a flat ring at each GPU's share of the VM's NIC costs tp1 dp128 four times
    and tp2 dp64 twice what tp4 dp32 costs; NCCL's rings charge the three alike."""
    per_gpu = NetworkModel(name="per-gpu", ring_per_gpu=True)
    sync = {}
    for tp in (1, 2, 4):
        p = parse_inline_plan(f"tp={tp},dp={128 // tp},gbs=256,group=a100,zero=1")
        sync[tp] = (simulate(llama, gcp, p).breakdown["dp_comm"],
                    simulate(llama, gcp, p, network=per_gpu).breakdown["dp_comm"])
    assert max(n for n, _ in sync.values()) / min(n for n, _ in sync.values()) < 1.1
    assert sync[1][1] / sync[4][1] == pytest.approx(4, rel=0.1)
    assert sync[2][1] / sync[4][1] == pytest.approx(2, rel=0.1)
    assert sync[4][1] == pytest.approx(sync[4][0])  # one GPU per node: the same ring


@pytest.mark.parametrize("target", names())
def test_every_export_carries_nccl_algo_and_proto(llama, target):
    plan = parse_inline_plan("tp=2,dp=4,gbs=64,zero=1,algorithm=ring,protocol=Simple")
    e = export(plan, llama, target)
    assert e.env["NCCL_ALGO"] == "Ring" and e.env["NCCL_PROTO"] == "Simple"
    text = "".join(t for _, t in e.files)
    assert "NCCL_ALGO=Ring" in text and "NCCL_PROTO=Simple" in text


def test_tree_is_exported_for_the_all_reduce_only(llama):
    e = export(parse_inline_plan("tp=2,dp=4,gbs=64,algorithm=tree"), llama, "megatron")
    assert "export NCCL_ALGO=allreduce:tree" in e.files[0][1]


def test_hierarchical_sync_export_is_refused_naming_the_field(llama):
    with pytest.raises(ConfigError, match="plan.collectives.dp_sync = 'hierarchical'"):
        export(parse_inline_plan("tp=2,dp=4,gbs=64,dp_sync=hierarchical"), llama, "megatron")


# --- the planner: collectives searched, alternative network models (issue 32 items 4, 6) ---

def _gcp_cut(vms: int = 4):
    """The GCP zone cut to ``vms`` VMs of each GPU type (as bench/search_peers.py cuts it)."""
    base = load_cluster("gcp-a100-v100")
    return replace(base, name=f"gcp-cut-{vms}",
                   node_groups=tuple(replace(g, num_nodes=vms) for g in base.node_groups))


SMALL = SearchSpace(tp=(1, 2, 4), pp=(1, 2), micro_batch=(1, 2), recompute=("none",),
                    zero=(0, 1), zero_scope=("all",), vpp=(1,), schedule=("1f1b",),
                    widen_vpp=False, families=("uniform", "split"))


@pytest.fixture(scope="module")
def opt_search():
    model, cluster = load_model("opt-350m"), _gcp_cut()
    job = Job(global_batch=64, seq_len=2048, precision="fp32")
    return model, cluster, job, {
        name: search(model, cluster, job, SMALL, objective=Objective(name=name), workers=1,
                     top=3) for name in ("throughput", "robust")}


def test_the_space_lists_each_forced_choice_once_simplest_first():
    got = choices(SearchSpace())
    assert len(got) == 8 and len(set(got)) == 8
    assert all(not c.is_auto for c in got)
    assert [c.label() for c in got[:4]] == ["flat", "hierarchical", "ring", "tree"]
    with pytest.raises(ConfigError, match="search space: dp_sync"):
        SearchSpace(dp_sync=("flat",))


def test_forced_collectives_are_counted_and_only_kept_where_they_win(opt_search):
    model, cluster, job, runs = opt_search
    res = runs["throughput"]
    st = res.stats
    assert st.collective_evaluations + st.removed[RULE] == 8 * 3
    auto = {r.key: r for r in res.evaluated if r.plan.collectives is None}
    forced = [r for r in res.evaluated if r.plan.collectives is not None]
    assert forced  # the GCP VMs' slow NICs: hierarchical sync wins somewhere
    for r in forced:
        twin = auto[r.key.rsplit(",", 1)[0]]
        assert r.evaluation.tokens_per_s > twin.evaluation.tokens_per_s
        again = simulate(model, cluster, r.plan, job)
        assert again.tokens_per_s == pytest.approx(r.evaluation.tokens_per_s)


def test_no_forced_choice_beats_the_bound_that_prunes_it(opt_search):
    model, cluster, job, runs = opt_search
    for r in runs["throughput"].ranked:
        if r.plan.collectives is not None:
            continue
        ev = r.evaluation
        limit = ev.tokens_per_s * ev.iteration_time_s / (
            ev.iteration_time_s - saving_bound(ev, r.plan.pp > 1 or any(
                len(x.stages) > 1 for x in r.plan.replicas)))
        for c in choices(SearchSpace()):
            got = simulate(model, cluster, replace(r.plan, collectives=c), job).tokens_per_s
            assert got <= limit * (1 + 1e-9)


def test_robust_ranks_by_the_worst_loss_over_the_network_models(opt_search):
    res = opt_search[3]["robust"]
    names = [n for n, _ in res.ranked[0].alternatives]
    assert names == ["nominal"] + [m.name for m in alternatives.DEFAULT]
    priced = [r for r in res.evaluated if r.alternatives]
    tops = alternatives.best(priced)
    first = alternatives.worst(res.ranked[0], tops)
    assert all(first <= alternatives.worst(r, tops) + 1e-12 for r in priced)
    # issue 32's must-show, on a cut of the same GCP zone: #1 loses at most 10% to the best
    # pooled plan under every gradient-sync model, while the plain search's kind of plan
    # (flat sync, fastest nominally) is reported fragile
    assert first <= alternatives.FRAGILE
    assert any(lose == "per-gpu-ring" for _, _, lose, _ in alternatives.fragile(priced))
    lines = explain(res)
    for m in alternatives.DEFAULT:
        assert any(line.startswith(f"  {m.name} ({m.description}): #1 ") for line in lines)


def test_a_plan_best_under_one_model_and_far_behind_under_another_is_fragile():
    def r(name, tps):
        e = Evaluation(iteration_time_s=1.0, tokens_per_s=tps[0], num_gpus=8)
        return Ranked(plan=Plan(name=name, global_batch=8), evaluation=e, score=(tps[0],),
                      gpus=8, price_per_hour=0.0, key=name, bound=tps[0],
                      alternatives=(("nominal", tps[0]), ("per-gpu-ring", tps[1])))
    a, b = r("fast-flat", (100.0, 50.0)), r("steady", (95.0, 94.0))
    assert [(x.plan.name, w, lose) for x, w, lose, _ in alternatives.fragile([a, b])] == [
        ("fast-flat", "nominal", "per-gpu-ring")]
    assert alternatives.worst(b, alternatives.best([a, b])) == pytest.approx(0.05)


def test_a_space_file_lists_its_own_network_models():
    data = {"network_models": [{"name": "slow-tcp", "scale_out_efficiency": 0.3}]}
    sp = from_dict(SearchSpace, data, "space.toml")
    assert alternatives.models(sp) == (NetworkModel(name="slow-tcp", scale_out_efficiency=0.3),)
    with pytest.raises(ConfigError, match="space.toml.network_models.*dp_sync"):
        from_dict(SearchSpace, {"network_models": [{"name": "x", "dp_sync": "ring"}]},
                  "space.toml")
