"""Megatron pads the vocabulary to a multiple of make_vocab_size_divisible_by x TP: the
simulator's parameters, memory and FLOPs follow it for the Megatron-family frameworks."""

from __future__ import annotations

import dataclasses

import pytest

from hetpar import formulas as F
from hetpar.catalog import load_model
from hetpar.sim import simulate
from hetpar.sim.profile import framework_names, load_framework, resolve
from hetpar.specs.cluster import ClusterSpec, NodeGroup
from hetpar.specs.job import Job
from hetpar.specs.plan import Plan

LLAMA3 = load_model("llama3.1-8b")  # vocab 128,256 = 128 x 1002
H100 = ClusterSpec(name="h100", node_groups=(NodeGroup(name="g", gpu="H100-SXM5-80GB",
                                                       num_nodes=2, gpus_per_node=8),))


@pytest.mark.parametrize(("vocab", "multiple", "rows"), [
    (128_256, 128 * 8, 129_024),  # Llama 3 at tp=8: 768 rows more, as the issue measured
    (128_256, 128, 128_256),      # already a multiple at tp=1
    (50_257, 128, 50_304),        # GPT-2's 50,257 -> Megatron's familiar 50,304
    (50_257, 1, 50_257),
])
def test_padded_vocab_rounds_up_to_the_multiple(vocab: int, multiple: int, rows: int) -> None:
    assert F.padded_vocab(vocab, multiple) == rows


def test_only_the_megatron_family_pads() -> None:
    pads = {n for n in framework_names() if load_framework(n).vocab_divisible_by > 1}
    assert pads == {"megatron-lm", "megatron-core", "megatron-deepspeed"}
    assert {load_framework(n).vocab_divisible_by for n in pads} == {128}


def test_megatron_memory_and_flops_count_the_padded_rows() -> None:
    """tp=8, pp=1: each rank holds 1/8 of the embedding and of the untied head, 768 rows more
    of each; the head's FLOPs per token grow by 6 h x 768 (forward 2 h V, training 3x)."""
    plan = Plan(tp=8, pp=1, dp=2, micro_batch=1, global_batch=16)
    job = Job(global_batch=16, seq_len=4096, framework="megatron-core")
    padded = simulate(LLAMA3, H100, plan, job)
    unpadded = simulate(LLAMA3, H100, plan, job, profile=dataclasses.replace(
        resolve("megatron-core"), vocab_divisible_by=1))
    extra_rows = 768
    assert (padded.model_flops_per_iter - unpadded.model_flops_per_iter
            == pytest.approx(padded.tokens_per_iter * 6 * LLAMA3.hidden * extra_rows))
    per_rank = 2 * extra_rows * LLAMA3.hidden / 8  # embedding + head shards
    bf16 = 2
    assert padded.memory[0].params - unpadded.memory[0].params == pytest.approx(
        per_rank * bf16)
    assert padded.iteration_time_s > unpadded.iteration_time_s


def test_frameworks_without_padding_simulate_the_vocabulary_as_given() -> None:
    plan = Plan(tp=8, pp=1, dp=2, micro_batch=1, global_batch=16)
    job = Job(global_batch=16, seq_len=4096, framework="fsdp")
    rep = simulate(LLAMA3, H100, plan, job)
    assert rep.model_flops_per_iter == pytest.approx(
        rep.tokens_per_iter * F.model_flops_per_token(LLAMA3, 4096))
