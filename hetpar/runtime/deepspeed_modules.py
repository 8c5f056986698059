"""The modules hetpar's DeepSpeed train script builds: the runtime decoder, whole or as layers."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from deepspeed.pipe import LayerSpec, TiedLayerSpec
from torch import nn

from hetpar import formulas
from hetpar.runtime import model as rm
from hetpar.runtime import tp as tpc
from hetpar.runtime.tp import SINGLE, TPContext
from hetpar.specs.model import ModelSpec

NORM_EPS = 1e-5  # as hetpar.runtime.model's norms


class _Weights(nn.Module):
    """Some of hetpar's named parameters (``runtime.model.param_infos`` names and init), each
    this rank's TP shard of the full seeded value (the whole of it without TP)."""

    def __init__(self, infos: dict[str, rm.ParamInfo], seed: int,
                 ctx: TPContext = SINGLE) -> None:
        super().__init__()
        self.names, self.ctx = list(infos), ctx
        for name, info in infos.items():  # module attributes cannot hold dots
            value = rm.shard(rm.init_param(name, info, seed, torch.float32), info, ctx.rank,
                             ctx.size)
            param = nn.Parameter(value)
            # DeepSpeed's gradient norm counts a parameter without this on TP rank 0 only
            # (deepspeed/runtime/utils.py::is_model_parallel_parameter)
            sharded = ctx.size > 1 and info.shard_dim is not None
            param.tensor_model_parallel = sharded  # type: ignore[attr-defined]
            self.register_parameter(name.replace(".", "_"), param)

    def tensors(self) -> dict[str, torch.Tensor]:
        return {n: getattr(self, n.replace(".", "_")) for n in self.names}


class Embedding(_Weights):
    """Token (and learned position) embedding: the first pipeline layer."""

    def __init__(self, m: ModelSpec, seed: int, ctx: TPContext = SINGLE) -> None:
        super().__init__(rm.param_infos(m, range(0), first=True, last=False), seed, ctx)
        self.m = m

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return rm.embed(self.m, self.tensors(), tokens, self.ctx)


class TransformerLayer(_Weights):
    """One decoder block; the class name is what ``type:TransformerLayer`` partitions by."""

    def __init__(self, m: ModelSpec, index: int, seed: int, recompute: str = "none",
                 ctx: TPContext = SINGLE) -> None:
        super().__init__(rm.param_infos(m, range(index, index + 1), False, False), seed, ctx)
        self.m, self.layers, self.recompute = m, range(index, index + 1), recompute

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rm.blocks(self.m, self.tensors(), self.layers, x, self.ctx, self.recompute)


class FinalNorm(_Weights):
    """The norm before the head (runtime.model's lnf: LayerNorm, or RMSNorm, eps 1e-5)."""

    def __init__(self, m: ModelSpec, seed: int, ctx: TPContext = SINGLE) -> None:
        infos = rm.param_infos(m, range(0), first=False, last=True)
        super().__init__({k: v for k, v in infos.items() if k.startswith("lnf.")}, seed, ctx)
        self.m = m

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p, shape = self.tensors(), (self.m.hidden,)
        if self.m.norm == "rmsnorm":
            return F.rms_norm(x, shape, p["lnf.w"], NORM_EPS)
        return F.layer_norm(x, shape, p["lnf.w"], p.get("lnf.b"), NORM_EPS)


class Head(_Weights):
    """The untied output layer (V x h; V / tp rows of it under TP)."""

    def __init__(self, m: ModelSpec, seed: int, ctx: TPContext = SINGLE) -> None:
        super().__init__({"head": rm.param_infos(m, range(0), False, True)["head"]}, seed, ctx)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # under TP the vocabulary-parallel logits: Megatron's f first (the gradient of the
        # replicated x sums the shards'), the loss is then VocabParallelLoss
        return F.linear(tpc.enter(x, self.ctx), self.tensors()["head"])


def _tied_logits(embedding: Embedding, x: torch.Tensor) -> torch.Tensor:
    return F.linear(x, embedding.tensors()["tok_emb"])


