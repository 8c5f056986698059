"""The planner searches EP and ETP for mixture-of-experts models, and prunes them early."""

from dataclasses import replace

from hetpar import catalog, formulas
from hetpar.io import dump_toml, to_dict
from hetpar.placement import place
from hetpar.search import SearchSpace, search
from hetpar.search.candidates import Knobs
from hetpar.search.coster import expert_dp
from hetpar.search.costmodel import StageCost, StageKey, StateBytes
from hetpar.search.experts import axis_combos, expert_memory, structure_verdict
from hetpar.search.simcost import _probe_model, _probe_replicas
from hetpar.search.structures import ReplicaClass, Slot, Structure
from hetpar.sim import simulate

H100x16 = "gpu=H100-SXM5-80GB,nodes=2,nic_gbps=400"
SMALL = SearchSpace(tp=(1, 2), pp=(1, 2), micro_batch=(1,), recompute=("selective",), zero=(1,),
                    schedule=("1f1b",), vpp=(1,), families=("uniform",), widen_vpp=False)


def _uniform(tp: int, pp: int, dp: int, group: str = "g0") -> Structure:
    ranks = tuple(Slot(group=group, tp=tp) for _ in range(pp))
    return Structure(family="uniform",
                     classes=(ReplicaClass(count=dp, ranks=ranks, layout="dp-inner"),),
                     uniform=(tp, pp, dp), layout="dp-inner")


def test_a_dense_model_searches_ep_and_etp_at_one_only():
    dense = catalog.load_model("llama3.1-8b")
    assert axis_combos(SearchSpace(), dense) == [(("ep", 1), ("etp", 1))]
    assert axis_combos(SearchSpace(), None) == [(("ep", 1), ("etp", 1))]


def test_an_moe_model_searches_the_divisors_of_its_experts_and_etp_only_with_ep():
    mixtral = catalog.load_model("mixtral-8x7b")  # 8 experts of width 14336
    combos = [dict(c) for c in axis_combos(SearchSpace(tp=(1, 2, 4, 8)), mixtral)]
    assert sorted({c["ep"] for c in combos}) == [1, 2, 4, 8]
    assert {c["etp"] for c in combos if c["ep"] == 1} == {1}  # etp repeats ep=1's plan
    assert {c["etp"] for c in combos if c["ep"] == 8} == {1, 2, 4, 8}
    named = SearchSpace(axes={"ep": (2,)})  # a space that names the degrees keeps them
    assert {dict(c)["ep"] for c in axis_combos(named, mixtral)} == {2}


def test_the_mesh_rule_is_checked_on_the_structure():
    mixtral = catalog.load_model("mixtral-8x7b")
    k = Knobs(axes=(("ep", 8), ("etp", 1)))
    assert structure_verdict(_uniform(tp=2, pp=1, dp=4), k, mixtral) is None  # 8 | 4 x 2
    v = structure_verdict(_uniform(tp=1, pp=1, dp=4), k, mixtral)
    assert v is not None and v.name == "expert_split" and "dp(4)" in v.reason
    k2 = Knobs(axes=(("ep", 2), ("etp", 4)))
    v = structure_verdict(_uniform(tp=2, pp=1, dp=4), k2, mixtral)
    assert v is not None and v.name == "expert_tp"


def test_expert_memory_counts_the_routed_experts_over_ep_and_zero():
    # DeepSeek-V3: 58 MoE layers x 256 experts x 3 x 7168 x 2048 = 654e9 routed parameters
    ds = catalog.load_model("deepseek-v3")
    routed = 58 * 256 * 3 * 7168 * 2048
    assert ds.n_experts * formulas.expert_params(ds) * formulas.moe_layers_in(ds, 0, 61) == routed
    cluster = catalog.load_cluster("h100-pod-400g")
    s = _uniform(tp=8, pp=4, dp=32, group="h100")
    # ep=1, ZeRO-1: (2 + 2 + 12 / 32) bytes per parameter / tp 8 = 358 GB > 4 x 80 GiB
    k = Knobs(zero=1, axes=(("ep", 1), ("etp", 1)))
    v = expert_memory(s, k, ds, cluster, "bf16", "adam")
    assert v is not None and v.name == "expert_memory" and v.kind == "memory"
    # ep=32, etp=8 (32 | dp 32): 654e9 / 256 x (4 + 12) bytes = 41 GB < 320 GiB
    k = Knobs(zero=1, axes=(("ep", 32), ("etp", 8)))
    assert expert_memory(s, k, ds, cluster, "bf16", "adam") is None


