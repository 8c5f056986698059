"""What of a model hetpar's runtime decoder does not build: `hetpar run` refuses it by field."""

from __future__ import annotations

from hetpar.specs import dense_rules
from hetpar.specs.model import ModelSpec


def decoder_gaps(m: ModelSpec) -> list[str]:
    """What of ``m`` hetpar's runtime decoder (runtime/model.py) does not build, field by field:
    `hetpar run` and the DeepSpeed export's train module refuse such a model (a runtime limit,
    not a verdict on the plan: simulate, plan and the other exports take it).

    The decoder has dense MLPs (GELU / SwiGLU) or mixture-of-experts ones (softmax router,
    dropless, optional shared expert: runtime/moe.py), two LayerNorm or RMSNorm per layer and
    a final norm, learned or rotary positions, biases on all linear layers or none, tied or untied
    embeddings as wide as the hidden size; tests/test_runtime_param_count.py checks this list
    against the parameters it builds.
    """
    gaps = _router_gaps(m) if m.n_experts > 1 else []
    if m.qkv_bias is not None and m.qkv_bias != m.bias:
        gaps.append(f"Q/K/V biases apart from the other linear layers (qkv_bias={m.qkv_bias}, "
                    f"bias={m.bias})")
    if m.embed_dim is not None and m.embed_dim != m.hidden:
        gaps.append(f"a word embedding narrower than the hidden size (embed_dim={m.embed_dim})")
    if m.norms_per_layer != 2:
        gaps.append(f"norms_per_layer={m.norms_per_layer} (allowed: 2)")
    if m.qk_norm:
        gaps.append("query/key norms (qk_norm=true)")
    if not m.final_norm:
        gaps.append("a model without a final norm (final_norm=false)")
    if m.position == "alibi":
        gaps.append("ALiBi positions (position='alibi'; allowed: learned, rope)")
    if m.attention != "gqa":
        gaps.append(f"multi-head latent attention (attention={m.attention!r}; allowed: gqa)")
    if m.attention_sinks:
        gaps.append("attention sinks (attention_sinks=true)")
    if m.sliding_window is not None:
        gaps.append(f"sliding-window attention (sliding_window={m.sliding_window})")
    if m.layer_kinds is not None:
        gaps.append(f"layers other than attention+mlp (layer_kinds: "
                    f"{', '.join(sorted(set(m.layer_kinds)))})")
    return gaps + dense_rules.runtime_gaps(m)  # the dense families' rules (specs/dense_rules.py)


def _router_gaps(m: ModelSpec) -> list[str]:
    """The routing an MoE model asks for that the decoder's (runtime/moe.py: softmax, top-k
    renormalised, dropless) is not."""
    gaps = []
    if m.router != "softmax":
        gaps.append(f"a {m.router} router (router={m.router!r}; allowed: softmax)")
    if m.router_expert_bias:
        gaps.append("a load-balancing expert bias on the scores (router_expert_bias=true)")
    if m.expert_capacity_factor is not None:
        gaps.append(f"token dropping (expert_capacity_factor={m.expert_capacity_factor}; "
                    "the decoder is dropless)")
    return gaps
