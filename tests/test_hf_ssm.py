"""State-space and hybrid families (Mamba, Mamba-2, Jamba, Nemotron-H): FLOPs by hand, the
layer kinds the configs set, and the parallel axes hetpar refuses for their SSM layers."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from hetpar import feasibility
from hetpar import formulas as F
from hetpar.catalog import load_cluster, load_gpu
from hetpar.cli.main import main
from hetpar.errors import ConfigError, Infeasible
from hetpar.formulas import ssm as ssm_formulas
from hetpar.hf.convert import model_from_hf_config
from hetpar.sim.core import simulate
from hetpar.sim.layer import layer_time
from hetpar.specs.plan import Plan
from hetpar.specs.ssm import SsmSpec

FIX = Path(__file__).parent / "fixtures" / "hf"


def load(name: str) -> dict[str, object]:
    return json.loads((FIX / f"{name}.json").read_text())


def test_mamba_flops_by_hand() -> None:
    """Mamba-130m: per layer in_proj 768 x 3072, x_proj 1536 x 80, dt_proj 48 x 1536,
    out_proj 1536 x 768; conv 2 x 4 x 1536; scan 7 x 1536 x 16; the head 2 x 768 x 50280."""
    m = model_from_hf_config(load("mamba-130m"), "mamba-130m")
    proj = 768 * 3072 + 1536 * 80 + 48 * 1536 + 1536 * 768
    layer = 2 * proj + 2 * 4 * 1536 + 7 * 1536 * 16
    assert F.model_flops_per_token(m, 2048) == 3 * (24 * layer + 2 * 768 * 50280)
    assert F.attention_core_flops_per_token(m, 2048) == 0  # no layer attends


def test_mamba2_scan_flops_by_hand() -> None:
    """SSD per token: 2 Q (G N + I) + 4 N I plus the conv 2 K (I + 2 G N)."""
    s = SsmSpec(kind="mamba2", inner=8192, heads=128, groups=8, state_size=128, conv_width=4,
                chunk=256)
    conv = 2 * 4 * (8192 + 2 * 8 * 128)
    ssd = 2 * 256 * (8 * 128 + 8192) + 4 * 128 * 8192
    assert ssm_formulas.ssm_core_flops_per_token(s) == conv + ssd


def test_jamba_layers_and_experts() -> None:
    """Jamba-v0.1: attention on layers 4, 12, 20, 28; MoE on the odd layers."""
    m = model_from_hf_config(load("jamba-v0.1"), "jamba")
    assert [i for i, k in enumerate(m.kinds) if k == "attention+mlp"] == [4, 12, 20, 28]
    assert m.moe_layer_flags == tuple(i % 2 == 1 for i in range(32))
    assert (m.ssm is not None and m.ssm.dt_norms and m.ssm.dt_rank == 256)
    # only the 4 attention layers attend: the mean over 32 layers is an eighth of one
    one = 2.0 * 4096 * (32 * 128 + 32 * 128)
    assert F.attention_core_flops_per_token(m, 4096) == one * 4 / 32


def test_nemotron_h_pattern_sets_the_layers() -> None:
    m = model_from_hf_config(load("nemotron-h-8b"), "nemotron-h")
    assert m.n_layers == 52 and m.kinds.count("attention") == 4
    assert m.kinds.count("ssm") == 24 and m.kinds.count("mlp") == 24
    with pytest.raises(ConfigError, match="block 'X' is not representable"):
        model_from_hf_config({**load("nemotron-h-8b"), "hybrid_override_pattern": "M*X-"}, "x")


@pytest.mark.parametrize(("blocks", "n_moe"), [
    ({"hybrid_override_pattern": "ME*E"}, 2),
    ({"layers_block_type": ["mamba", "moe", "attention", "mlp"]}, 1)])
def test_nemotron_h_moe_blocks_match_transformers(blocks: dict[str, object], n_moe: int) -> None:
    """Nemotron-H's E blocks (squared-ReLU experts, sigmoid router with a buffer bias, a
    shared MLP), in a tiny config: exact against transformers on the meta device."""
    transformers = pytest.importorskip("transformers", reason="oracle extra")
    torch = pytest.importorskip("torch", reason="runtime extra")
    data = {"model_type": "nemotron_h", "hidden_size": 64, "vocab_size": 100,
            "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2,
            "mamba_num_heads": 8, "mamba_head_dim": 16, "ssm_state_size": 8, "n_groups": 2,
            "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 24,
            "moe_shared_expert_intermediate_size": 40, **blocks}
    with torch.device("meta"):
        ref = transformers.AutoModelForCausalLM.from_config(
            transformers.AutoConfig.for_model(**data))
    m = model_from_hf_config(data, "tiny-nemotron-h-moe")
    assert (m.router, m.router_expert_bias, m.moe_layer_flags.count(True)) == (
        "sigmoid", True, n_moe)
    assert F.params(m) == sum(p.numel() for p in ref.parameters())


@pytest.mark.parametrize("name", ["mamba-130m", "jamba-v0.1", "nemotron-h-8b"])
def test_tp_and_cp_refused_naming_the_axis_and_the_layer_kind(name: str) -> None:
    m = model_from_hf_config(load(name), name)
    v = feasibility.tp_shards(m, 2)
    assert not v.ok and "tp=2" in v.reason and "ssm layers" in v.reason
    v = feasibility.context_split(4096, 2, m)
    assert not v.ok and "cp=2" in v.reason and "ssm layers" in v.reason
    assert feasibility.tp_shards(m, 1).ok and feasibility.context_split(4096, 1, m).ok


def test_layer_kinds_checked() -> None:
    m = model_from_hf_config(load("mamba-130m"), "mamba")
    with pytest.raises(ConfigError, match="layer_kinds must list 24 layers"):
        replace(m, layer_kinds=("ssm",))
    with pytest.raises(ConfigError, match="ssm must be given exactly"):
        replace(m, ssm=None)


@pytest.mark.parametrize(("name", "dp"), [("mamba-130m", 1), ("mamba-130m", 8),
                                          ("jamba-v0.1", 8), ("nemotron-h-8b", 8)])
def test_simulate_single_gpu_and_dp_plans(name: str, dp: int) -> None:
    """simulate times Mamba and hybrid models on one GPU and data-parallel: the report's model
    FLOPs are the formulas' (the conv and scan included) and TP is refused as in the CLI."""
    m = model_from_hf_config(load(name), name)
    cluster = load_cluster("selene-a100")
    plan = Plan(tp=1, pp=1, dp=dp, micro_batch=1, global_batch=8, precision="bf16")
    r = simulate(m, cluster, plan)
    assert r.iteration_time_s > 0
    assert r.model_flops_per_iter == pytest.approx(8 * m.seq_len
                                                   * F.model_flops_per_token(m, m.seq_len))
    with pytest.raises(Infeasible, match="tp=2 cannot split the ssm layers"):
        simulate(m, cluster, replace(plan, tp=2, dp=dp // 2 or 1))


def test_scan_time_is_charged() -> None:
    """A Mamba layer's time includes its conv and scan (roofline of FLOPs and HBM bytes):
    a larger state makes the layer slower while its projections stay the same."""
    m = model_from_hf_config(load("mamba-130m"), "mamba-130m")
    assert m.ssm is not None
    big = replace(m, ssm=replace(m.ssm, state_size=256))
    gpu = load_gpu("A100-SXM4-80GB")
    t = [layer_time(x, gpu, "bf16", 1, 2048, 1, 1, False).fwd for x in (m, big)]
    assert t[1] > t[0]


def test_mamba_activation_bytes_by_hand() -> None:
    """One Mamba-130m layer keeps its norm input and output (2 h) and 5 I + R + 2 N elements
    per token in bf16 (formulas.ssm.ssm_activation_elements), no attention scores."""
    m = model_from_hf_config(load("mamba-130m"), "mamba-130m")
    got = F.activation_bytes_per_layer(m, 2048, 1, dropout=False)
    assert got == 2 * 2048 * (2 * 768 + 5 * 1536 + 48 + 2 * 16)


@pytest.mark.parametrize(("argv", "says"), [
    (["simulate", "--cluster", "selene-a100", "--plan", "tp=2,dp=4,mbs=1,gbs=8"],
     "tp=2 cannot split the ssm layers of model"),
    (["simulate", "--cluster", "selene-a100", "--plan", "cp=2,dp=4,mbs=1,gbs=8"],
     "cp=2 cannot split the ssm layers of model"),
    (["export", "--plan", "dp=8,gbs=8", "--to", "megatron"], "the exports write attention+mlp"),
    (["run", "--plan", "dp=1,gbs=8", "--dry-run"],
     "does not build layers other than attention+mlp (layer_kinds: ssm)"),
])
def test_cli_refuses_in_one_line(argv: list[str], says: str, tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    extra = ["--out", str(tmp_path / "x")] if argv[0] == "export" else []
    assert main([*argv, "--model", str(FIX / "mamba-130m.json"), "--quiet", *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert says in err[-1] and not list(tmp_path.iterdir()), err


def test_the_planner_refuses_per_layer_lists_in_one_line() -> None:
    """The planner's probes resize the model to 1 and 2 layers, which layer_kinds cannot
    follow: a ConfigError naming the field, not an error from inside ModelSpec."""
    from hetpar.search.simcost import SimCostModel
    from hetpar.specs.job import Job

    m = model_from_hf_config(load("jamba-v0.1"), "jamba")
    with pytest.raises(ConfigError, match="sets layer_kinds .one entry per layer."):
        SimCostModel(m, load_cluster("selene-a100"), Job(global_batch=8))


@pytest.mark.parametrize("name", ["tiny-moe", "jamba-v0.1", "nemotron-h-8b", "mamba-130m"])
def test_the_layer_mix_times_every_layers_flops(name: str) -> None:
    """sim/layer.py mixes a hybrid model's parts so that the dense and MoE layer times, mixed
    by the MoE layers' count as sim/chunk.py does, carry the formulas' FLOPs of all layers."""
    data = {"model_type": "nemotron_h", "hidden_size": 64, "vocab_size": 100,
            "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2,
            "hybrid_override_pattern": "ME*E-M", "mamba_num_heads": 8, "mamba_head_dim": 16,
            "ssm_state_size": 8, "n_groups": 2, "n_routed_experts": 4, "num_experts_per_tok": 2,
            "moe_intermediate_size": 24, "moe_shared_expert_intermediate_size": 40} \
        if name == "tiny-moe" else load(name)
    m = model_from_hf_config(data, name)
    gpu, seq = load_gpu("A100-SXM4-80GB"), 4096
    k, n = sum(m.moe_layer_flags), m.n_layers
    dense, moe = (layer_time(m, gpu, "bf16", 1, seq, 1, 1, False, moe=e).fwd_flops
                  for e in (False, True))
    mean = sum(F.layer_forward_flops_per_token(m, seq, i) for i in range(n)) * seq / n
    assert ((n - k) * dense + k * moe) / n == pytest.approx(mean, rel=1e-12)


def test_jamba_with_one_expert_is_dense_like_transformers() -> None:
    """Jamba's num_experts 1 builds a dense MLP on every layer (JambaConfig.layers_num_experts),
    not a refused 1-expert MoE."""
    transformers = pytest.importorskip("transformers", reason="oracle extra")
    torch = pytest.importorskip("torch", reason="runtime extra")
    data = {"model_type": "jamba", "hidden_size": 64, "intermediate_size": 96,
            "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
            "vocab_size": 100, "num_experts": 1, "attn_layer_period": 4, "attn_layer_offset": 2}
    with torch.device("meta"):
        ref = transformers.AutoModelForCausalLM.from_config(
            transformers.AutoConfig.for_model(**data))
    m = model_from_hf_config(data, "tiny-jamba")
    assert m.n_experts == 1 and m.kinds.count("attention+mlp") == 1
    assert F.params(m) == sum(p.numel() for p in ref.parameters())
