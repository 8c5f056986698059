"""The dense families' structural rules (hetpar/hf/dense.py) as one table, worded per reader."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hetpar.specs.model import ModelSpec

Phrase = Callable[[ModelSpec], str]


@dataclass(frozen=True, kw_only=True)
class DenseRule:
    """One rule a dense family may set on a model (the fields hetpar/hf/dense.py fills).

    ``applies``: whether ``m`` asks for it; ``runtime``: the phrase with which hetpar's runtime
    decoder refuses it (``feasibility.decoder_gaps``), None where the decoder builds it or
    refuses it by a wider rule; ``export``: the Megatron-LM export's loss line ("what -> what it
    builds instead", ``export/megatron_model.py``), None where Megatron-LM has an argument for
    it.
    """

    name: str
    applies: Callable[[ModelSpec], bool]
    runtime: Phrase | None
    export: Phrase | None


def _multipliers(m: ModelSpec) -> list[str]:
    """The scalar multipliers (Granite's) that differ from a plain decoder's."""
    scalars = {"embedding_multiplier": m.embedding_multiplier, "logit_scale": m.logit_scale,
               "residual_multiplier": m.residual_multiplier}
    changed = [f"{k}={v}" for k, v in scalars.items() if v != 1.0]
    if m.attention_multiplier is not None:
        changed.append(f"attention_multiplier={m.attention_multiplier}")
    return changed


RULES: tuple[DenseRule, ...] = (
    DenseRule(name="relu2", applies=lambda m: m.mlp == "relu2",
              runtime=lambda m: "a squared-ReLU MLP (mlp='relu2'; allowed: gelu, swiglu)",
              export=None),  # --squared-relu (arguments.py, Nemotron)
    DenseRule(name="parallel_attention", applies=lambda m: m.parallel_attention,
              runtime=lambda m: "parallel attention and MLP (parallel_attention=true)",
              export=lambda m: "parallel attention and MLP -> sequential"),
    DenseRule(name="attention_bias",
              applies=lambda m: m.attention_bias is not None and m.attention_bias != m.bias,
              runtime=lambda m: (f"attention biases apart from the MLP's (attention_bias="
                                 f"{m.attention_bias}, bias={m.bias})"),
              export=lambda m: (f"attention biases {m.attention_bias} beside MLP biases "
                                f"{m.bias} -> {m.bias} on both")),
    DenseRule(name="norm_affine", applies=lambda m: not m.norm_affine,
              runtime=lambda m: "parameter-free norms (norm_affine=false)",
              export=lambda m: "parameter-free norms -> norms with a gain"),
    DenseRule(name="embedding_norm", applies=lambda m: m.embedding_norm,
              runtime=lambda m: "a norm after the word embedding (embedding_norm=true)",
              export=lambda m: "the norm after the word embedding (BLOOM) -> none"),
    DenseRule(name="lm_head_bias", applies=lambda m: m.lm_head_bias,
              runtime=lambda m: "an LM-head bias (lm_head_bias=true)",
              export=lambda m: "the LM head's bias -> none"),
    DenseRule(name="rotary_fraction", applies=lambda m: m.rotary_fraction != 1.0,
              runtime=lambda m: f"partial rotary embeddings (rotary_fraction={m.rotary_fraction})",
              export=None),  # --rotary-percent
    # the decoder refuses every QK norm (decoder_gaps: qk_norm), shared or not
    DenseRule(name="qk_norm_shared", applies=lambda m: m.qk_norm and not m.qk_norm_shared,
              runtime=None,
              export=lambda m: "QK-norm gains per projection element -> one head-wide gain"),
    DenseRule(name="multipliers", applies=lambda m: bool(_multipliers(m)),
              runtime=lambda m: f"scalar multipliers ({', '.join(_multipliers(m))})",
              export=lambda m: ("embedding, residual, attention and logit multipliers -> 1, 1, "
                                "1/sqrt(d), 1")),
)
"""In the order both readers list them."""


def runtime_gaps(m: ModelSpec) -> list[str]:
    """The rules ``m`` asks for that the runtime decoder does not build, in its words."""
    return [r.runtime(m) for r in RULES if r.runtime is not None and r.applies(m)]


def export_losses(m: ModelSpec) -> list[str]:
    """The rules ``m`` asks for that Megatron-LM has no argument for, as export loss lines."""
    return [r.export(m) for r in RULES if r.export is not None and r.applies(m)]
