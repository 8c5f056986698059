"""The train.py hetpar's DeepSpeed exports launch: the exported dense decoder on mock tokens.

Run by the export's launcher as ``deepspeed ... --module hetpar.runtime.deepspeed_train
--deepspeed --deepspeed_config ds_config.json --model ds_config.model.toml [pipeline
arguments]`` (or under ``torchrun``). The model is hetpar's runtime decoder
(``hetpar.runtime.model``: the same names, initialisation and forward as ``hetpar run``),
wrapped in modules: with ``--pipeline-parallel-size`` P > 1 a ``deepspeed.pipe.PipelineModule``
of an embedding, n_layers ``TransformerLayer`` s, the final norm and the head (tied to the
embedding by ``TiedLayerSpec`` when the model ties them), split by ``--partition-method``;
otherwise one module. ZeRO, precision, batch sizes and accumulation are the ds_config's. The
data are seeded random tokens per data-parallel replica (a benchmark, like Megatron's
``--mock-data``); the optimizer is ``torch.optim.AdamW``.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

import deepspeed
import torch
import torch.nn.functional as F  # noqa: N812
from deepspeed.pipe import LayerSpec, PipelineModule, TiedLayerSpec
from torch import nn

from hetpar import formulas
from hetpar.catalog import load_model
from hetpar.errors import ConfigError
from hetpar.runtime import model as rm
from hetpar.runtime.tp import SINGLE
from hetpar.specs.model import ModelSpec

NORM_EPS = 1e-5  # as hetpar.runtime.model's norms


class _Weights(nn.Module):
    """Some of hetpar's named parameters (``runtime.model.param_infos`` names and init)."""

    def __init__(self, infos: dict[str, rm.ParamInfo], seed: int) -> None:
        super().__init__()
        self.names = list(infos)
        for name, info in infos.items():  # module attributes cannot hold dots
            value = rm.init_param(name, info, seed, torch.float32)
            self.register_parameter(name.replace(".", "_"), nn.Parameter(value))

    def tensors(self) -> dict[str, torch.Tensor]:
        return {n: getattr(self, n.replace(".", "_")) for n in self.names}


class Embedding(_Weights):
    """Token (and learned position) embedding: the first pipeline layer."""

    def __init__(self, m: ModelSpec, seed: int) -> None:
        super().__init__(rm.param_infos(m, range(0), first=True, last=False), seed)
        self.m = m

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return rm.embed(self.m, self.tensors(), tokens, SINGLE)


class TransformerLayer(_Weights):
    """One decoder block; the class name is what ``type:TransformerLayer`` partitions by."""

    def __init__(self, m: ModelSpec, index: int, seed: int, recompute: str = "none") -> None:
        super().__init__(rm.param_infos(m, range(index, index + 1), False, False), seed)
        self.m, self.layers, self.recompute = m, range(index, index + 1), recompute

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rm.blocks(self.m, self.tensors(), self.layers, x, SINGLE, self.recompute)


class FinalNorm(_Weights):
    """The norm before the head (runtime.model's lnf: LayerNorm, or RMSNorm, eps 1e-5)."""

    def __init__(self, m: ModelSpec, seed: int) -> None:
        infos = rm.param_infos(m, range(0), first=False, last=True)
        super().__init__({k: v for k, v in infos.items() if k.startswith("lnf.")}, seed)
        self.m = m

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p, shape = self.tensors(), (self.m.hidden,)
        if self.m.norm == "rmsnorm":
            return F.rms_norm(x, shape, p["lnf.w"], NORM_EPS)
        return F.layer_norm(x, shape, p["lnf.w"], p.get("lnf.b"), NORM_EPS)


class Head(_Weights):
    """The untied output layer (V x h)."""

    def __init__(self, m: ModelSpec, seed: int) -> None:
        super().__init__({"head": rm.param_infos(m, range(0), False, True)["head"]}, seed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.tensors()["head"])


def _tied_logits(embedding: Embedding, x: torch.Tensor) -> torch.Tensor:
    return F.linear(x, embedding.tensors()["tok_emb"])


class Decoder(nn.Module):
    """The whole model in one module (no pipeline)."""

    def __init__(self, m: ModelSpec, seed: int, recompute: str) -> None:
        super().__init__()
        self.embedding = Embedding(m, seed)
        self.layers = nn.ModuleList(TransformerLayer(m, i, seed, recompute)
                                    for i in range(m.n_layers))
        self.norm = FinalNorm(m, seed)
        self.head = None if m.tied_embeddings else Head(m, seed)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embedding(tokens)
        for layer in self.layers:
            x = layer(x)
        x = self.norm(x)
        return self.head(x) if self.head is not None else _tied_logits(self.embedding, x)


def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean token cross-entropy."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1))


def layer_specs(m: ModelSpec, seed: int) -> list[Any]:
    """PipelineModule's layers: embedding, blocks, norm, head (tied when the model ties)."""
    specs: list[Any] = [TiedLayerSpec("embed", Embedding, m, seed, tied_weight_attr="tok_emb")
                        if m.tied_embeddings else LayerSpec(Embedding, m, seed)]
    specs += [LayerSpec(TransformerLayer, m, i, seed) for i in range(m.n_layers)]
    specs.append(LayerSpec(FinalNorm, m, seed))
    specs.append(TiedLayerSpec("embed", Embedding, m, seed, forward_fn=_tied_logits,
                               tied_weight_attr="tok_emb")
                 if m.tied_embeddings else LayerSpec(Head, m, seed))
    return specs