class Decoder(nn.Module):
    """The whole model in one module (no pipeline): this rank's TP shard of it."""

    def __init__(self, m: ModelSpec, seed: int, recompute: str,
                 ctx: TPContext = SINGLE) -> None:
        super().__init__()
        self.ctx = ctx
        self.embedding = Embedding(m, seed, ctx)
        self.layers = nn.ModuleList(TransformerLayer(m, i, seed, recompute, ctx)
                                    for i in range(m.n_layers))
        self.norm = FinalNorm(m, seed, ctx)
        self.head = None if m.tied_embeddings else Head(m, seed, ctx)

    def forward(self, tokens: torch.Tensor,
                labels: torch.Tensor | None = None) -> torch.Tensor:
        """The logits (this rank's vocabulary shard under TP with an untied head), or with
        ``labels`` the mean token cross-entropy in fp32, the same on every rank of the TP
        group (the pipeline's loss functions)."""
        x = self.embedding(tokens)
        for layer in self.layers:
            x = layer(x)
        x = self.norm(x)
        logits = self.head(x) if self.head is not None else _tied_logits(self.embedding, x)
        if labels is None:
            return logits
        if self.head is not None and self.ctx.size > 1:
            return VocabParallelLoss(self.ctx)(logits, labels)
        return loss_fn(logits, labels)


def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean token cross-entropy."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1))


class VocabParallelLoss:
    """The pipeline's loss under TP with an untied head: cross-entropy over the vocabulary
    shards (runtime.model.vocab_parallel_mean_ce)."""

    def __init__(self, ctx: TPContext) -> None:
        self.ctx = ctx

    def __call__(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return rm.vocab_parallel_mean_ce(logits.float(), labels, self.ctx)


def layer_specs(m: ModelSpec, seed: int, ctx: TPContext = SINGLE) -> list[Any]:
    """PipelineModule's layers: embedding, blocks, norm, head (tied when the model ties),
    each this rank's TP shard under ``ctx``."""
    specs: list[Any] = [TiedLayerSpec("embed", Embedding, m, seed, ctx,
                                      tied_weight_attr="tok_emb")
                        if m.tied_embeddings else LayerSpec(Embedding, m, seed, ctx)]
    specs += [LayerSpec(TransformerLayer, m, i, seed, "none", ctx) for i in range(m.n_layers)]
    specs.append(LayerSpec(FinalNorm, m, seed, ctx))
    specs.append(TiedLayerSpec("embed", Embedding, m, seed, ctx, forward_fn=_tied_logits,
                               tied_weight_attr="tok_emb")
                 if m.tied_embeddings else LayerSpec(Head, m, seed, ctx))
    return specs


def shape_gap(m: ModelSpec) -> str:
    """Why these modules are not ``m`` ('' when they are): the parameters they build differ
    from hetpar's count (``formulas.params``: MoE, Q/K/V-only biases, a narrower embedding,
    extra norms), or positions they do not apply (ALiBi has no parameters to count)."""
    if m.position == "alibi":
        return "ALiBi positions (the runtime decoder applies none)"
    if m.n_experts > 1:  # hetpar run trains them (runtime/moe.py); not wired into these modules
        return f"mixture-of-experts layers (n_experts={m.n_experts}), untried under DeepSpeed"
    free = _parameter_free_gaps(m)
    if free:
        return f"{free} (the runtime decoder builds none)"
    infos = rm.param_infos(m, range(m.n_layers), first=True, last=True)
    built = sum(math.prod(i.shape) for i in infos.values())
    want = formulas.params(m)
    return "" if built == want else (
        f"the runtime decoder builds {built:,} parameters, hetpar counts {want:,} (features it "
        "lacks: MoE, Q/K/V-only biases, a narrower embedding, QK or extra norms)")


def _parameter_free_gaps(m: ModelSpec) -> str:
    """Rules that hold no parameters, so the count cannot reveal them (hetpar/hf/dense.py)."""
    scalars = (m.embedding_multiplier, m.residual_multiplier, m.logit_scale)
    named = {"a sliding window": m.sliding_window is not None,
             "parallel attention and MLP": m.parallel_attention,
             "partial rotary embeddings": m.rotary_fraction != 1,
             "a squared-ReLU MLP": m.mlp == "relu2",
             "scalar multipliers": any(v != 1 for v in scalars)
             or m.attention_multiplier is not None}
    return ", ".join(k for k, v in named.items() if v)