def test_a_probe_of_a_model_with_leading_dense_layers_is_of_moe_layers():
    ds = catalog.load_model("deepseek-v3")  # first 3 layers dense: a 1-layer cut cannot say so
    for n in (1, 2):
        m = _probe_model(ds, n)
        assert m.n_layers == n and all(m.moe_layer_flags)
    mixtral = catalog.load_model("mixtral-8x7b")
    assert _probe_model(mixtral, 2) == replace(mixtral, n_layers=2)


def test_a_probe_has_the_replicas_ep_needs_beyond_cp_and_tp():
    def key(tp: int, ep: int, etp: int) -> StageKey:
        return StageKey(group="g", tp=tp, axes=(("ep", ep), ("etp", etp)))

    assert _probe_replicas(key(tp=4, ep=8, etp=1)) == 2  # ep carved from dp x tp
    assert _probe_replicas(key(tp=4, ep=8, etp=4)) == 8  # ep carved from dp only
    assert _probe_replicas(key(tp=1, ep=1, etp=1)) == 1


def test_the_planner_picks_ep_on_an_moe_model_whose_experts_need_it():
    # Qwen3-30B-A3B on 16 H100 at ZeRO-1: the unsharded weights and gradients of its 128
    # experts fill a GPU unless EP splits them.
    model = catalog.load_model("qwen3-30b-a3b")
    cluster = catalog.load_cluster(H100x16)
    job = catalog.load_job("gbs=64,seq_len=4096")
    res = search(model, cluster, job, SMALL, workers=1, top=3, polish_top=0)
    best = res.ranked[0].plan
    assert dict(best.axes).get("ep", 1) > 1
    assert f"ep{dict(best.axes)['ep']}" in best.name
    pruned = res.stats.predicates
    assert pruned["expert_split"] > 0 and pruned["expert_tp"] > 0
    assert "expert_split" in res.stats.summary()


def test_an_ep_plan_file_round_trips_through_simulate(tmp_path):
    model = catalog.load_model("qwen3-30b-a3b")
    cluster = catalog.load_cluster(H100x16)
    job = catalog.load_job("gbs=64,seq_len=4096")
    best = search(model, cluster, job, SMALL, workers=1, top=1, polish_top=0).ranked[0]
    path = tmp_path / "plan.toml"
    path.write_text(dump_toml(to_dict(best.plan)))
    again = catalog.load_plan(str(path))
    assert again.axes == best.plan.axes and dict(again.axes)["ep"] > 1
    assert simulate(model, cluster, again, job).tokens_per_s == best.evaluation.tokens_per_s


def test_a_dense_search_generates_no_expert_candidates():
    model = catalog.load_model("llama3.1-8b")
    cluster = catalog.load_cluster(H100x16)
    job = catalog.load_job("gbs=64,seq_len=4096")
    res = search(model, cluster, job, SMALL, workers=1, top=1, polish_top=0)
    assert not any(n.startswith("expert") for n in res.stats.predicates)
    assert all(r.plan.axes == () for r in res.evaluated)


