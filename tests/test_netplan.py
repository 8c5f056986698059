"""A plan's collectives (NCCL algorithm / protocol, DP sync): parsed, simulated, exported."""

import pytest

from hetpar.catalog import load_cluster, load_model, parse_inline_plan
from hetpar.errors import ConfigError
from hetpar.export import export, names
from hetpar.io import dump_toml, from_dict, parse_json, to_dict
from hetpar.sim import simulate
from hetpar.specs.collectives import Collectives, NetworkModel
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
