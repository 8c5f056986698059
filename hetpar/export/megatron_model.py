"""Megatron-LM model-shape arguments (pretrain_gpt.py builds the GPT model from these)."""

from __future__ import annotations

from hetpar.specs import dense_rules
from hetpar.specs.model import ModelSpec

VOCAB_DIVISIBLE_BY = 128
"""Megatron-LM's --make-vocab-size-divisible-by default (arguments.py), which the export states:
the vocabulary is padded to a multiple of it x TP (catalog/frameworks/megatron-*.toml)."""


def vocab_note(model: ModelSpec, tp: int) -> str:
    """The header line saying how many vocabulary rows Megatron builds at TP degree ``tp``."""
    multiple = VOCAB_DIVISIBLE_BY * tp
    rows = -(-model.vocab // multiple) * multiple  # tokenizer.py::_vocab_size_with_padding
    return (f"vocabulary: {model.vocab} tokens padded to {rows} rows (a multiple of "
            f"--make-vocab-size-divisible-by {VOCAB_DIVISIBLE_BY} x tp {tp}, "
            "megatron/training/tokenizer/tokenizer.py::_vocab_size_with_padding); hetpar's "
            "Megatron frameworks count the padded rows")


def model_arguments(model: ModelSpec) -> list[str]:
    """Model-shape arguments (Megatron builds the GPT model from these)."""
    a = [
        "--num-layers",
        str(model.n_layers),
        "--hidden-size",
        str(model.hidden),
        "--ffn-hidden-size",
        str(model.ffn_hidden),
        "--num-attention-heads",
        str(model.n_heads),
    ]
    if model.n_kv_heads < model.n_heads:
        a += ["--group-query-attention", "--num-query-groups", str(model.n_kv_heads)]
    if model.head_dim is not None and model.head_dim * model.n_heads != model.hidden:
        a += ["--kv-channels", str(model.head_dim)]
    a += [
        "--seq-length",
        str(model.seq_len),
        "--max-position-embeddings",
        str(max(model.max_positions or 0, model.seq_len)),
        # NullTokenizer's vocab_size is --vocab-size + 1 (its EOD id, tokenizer.py::
        # _NullTokenizer), which Megatron then pads: V - 1 gives the model's V tokens
        "--vocab-size",
        str(max(model.vocab - 1, 1)),
        "--make-vocab-size-divisible-by",
        str(VOCAB_DIVISIBLE_BY),
    ]
    a += ["--swiglu"] if model.mlp == "swiglu" else []
    a += ["--squared-relu"] if model.mlp == "relu2" else []  # arguments.py, Nemotron
    a += ["--rotary-percent", str(model.rotary_fraction)] if model.rotary_fraction != 1 else []
    a += ["--normalization", "RMSNorm" if model.norm == "rmsnorm" else "LayerNorm"]
    a += [
        "--position-embedding-type",
        "learned_absolute" if model.position == "learned" else "rope",
    ]
    a += [] if model.tied_embeddings else ["--untie-embeddings-and-output-weights"]
    a += [] if model.bias else ["--disable-bias-linear"]
    a += ["--add-qkv-bias"] if model.qkv_bias and not model.bias else []
    a += ["--qk-layernorm"] if model.qk_norm else []
    if model.n_experts > 1:
        a += [
            "--num-experts",
            str(model.n_experts),
            "--moe-router-topk",
            str(model.experts_per_token),
            "--moe-layer-freq",
            _moe_layer_freq(model),
        ]
        # Qwen-MoE (config.json moe_intermediate_size, shared_expert_intermediate_size); unset,
        # Megatron's experts are --ffn-hidden-size wide, as hetpar's (ModelSpec.expert_ffn)
        if model.moe_ffn_hidden is not None:
            a += ["--moe-ffn-hidden-size", str(model.moe_ffn_hidden)]
        if model.shared_expert_ffn_hidden is not None:
            a += ["--moe-shared-expert-intermediate-size", str(model.shared_expert_ffn_hidden)]
    return a


def _moe_layer_freq(model: ModelSpec) -> str:
    """Megatron's --moe-layer-freq: an integer k (layer i is MoE when i % k == 0), or a Python
    list of 0/1 flags per layer (megatron/training/arguments.py::moe_freq_type) where dense
    layers come first (DeepSeek-V3's first_k_dense_replace) or the pattern is explicit."""
    if model.moe_layer_pattern is None and model.first_dense_layers == 0:
        return str(model.moe_layer_interval)
    return "[" + ",".join(str(int(f)) for f in model.moe_layer_flags) + "]"


def model_losses(model: ModelSpec) -> list[str]:
    """Model features Megatron-LM's GPT model has no argument for (it builds without them)."""
    lost = []
    if model.position == "alibi":
        lost.append("ALiBi positions are not in Megatron-LM core -> rope")
    if model.embed_dim not in (None, model.hidden):
        lost.append(f"word embeddings {model.embed_dim} wide with projections -> hidden-wide")
    if model.qkv_bias is False and model.bias:
        lost.append("bias-free Q/K/V with other biases -> biases everywhere")
    if model.norm == "layernorm" and not model.norm_has_bias:
        # megatron/core/fusions/fused_layer_norm.py::FusedLayerNorm (and TE's LayerNorm) always
        # hold a bias; --disable-bias-linear reaches the linear layers only
        lost.append("bias-free LayerNorms -> LayerNorms with biases")
    if model.norms_per_layer != 2:
        lost.append(f"{model.norms_per_layer} norms per layer -> 2")
    if not model.final_norm:
        lost.append("no final norm (post-LN) -> a final norm")
    if model.shared_expert_gate:
        # _add_moe_args at the cited commit has no --moe-shared-expert-gate (later Megatron-LM
        # and megatron-core 0.16's TransformerConfig.moe_shared_expert_gate do)
        lost.append("shared_expert_gate: the sigmoid gate h -> 1 on the shared expert "
                    "(Qwen2-MoE) has no argument at this commit -> an ungated shared expert")
    # the dense families' rules with no Megatron-LM argument here (specs/dense_rules.py)
    return lost + _attention_losses(model) + dense_rules.export_losses(model)


def _attention_losses(model: ModelSpec) -> list[str]:
    """Attention and router features this export does not write (hetpar counts them; the
    exported model would be built without them)."""
    lost = []
    if model.attention == "mla":
        lost.append("multi-head latent attention (q/kv LoRA ranks) is not exported -> "
                    "standard attention of n_heads x hidden / n_heads")
    if model.attention_sinks:
        lost.append("attention sinks (GPT-OSS) are not exported -> none")
    if model.sliding_window is not None:
        lost.append(f"the {model.sliding_window}-token sliding window on every layer but each "
                    f"{model.full_attention_interval}-th is not exported -> full attention")
    if model.router_bias or model.router != "softmax" or model.router_expert_bias:
        lost.append(f"the router (scores {model.router}, bias {model.router_bias}, aux-free "
                    f"expert bias {model.router_expert_bias}) is not exported -> a softmax router")
    return lost
