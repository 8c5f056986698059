"""Peak memory of one GPU of a pipeline rank: states, activations in flight, buffers."""

from __future__ import annotations

from dataclasses import dataclass

from hetpar import formulas
from hetpar.sim import calibration as cal
from hetpar.sim.layer import ACT_BYTES, flash_attention
from hetpar.sim.profile import DEFAULT, FrameworkProfile
from hetpar.specs.model import ModelSpec


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryRow:
    """Bytes on one GPU of one pipeline rank of one replica."""

    replica: int
    rank: int
    params: float
    grads: float
    optimizer: float
    activations: float
    other: float
    capacity: float

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.activations + self.other

    @property
    def oom(self) -> bool:
        return self.total > self.capacity

    def to_dict(self) -> dict[str, float | int | bool]:
        gib = 2.0**30
        return {
            "replica": self.replica, "rank": self.rank,
            "params_gib": self.params / gib, "grads_gib": self.grads / gib,
            "optimizer_gib": self.optimizer / gib, "activations_gib": self.activations / gib,
            "other_gib": self.other / gib, "total_gib": self.total / gib,
            "capacity_gib": self.capacity / gib, "oom": self.oom,
        }


def state_bytes_per_param(precision: str, optimizer: str) -> tuple[float, float, float]:
    """(weights, gradients, optimizer state) bytes per parameter.

    Mixed precision with Adam: 2 + 2 + 12 (fp32 master weights, momentum and variance;
    Rajbhandari et al. 2020, ZeRO Sec. 3.1). fp32 training keeps no master copy: 4 + 4 + 8.
    SGD with momentum keeps one fp32 moment (plus the master copy in mixed precision).
    """
    full = precision in ("fp32", "tf32")
    w = g = 4.0 if full else 2.0
    if optimizer == "adam":
        opt = 8.0 if full else 12.0
    else:
        opt = 4.0 if full else 8.0
    return w, g, opt


@dataclass(frozen=True, kw_only=True, slots=True)
class RankLoad:
    """What one pipeline rank holds: its layers, and whether it has the embedding / LM head."""

    n_layers: int
    first: bool
    last: bool
    tp: int
    cp: int
    in_flight_layers: float
    """Layer-activations stashed at peak: sum over in-flight (chunk, micro-batch) of layers."""
    params: float
    """Parameters held by one GPU of the rank (TP-sharded, incl. embedding / LM head)."""
    layer_params: float
    """Parameters of its largest layer (for the ZeRO-3 gathered working set)."""
    expert_params: float = 0.0
    """Of ``params``, the routed experts (expert parallelism), which ZeRO shards over the
    expert-data-parallel group instead (torchtitan's efsdp; Megatron-Core's expert
    distributed optimizer)."""
    expert_dp: int = 1
    """Ranks of that group (``Mesh.with_experts``'s edp)."""


def rank_memory(
    model: ModelSpec, load: RankLoad, *, replica: int, rank: int, capacity: float,
    precision: str, optimizer: str, zero: int, dp: int, recompute: str,
    sequence_parallel: bool, micro_batch: int, seq: int,
    profile: FrameworkProfile = DEFAULT,
) -> MemoryRow:
    """Memory of one GPU of pipeline rank ``rank`` (see docs/simulator.md for the terms)."""
    n_params = load.params
    wb, gb, ob = state_bytes_per_param(precision, optimizer)
    shard, es, ne = max(dp, 1), max(load.expert_dp, 1), load.expert_params
    nd = n_params - ne

    def held(per: float, level: int) -> float:  # ZeRO-level shards: dense over dp, experts edp
        return nd * per / (shard if zero >= level else 1) + ne * per / (es if zero >= level else 1)

    params, grads, opt = held(wb, 3), held(gb, 2), held(ob, 1)
    act = _activations(model, load, precision, recompute, sequence_parallel, micro_batch, seq,
                       flash_attention(model, precision, profile))
    working = 0.0
    if zero >= 3 and dp > 1:
        # FSDP gathers the current and the prefetched unit (Zhao et al. 2023, Sec. 3.3): a
        # layer for per-block FSDP, one of its submodules for DeepSpeed's per-module fetch.
        unit = load.layer_params / max(profile.zero3_collectives_per_layer, 1)
        working = 2 * unit / load.tp * wb
    tensors = params + grads + opt + act + working
    # outside the allocator, plus what it holds beyond the live tensors (framework data)
    other = profile.reserved_memory_bytes + working + profile.allocator_fragmentation * tensors
    return MemoryRow(
        replica=replica, rank=rank, params=params, grads=grads, optimizer=opt,
        activations=act, other=other, capacity=capacity,
    )