def _ep_domains(cluster_name: str, plan: str, ep: int, etp: int, size: int) -> set[int]:
    """How many ``size``-GPU domains each ep group of the placed plan spans."""
    cluster = catalog.load_cluster(cluster_name)
    mesh = place(catalog.load_model("mixtral-8x7b"), cluster,
                 catalog.parse_inline_plan(plan)).with_experts(ep, etp)
    return {len({mesh.ranks[r].device // size for r in g}) for g in mesh.groups("ep")}


def test_the_ep_group_stays_inside_a_node_when_it_fits_there():
    # The planner's order (Megatron's tp-cp-dp-pp, search.build.ORDER 'dp-inner') puts ep
    # innermost of the sharded ranks: ep x etp consecutive GPUs (etp = tp: ep dp-peers, tp
    # apart; etp = 1: ep ranks of dp x tp, one apart), so ep <= gpus per node / etp.
    for tp in (1, 2, 4, 8):
        for etp in sorted({1, tp}):
            for ep in (e for e in (1, 2, 4, 8) if e * etp <= 8):
                plan = f"tp={tp},pp=2,dp={64 // tp},gbs={64 // tp},ep={ep},etp={etp}"
                assert _ep_domains("h100-pod-400g", plan, ep, etp, 8) == {1}, plan


def test_the_ep_group_stays_inside_an_nvl32_domain_when_it_fits_there():
    # B200 NVL32: 4 GPUs per tray-node, 32 per NVLink domain; ep=8 x tp=4 fills one domain.
    plan = "tp=4,pp=1,dp=16,gbs=16,ep=8,etp=4"
    assert _ep_domains("b200-nvl32-32k", plan, 8, 4, 32) == {1}
    assert _ep_domains("b200-nvl32-32k", plan, 8, 4, 4) == {8}  # ... across its nodes


def test_zero_shards_the_expert_share_of_a_layer_over_the_expert_data_parallel_peers():
    state = StateBytes(params=10.0, grads=10.0, optimizer=60.0)
    experts = StateBytes(params=8.0, grads=8.0, optimizer=48.0)
    sc = StageCost(layer_time_s=1.0, embed_time_s=0.0, head_time_s=0.0, layer_state=state,
                   embed_state=state, head_state=state, layer_activation_bytes=0.0,
                   fixed_bytes=0.0, capacity_bytes=1.0, expert_state=experts)
    # ZeRO-1 over dp 8 (dense: 2 + 2 + 12 / 8) and edp 2 (experts: 8 + 8 + 48 / 2)
    assert sc.layer_bytes(1, 8, 2) == 2 + 2 + 12 / 8 + 8 + 8 + 24
    assert replace(sc, expert_state=None).layer_bytes(1, 8, 2) == 10 + 10 + 60 / 8
    # edp = dp x cp x tp / (ep x etp): 8 x 2 / (4 x 2) and 8 x 2 / (4 x 1)
    assert expert_dp(Knobs(axes=(("ep", 4), ("etp", 2))), 8, 2) == 2
    assert expert_dp(Knobs(axes=(("ep", 4), ("etp", 1))), 8, 2) == 4
    assert expert_dp(Knobs(axes=(("ep", 1), ("etp", 1))), 8, 2) == 8


def test_expert_memory_prunes_only_even_plans_the_simulator_finds_out_of_memory():
    # The rule is a lower bound on the even split's memory (the only split its candidates
    # state): every Mixtral-8x7B plan on 16 H100 it prunes is an OOM for the simulator
    # (measured: 5 of 32 pruned, 12 OOM), so it never removes a plan that fits.
    model = catalog.load_model("mixtral-8x7b")
    cluster = catalog.load_cluster(H100x16)
    job = catalog.load_job("gbs=16,seq_len=4096")
    group = cluster.node_groups[0].name
    pruned = kept_oom = 0
    for tp, pp in ((1, 1), (1, 2), (2, 1), (2, 2)):
        dp = 16 // (tp * pp)
        for ep in (e for e in (1, 2, 4, 8) if dp * tp % e == 0):
            for zero in (1, 3):
                k = Knobs(zero=zero, axes=(("ep", ep), ("etp", 1)))
                v = expert_memory(_uniform(tp, pp, dp, group), k, model, cluster, "bf16", "adam")
                plan = catalog.parse_inline_plan(
                    f"tp={tp},pp={pp},dp={dp},gbs=16,mbs=1,zero={zero},ep={ep}")
                oom = simulate(model, cluster, plan, job).oom
                assert v is None or oom, (tp, pp, dp, ep, zero)
                pruned += v is not None
                kept_oom += v is None and oom
    assert pruned >= 4 and kept_oom >= 4  # both sides of the bound are exercised
