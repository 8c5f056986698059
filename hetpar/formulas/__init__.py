"""Parameter counts, FLOPs per token, per-GEMM shapes and bytes per layer of a ModelSpec.

Split by what is counted: ``params`` (parameters and their bytes), ``flops`` (FLOPs per
token), ``gemms`` (per-GEMM shapes on a TP rank), ``activations`` (bytes kept for backward).
Every name is re-exported here, so callers keep ``from hetpar import formulas``.
"""

from hetpar.formulas.activations import (
    activation_bytes_per_layer,
    head_activation_bytes,
    mlp_columns_per_token,
    mlp_width,
)
from hetpar.formulas.flops import (
    RECOMPUTE_MODES,
    Recompute,
    attended_keys,
    attention_core_flops_per_token,
    flops_per_token,
    hardware_flops_per_token,
    head_forward_flops_per_token,
    layer_forward_flops,
    layer_forward_flops_per_token,
    model_flops_per_token,
)
from hetpar.formulas.gemms import (
    Gemm,
    attention_core_flops,
    head_gemm,
    kv_heads_per_rank,
    layer_gemms,
    per_rank,
)
from hetpar.formulas.params import (
    active_params,
    attention_matmul_weights,
    attention_params,
    bytes_per_layer,
    embedding_params,
    expert_params,
    first_moe_layer,
    is_moe_layer,
    kv_width,
    layer_params,
    layers_params,
    mla_matrices,
    mlp_matrices,
    mlp_params,
    moe_flags,
    moe_layers_in,
    norm_params,
    output_params,
    padded_vocab,
    param_bytes,
    params,
    projection_params,
    q_width,
    v_width,
    with_padded_vocab,
    word_embedding_params,
)

__all__ = [
    "RECOMPUTE_MODES", "Gemm", "Recompute", "active_params", "activation_bytes_per_layer",
    "attended_keys", "attention_matmul_weights", "first_moe_layer", "mla_matrices", "moe_flags",
    "v_width",
    "attention_core_flops", "attention_core_flops_per_token", "attention_params",
    "bytes_per_layer", "embedding_params", "expert_params", "flops_per_token",
    "hardware_flops_per_token", "head_activation_bytes", "head_forward_flops_per_token",
    "head_gemm", "is_moe_layer", "kv_heads_per_rank", "kv_width", "layer_forward_flops",
    "layer_forward_flops_per_token", "layer_gemms", "layer_params", "layers_params",
    "mlp_columns_per_token", "mlp_matrices", "mlp_width", "mlp_params", "model_flops_per_token",
    "moe_layers_in", "norm_params", "output_params", "param_bytes", "params", "per_rank",
    "projection_params", "q_width", "word_embedding_params", "padded_vocab", "with_padded_vocab",
]