def shape_gap(m: ModelSpec) -> str:
    """Why these modules are not ``m`` ('' when they are): the parameters they build differ
    from hetpar's count (``formulas.params``: MoE, Q/K/V-only biases, a narrower embedding,
    extra norms), or positions they do not apply (ALiBi has no parameters to count)."""
    if m.position == "alibi":
        return "ALiBi positions (the runtime decoder applies none)"
    infos = rm.param_infos(m, range(m.n_layers), first=True, last=True)
    built = sum(math.prod(i.shape) for i in infos.values())
    want = formulas.params(m)
    return "" if built == want else (
        f"the runtime decoder builds {built:,} parameters, hetpar counts {want:,} (features it "
        "lacks: MoE, Q/K/V-only biases, a narrower embedding, QK or extra norms)")


def arguments(argv: list[str]) -> argparse.Namespace:
    """The launcher's arguments to this script (DeepSpeed's --deepspeed/--deepspeed_config too)."""
    p = argparse.ArgumentParser(prog="python -m hetpar.runtime.deepspeed_train",
                                description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="the export's model file (or catalog name)")
    p.add_argument("--pipeline-parallel-size", type=int, default=1)
    p.add_argument("--partition-method", default="type:TransformerLayer")
    p.add_argument("--activation-checkpoint-interval", type=int, default=0)
    p.add_argument("--steps", type=int, default=10, help="optimizer steps (default 10)")
    p.add_argument("--seq-len", type=int, help="tokens per sequence (default: the model's)")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--local_rank", type=int, default=-1, help="set by the deepspeed launcher")
    deepspeed.add_config_arguments(p)
    return p.parse_args(argv)


def _batches(vocab: int, micro: int, seq: int, seed: int, replica: int) -> Any:
    """(tokens, next tokens) micro-batches, the same on every rank of one replica."""
    g = torch.Generator().manual_seed(seed * 7919 + replica)
    while True:
        t = torch.randint(0, vocab, (micro, seq + 1), generator=g)
        yield t[:, :-1], t[:, 1:]


def build(m: ModelSpec, args: argparse.Namespace) -> nn.Module:
    """The PipelineModule (``--pipeline-parallel-size`` > 1) or the one-module decoder."""
    if args.pipeline_parallel_size > 1:
        return PipelineModule(
            layers=layer_specs(m, args.seed), num_stages=args.pipeline_parallel_size,
            partition_method=args.partition_method, loss_fn=loss_fn,
            activation_checkpoint_interval=args.activation_checkpoint_interval,
            # only blocks: a checkpointed embedding gets no gradient (its input, token ids,
            # needs none; deepspeed/runtime/pipe/module.py::_is_checkpointable)
            checkpointable_layers=["TransformerLayer"])
    full = args.activation_checkpoint_interval > 0
    return Decoder(m, args.seed, "full" if full else "none")


def _stage_line(model: PipelineModule, stage: int, n_layers: int) -> str:
    # parts index the layer list, whose entry 0 is the embedding: block i is entry i + 1
    first = max(model.parts[stage] - 1, 0)
    last = min(model.parts[stage + 1] - 1, n_layers)
    return f"hetpar: stage {stage} holds transformer layers [{first}, {last})"


def main(argv: list[str] | None = None) -> int:
    """Train the exported model for ``--steps`` optimizer steps; rank 0 prints the losses."""
    args = arguments(sys.argv[1:] if argv is None else argv)
    m = load_model(args.model)
    gap = shape_gap(m)
    if gap:
        raise ConfigError(f"hetpar.runtime.deepspeed_train cannot train {m.name!r}: {gap}")
    deepspeed.init_distributed()
    model = build(m, args)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    engine, _, _, _ = deepspeed.initialize(args=args, model=model, optimizer=optimizer)
    rank, piped = deepspeed.comm.get_rank(), isinstance(model, PipelineModule)
    replica = engine.grid.get_data_parallel_id() if piped else rank
    data = _batches(m.vocab, engine.train_micro_batch_size_per_gpu(), args.seq_len or m.seq_len,
                    args.seed, replica)
    if piped and replica == 0:
        print(_stage_line(model, engine.grid.get_stage_id(), m.n_layers), flush=True)
    for step in range(args.steps):
        if piped:
            loss = engine.train_batch(data_iter=data)
        else:
            for _ in range(engine.gradient_accumulation_steps()):
                tokens, labels = next(data)
                loss = loss_fn(engine(tokens), labels)
                engine.backward(loss)
                engine.step()
        if rank == 0:
            print(f"hetpar: step {step + 1} loss {float(loss.detach()):.4f}", flush=True)
    if rank == 0:
        print(f"hetpar: trained {m.name} for {args.steps} steps", flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ConfigError as e:
        print(f"hetpar: error: {e}", file=sys.stderr)
        sys.exit(2)