_ACT: dict[tuple[object, ...], float] = {}


def _act(model: ModelSpec, seq: int, micro_batch: int, recompute: str, flash: bool,
         tp: int, sp: bool, cp: int, dtype: int) -> float:
    """Cached ``formulas.activation_bytes_per_layer`` (the search asks the same shapes often).

    It counts the first MoE layer of an MoE model (formulas.first_moe_layer; layer 0 of a
    dense one): the dense layers before or between are counted as MoE ones (an upper bound;
    the Qwen-MoE and Mixtral configs have every layer MoE).

    Gated-MLP (Llama-family) models train without dropout (Touvron et al. 2023; the Llama
    recipes of Megatron-Core and torchtitan set both dropouts to 0), so they keep no masks.
    """
    key = (model, seq, micro_batch, recompute, flash, tp, sp, cp, dtype)
    v = _ACT.get(key)
    if v is None:
        if len(_ACT) > 65536:
            _ACT.clear()
        # a hybrid model (ModelSpec.layer_kinds): its largest layer, again an upper bound
        reps = {(k, formulas.is_moe_layer(model, i)): i for i, k in enumerate(model.kinds)}
        at = sorted(reps.values()) if model.layer_kinds else [formulas.first_moe_layer(model)]
        v = _ACT[key] = max(formulas.activation_bytes_per_layer(
            model, seq, micro_batch, tp=tp, sp=sp, cp=cp, dtype_bytes=dtype,
            recompute=recompute, flash_attention=flash,  # type: ignore[arg-type]
            dropout=model.mlp != "swiglu", index=i) for i in at)
    return v


def _fp8_saved_inputs(model: ModelSpec, seq: int, micro_batch: int, tp: int, sp: bool,
                      cp: int) -> float:
    """Bytes an FP8 recipe saves per layer: TransformerEngine keeps the FP8 copy (1 byte) of
    each FP8 GEMM's input for the weight gradient instead of the BF16 one (2 bytes): the QKV
    and FC1 inputs (tokens x h, split by SP), the projection input and the FC2 input (in an
    MoE layer, as ``_act`` counts it: the top-k experts' and shared expert's columns,
    formulas.mlp_width)."""
    tokens = seq / cp * micro_batch
    rep = tp if sp else 1
    moe = formulas.is_moe_layer(model, formulas.first_moe_layer(model))
    ffn = formulas.mlp_width(model, moe) / tp
    return tokens * (2 * model.hidden / rep + model.hidden / tp + ffn)


def _activations(
    model: ModelSpec, load: RankLoad, precision: str, recompute: str,
    sequence_parallel: bool, micro_batch: int, seq: int, flash: bool,
) -> float:
    """Stashed activations (Korthikanti et al. 2022, Table 2) x in-flight layer count.

    Full recompute stashes only layer inputs but rebuilds one layer's activations during its
    backward, so that working set is added once. Fused attention keeps no s^2 scores
    (see layer.flash_attention); unfused attention keeps them unless recomputed.
    """
    dtype = ACT_BYTES[precision]
    shape = (load.tp, sequence_parallel, load.cp, dtype)
    per_layer = _act(model, seq, micro_batch, recompute, flash and recompute != "full", *shape)
    if flash and recompute == "selective":
        # op-level selective checkpointing (see calibration.SAC_SAVED_FRACTION)
        inputs = _act(model, seq, micro_batch, "full", False, *shape)
        per_layer = inputs + cal.SAC_SAVED_FRACTION * (per_layer - inputs)
    if precision == "fp8" and recompute != "full":
        per_layer -= _fp8_saved_inputs(model, seq, micro_batch, load.tp, sequence_parallel,
                                       load.cp)
    act = per_layer * load.in_flight_layers
    if recompute == "full" and load.n_layers:
        act += _act(model, seq, micro_batch, "none", flash, *shape)
    if load.last:
        act += formulas.head_activation_bytes(
            model, seq, micro_batch, tp=load.tp, sp=sequence_parallel, cp=load.cp,
            dtype_bytes=dtype,
        )
    return act
