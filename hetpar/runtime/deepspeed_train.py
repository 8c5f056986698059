"""The train.py hetpar's DeepSpeed exports launch: the exported dense decoder on mock tokens.

Run by the export's launcher as ``deepspeed ... --module hetpar.runtime.deepspeed_train
--deepspeed --deepspeed_config ds_config.json --model ds_config.model.toml [pipeline
arguments]`` (or under ``torchrun``). The model is hetpar's runtime decoder
(``hetpar.runtime.model``: the same names, initialisation and forward as ``hetpar run``),
wrapped in modules (``runtime/deepspeed_modules.py``): with ``--pipeline-parallel-size`` P > 1
a ``deepspeed.pipe.PipelineModule`` of an embedding, n_layers ``TransformerLayer`` s, the final
norm and the head (tied to the embedding by ``TiedLayerSpec`` when the model ties them), split
by ``--partition-method``; otherwise one module. With ``tensor_parallel.autotp_size`` T > 1 in
the ds_config these modules are hetpar's own tensor-parallel decoder instead of DeepSpeed's
AutoTP: each rank holds its Megatron shard of every weight (``runtime.model.shard``: Q/K/V and
MLP input by rows, the outputs by columns, the untied head by vocabulary) and runs
``runtime.tp``'s collectives; DeepSpeed gets the config without the AutoTP key and a
model-parallel unit (``runtime.deepspeed_mpu``; with a pipeline, the PipelineModule's pipe x
data x model topology) so that ZeRO and the gradient averaging use the data-parallel group
only. ZeRO, precision, batch sizes and accumulation are the ds_config's. The data are seeded
random tokens per data-parallel replica (a benchmark, like Megatron's ``--mock-data``); the
optimizer is ``torch.optim.AdamW``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from typing import Any

import deepspeed
import torch
from deepspeed.pipe import PipelineModule
from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology
from torch import nn

from hetpar.catalog import load_model
from hetpar.errors import ConfigError, Infeasible
from hetpar.runtime.deepspeed_modules import (
    Decoder,
    VocabParallelLoss,
    layer_specs,
    loss_fn,
    shape_gap,
)
from hetpar.runtime.deepspeed_mpu import ModelParallelUnit
from hetpar.runtime.layout import check_tp
from hetpar.runtime.tp import SINGLE, TPContext
from hetpar.specs.model import ModelSpec


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


def build(m: ModelSpec, args: argparse.Namespace, ctx: TPContext = SINGLE) -> nn.Module:
    """The PipelineModule (``--pipeline-parallel-size`` > 1) or the one-module decoder (this
    rank's TP shard of it under ``ctx``)."""
    pp = args.pipeline_parallel_size
    if pp > 1:
        # with TP, the grid DeepSpeed builds from the topology: pipe, data, model (fastest),
        # the rank order of the TP groups in ctx (runtime/deepspeed_mpu.py)
        shape: dict[str, Any] = {"num_stages": pp} if ctx.size == 1 else {
            "topology": PipeModelDataParallelTopology(
                num_pp=pp, num_mp=ctx.size,
                num_dp=deepspeed.comm.get_world_size() // (pp * ctx.size))}
        untied_tp = ctx.size > 1 and not m.tied_embeddings
        return PipelineModule(
            layers=layer_specs(m, args.seed, ctx), **shape,
            partition_method=args.partition_method,
            loss_fn=VocabParallelLoss(ctx) if untied_tp else loss_fn,
            activation_checkpoint_interval=args.activation_checkpoint_interval,
            # only blocks: a checkpointed embedding gets no gradient (its input, token ids,
            # needs none; deepspeed/runtime/pipe/module.py::_is_checkpointable)
            checkpointable_layers=["TransformerLayer"])
    full = args.activation_checkpoint_interval > 0
    return Decoder(m, args.seed, "full" if full else "none", ctx)


def split_config(path: str) -> tuple[int, dict[str, Any]]:
    """The TP degree the ds_config asks for (``tensor_parallel.autotp_size``) and the config
    DeepSpeed gets: without that key when TP > 1, so that AutoTP does not shard the modules
    again (hetpar's decoder is already sharded; deepspeed/runtime/engine.py runs AutoTP
    whenever autotp_size > 1)."""
    with open(path, encoding="utf-8") as f:
        cfg = json.load(f)
    tp = int(cfg.get("tensor_parallel", {}).get("autotp_size", 1))
    if tp > 1:
        cfg = {k: v for k, v in cfg.items() if k != "tensor_parallel"}
    return tp, cfg


def _stage_line(model: PipelineModule, stage: int, n_layers: int) -> str:
    # parts index the layer list, whose entry 0 is the embedding: block i is entry i + 1
    first = max(model.parts[stage] - 1, 0)
    last = min(model.parts[stage + 1] - 1, n_layers)
    return f"hetpar: stage {stage} holds transformer layers [{first}, {last})"


def tp_check(m: ModelSpec, tp: int) -> None:
    """Raise ConfigError when this script cannot shard ``m`` over ``tp`` ranks: heads, KV
    heads, FFN units or the untied vocabulary do not split evenly (``hetpar run``'s check)."""
    try:
        check_tp(m, tp)
    except Infeasible as e:
        raise ConfigError(f"hetpar.runtime.deepspeed_train cannot train {m.name!r}: "
                          f"{e.reason}") from None


def _unlink_shm_buffer() -> None:
    """Remove this rank's name of DeepSpeed's CPU shared-memory all-reduce buffer once every
    rank has opened the others'. DeepSpeed 0.19.8 (ops/csrc/cpu/comm/shm.cpp, shm_initialize)
    names it deepspeed_allreduce_buffer_<uid>_<MASTER_ADDR>_<MASTER_PORT>_<rank> and never
    unlinks it (its shared_close is not called): 66 MiB of /dev/shm stayed behind per rank and
    run, 18 GiB on a machine that ran the export tests for a day, until the OOM killer came.
    The mappings stay valid after the unlink; the name alone goes."""
    torch.distributed.barrier()  # shm_initialize returned on every rank: all buffers mapped
    name = (f"/dev/shm/deepspeed_allreduce_buffer_{os.getuid()}_"
            f"{os.environ.get('MASTER_ADDR', '')}_{os.environ.get('MASTER_PORT', '')}_"
            f"{torch.distributed.get_rank()}")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name)


def main(argv: list[str] | None = None) -> int:
    """Train the exported model for ``--steps`` optimizer steps; rank 0 prints the losses."""
    args = arguments(sys.argv[1:] if argv is None else argv)
    m = load_model(args.model)
    gap = shape_gap(m)
    if gap:
        raise ConfigError(f"hetpar.runtime.deepspeed_train cannot train {m.name!r}: {gap}")
    tp, cfg = split_config(args.deepspeed_config)
    tp_check(m, tp)
    deepspeed.init_distributed()
    _unlink_shm_buffer()
    unit = ModelParallelUnit(tp, args.pipeline_parallel_size) if tp > 1 else None
    model = build(m, args, unit.tp_context() if unit else SINGLE)
    rank, piped = deepspeed.comm.get_rank(), isinstance(model, PipelineModule)
    mpu = None if piped else unit  # a PipelineModule brings its own grid (deepspeed.initialize)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    if unit:  # the config as a dict, without AutoTP's key (one config source: not both)
        args.deepspeed_config = None
        if piped:  # activations are replicated over TP: send them whole, unpartitioned
            cfg["pipeline"] = {"pipe_partitioned": False, "grad_partitioned": False}
    engine, _, _, _ = deepspeed.initialize(args=args, model=model, optimizer=optimizer,
                                           mpu=mpu, config=cfg if unit else None)
    replica = (engine.grid.get_data_parallel_id() if piped
               else mpu.get_data_parallel_rank() if mpu else rank)
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
                loss = engine(tokens, labels) if mpu else loss_fn(engine(tokens), labels)
                engine.backward(loss)
                engine.step()
        if rank == 0:
            print(f"hetpar: step {step + 1} loss {float(loss.detach()):.6f}", flush=True)
    if rank == 0:
        print(f"hetpar: trained {m.name} for {args.steps} steps", flush=True)
    # Tear the process group down on every rank together: a gloo group still alive at
    # interpreter exit can abort the process ("terminate called without an active exception").
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    try:
        code = main()
    except ConfigError as e:
        print(f"hetpar: error: {e}", file=sys.stderr)
        sys.exit(2)
    # The run has finished, been reported and torn its group down on every rank; leave without
    # the interpreter's teardown, in which a C++ thread DeepSpeed's ZeRO-3 left joinable can
    # still abort a rank ("terminate called without an active exception", exit -6: seen in
    # clean-clone runs of tests/test_export_deepspeed_train.py under load).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
