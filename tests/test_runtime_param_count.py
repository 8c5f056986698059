"""hetpar's analytic parameter count (``formulas``) equals what the runtime decoder builds.

The runtime (``hetpar run``) builds a model from ``runtime.model.param_infos``: tiny specs are
built for real by the single-process reference (``runtime.trainer.reference`` with no steps),
catalog models at full size as meta tensors of the same shapes (no memory). Either way the
sum of ``numel`` must equal ``formulas.params`` to the parameter, for the whole model and for
each pipeline stage as the simulator's memory model counts it.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import replace
from pathlib import Path

import pytest

from hetpar import formulas as F
from hetpar.catalog import load_model, names
from hetpar.errors import ConfigError
from hetpar.specs.model import ModelSpec

torch = pytest.importorskip("torch", reason="the runtime extra: pip install -e .[runtime]")
# hetpar's own modules (they need torch): a broken import fails, it is no skip
M = importlib.import_module("hetpar.runtime.model")
trainer = importlib.import_module("hetpar.runtime.trainer")
worker = importlib.import_module("hetpar.runtime.worker")

GPT = load_model("tiny-gpt")  # LayerNorm, GELU, learned positions, biases, untied
LLAMA = load_model("tiny-llama")  # RMSNorm, SwiGLU, rope, GQA, no biases, untied
NTP = load_model("ntp-480b")  # LayerNorm, GELU, rope, no biases: the 4,116,480 gap
SMALL = {"n_layers": 3, "hidden": 64, "n_heads": 4, "n_kv_heads": 4, "ffn_hidden": 256,
         "vocab": 96, "seq_len": 16}

# each spec's flags, at tiny sizes the runtime can build on a CPU
VARIANTS: dict[str, ModelSpec] = {
    "tiny-gpt": GPT,
    "tiny-gpt-tied": replace(GPT, tied_embeddings=True),
    "tiny-llama": LLAMA,
    "tiny-llama-tied-mqa": replace(LLAMA, tied_embeddings=True, n_kv_heads=1),
    "tiny-llama-head-dim": replace(LLAMA, head_dim=2 * LLAMA.dim_head),
    "ntp-480b-flags": replace(NTP, **SMALL),  # bias-free LayerNorm
    "layernorm-bias-free-learned": replace(GPT, bias=False),
    "layernorm-bias-free-swiglu": replace(LLAMA, norm="layernorm"),
    "layernorm-norm-bias-only": replace(GPT, bias=False, norm_bias=True),  # OPT enable_bias off
    "layernorm-linear-bias-only": replace(GPT, norm_bias=False),
    "rmsnorm-with-biases": replace(LLAMA, bias=True),  # RMSNorm still has no bias
    "gelu-rmsnorm-tied": replace(GPT, norm="rmsnorm", tied_embeddings=True),
    "learned-table-past-seq-len": replace(GPT, max_positions=GPT.seq_len + 2),  # OPT's offset
    "tiny-moe": load_model("tiny-moe"),  # a dense first layer, shared gated expert
    # GELU experts with biases, a router bias (GPT-OSS), every other layer MoE
    "moe-gelu-biases": replace(GPT, n_experts=4, experts_per_token=2, moe_layer_interval=2,
                               router_bias=True, moe_ffn_hidden=32),
}

# catalog models with features the runtime decoder lacks (its count would not be theirs)
LACKING = {"gpt-neo-2.7b": "bias-free Q/K/V with other biases",
           "opt-350m": "a narrower word embedding, no final norm",
           "deepseek-v3": "MLA, a sigmoid router", "qwen3-30b-a3b": "QK-norm",
           "qwen3-235b-a22b": "QK-norm", "gpt-oss-20b": "sinks, sliding window",
           "gpt-oss-120b": "sinks, sliding window",
           "jamba-v0.1": "Mamba layers, MoE", "nemotron-h-8b": "Mamba-2 layers, one-part layers"}


def _runtime_lacks(m: ModelSpec) -> str:
    """The features of ``m`` the runtime decoder does not build ('' when it builds them all):
    ``feasibility.decoder_gaps``, which `hetpar run` refuses (the DeepSpeed export's
    ``script_gap`` adds MoE, which its train module does not run)."""
    from hetpar.feasibility import decoder_gaps

    return "; ".join(decoder_gaps(m))


def _numel(m: ModelSpec, layers: range, first: bool, last: bool) -> int:
    """Elements of the meta tensors of the chunk ``param_infos`` describes."""
    infos = M.param_infos(m, layers, first, last)
    return sum(torch.empty(i.shape, device="meta").numel() for i in infos.values())


def test_the_excluded_catalog_models_are_those_the_runtime_cannot_build() -> None:
    lacking = {n for n in names("models") if _runtime_lacks(load_model(n))}
    assert lacking == set(LACKING)


@pytest.mark.parametrize("name", sorted(set(names("models")) - set(LACKING)))
def test_catalog_model_count_is_the_runtime_decoders(name: str) -> None:
    m = load_model(name)
    assert _numel(m, range(m.n_layers), True, True) == F.params(m)


def _hf_models() -> dict[str, ModelSpec]:
    from hetpar.hf.convert import model_from_hf_config
    from hetpar.io import read_document

    fixtures = sorted((Path(__file__).parent / "fixtures" / "hf").glob("*.json"))
    return {p.stem: model_from_hf_config(read_document(p), p.stem) for p in fixtures}


HF = {n: m for n, m in _hf_models().items() if not _runtime_lacks(m)}


def test_some_hf_fixtures_are_buildable() -> None:
    # opt-125m: LayerNorms with biases and a learned table of 2050 rows for 2048 positions;
    # Pythia and GPT-NeoX are not: their parallel residual and rotary_pct 0.25 the decoder
    # does not build (feasibility.decoder_gaps), though it held as many parameters
    assert {"gpt2", "llama-3.1-8b", "opt-125m", "mistral-7b"} <= set(HF)
    assert "pythia-160m" not in HF and "parallel attention" in _runtime_lacks(
        _hf_models()["pythia-160m"])


@pytest.mark.parametrize("name", sorted(HF))
def test_hf_fixture_count_is_the_runtime_decoders(name: str) -> None:
    """Where the runtime decoder has every feature of a Hugging Face config, it builds the
    count hetpar gives, which tests/test_hf_parity.py checks against transformers."""
    m = HF[name]
    assert _numel(m, range(m.n_layers), True, True) == F.params(m)


def test_ntp_480b_has_no_layernorm_biases() -> None:
    """bias = false: no LayerNorm biases either ((2 x 100 + 1) norms x 20480 fewer than a
    LayerNorm with biases would hold), as torch.nn.LayerNorm(bias=False) builds."""
    with_biases = replace(NTP, norm_bias=True)
    assert F.params(with_biases) - F.params(NTP) == (2 * NTP.n_layers + 1) * NTP.hidden
    assert F.params(with_biases) - F.params(NTP) == 4_116_480
    assert not any(k.endswith(".b") for k in M.param_infos(NTP, range(1), True, True))


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_the_built_reference_model_has_the_analytic_count(name: str) -> None:
    m = VARIANTS[name]
    assert not _runtime_lacks(m)
    _, params = trainer.reference(m, 1, 0, worker.RunConfig())  # built, not trained
    assert sum(p.numel() for p in params.values()) == F.params(m)


@pytest.mark.parametrize("name", sorted(VARIANTS))
@pytest.mark.parametrize("split", [1, 2])
def test_each_pipeline_stage_holds_what_the_memory_model_counts(name: str, split: int) -> None:
    """Two stages [0, split) and [split, L): the first adds the embeddings, the last the final
    norm and LM head (a copy of a tied embedding), as sim/chunk.py::chunk_params counts."""
    m = VARIANTS[name]
    first = F.embedding_params(m) + F.layers_params(m, 0, split)
    last = F.layers_params(m, split, m.n_layers) + F.output_params(m)
    assert _numel(m, range(split), True, False) == first
    assert _numel(m, range(split, m.n_layers), False, True) == last


def test_norm_bias_needs_a_layernorm() -> None:
    with pytest.raises(ConfigError, match="norm_bias = true needs norm = 'layernorm'"):
        replace(LLAMA, norm_bias=True)


def test_a_learned_table_needs_a_row_per_position() -> None:
    with pytest.raises(ConfigError, match=r"max_positions \(8\) must be >= seq_len \(16\)"):
        replace(GPT, max_positions=8, seq_len=16)
    assert replace(LLAMA, max_positions=8, seq_len=16).max_positions == 8  # rope: no table


def test_a_table_past_seq_len_trains() -> None:
    """The first seq_len rows of a longer learned table embed the positions."""
    losses, _ = trainer.reference(VARIANTS["learned-table-past-seq-len"], 2, 1,
                                  worker.RunConfig())
    assert len(losses) == 1 and math.isfinite(losses[0])


def test_run_refuses_exactly_the_models_the_decoder_cannot_build() -> None:
    """`hetpar run`'s refusal list (feasibility.decoder_gaps) names a model exactly when the
    decoder's parameter count is not hetpar's (ALiBi has no parameters: named on its own)."""
    from hetpar.feasibility import decoder_gaps

    lacking = {  # one spec per refused feature, at a size the check is quick for
        "qk-norm": replace(LLAMA, qk_norm=True), "four-norms": replace(LLAMA, norms_per_layer=4),
        "alibi": replace(GPT, position="alibi"),
        "sinks": replace(LLAMA, attention_sinks=True),
        "sliding": replace(LLAMA, sliding_window=8, full_attention_interval=2),
        # routing the MoE layer (runtime/moe.py) does not do: no parameters differ
        "sigmoid-router": replace(VARIANTS["tiny-moe"], router="sigmoid"),
        "expert-bias": replace(VARIANTS["tiny-moe"], router_expert_bias=True),
        "dropping": replace(VARIANTS["tiny-moe"], expert_capacity_factor=1.25),
        "mla": replace(LLAMA, n_kv_heads=LLAMA.n_heads, attention="mla", kv_lora_rank=8,
                       qk_rope_head_dim=4, qk_nope_head_dim=8, v_head_dim=8),
    }
    models = {n: load_model(n) for n in names("models")} | _hf_models() | VARIANTS | lacking
    for name, m in models.items():
        differs = _numel(m, range(m.n_layers), True, True) != F.params(m)
        # named on their own: rules that hold no parameters (hetpar/hf/dense.py's included)
        no_params = (m.position == "alibi" or m.sliding_window is not None
                     or m.parallel_attention or m.rotary_fraction != 1 or m.mlp == "relu2"
                     or m.attention_multiplier is not None
                     or (m.n_experts > 1 and (m.router != "softmax" or m.router_expert_bias
                                              or m.expert_capacity_factor is not None))
                     or (m.embedding_multiplier, m.residual_multiplier, m.logit_scale)
                     != (1.0, 1.0, 1.0))
        assert bool(decoder_gaps(m)) == (differs or no_params), name


def test_run_dry_run_refuses_a_model_it_would_train_as_another(capsys) -> None:
    from hetpar.cli.main import main

    for extra in (["--dry-run"], ["--steps", "1"]):  # before the plan's or memory's verdicts
        assert main(["run", "--model", "qwen3-30b-a3b", "--plan", "dp=1,gbs=1", *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and "query/key norms (qk_norm=true)" in err
