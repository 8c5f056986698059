"""Memory per pipeline rank against hand derivations."""

import dataclasses

import pytest

from hetpar import formulas
from hetpar.catalog import load_cluster, load_model, parse_inline_plan
from hetpar.sim import simulate
from hetpar.sim.memory import RankLoad, rank_memory, state_bytes_per_param
from hetpar.sim.profile import DEFAULT, FRAMEWORKS_DIR, framework_names, load_framework
from hetpar.specs.model import ModelSpec

GPT = ModelSpec(name="gpt", n_layers=8, hidden=2048, n_heads=16, n_kv_heads=16,
                ffn_hidden=8192, vocab=50000, seq_len=2048)


def _mem(**kw):
    load = RankLoad(n_layers=8, first=True, last=True, tp=kw.pop("tp", 1), cp=1,
                    in_flight_layers=kw.pop("in_flight", 8.0), params=formulas.params(GPT),
                    layer_params=formulas.layer_params(GPT))
    args = dict(replica=0, rank=0, capacity=80 * 2**30, precision="bf16", optimizer="adam",
                zero=0, dp=1, recompute="full", sequence_parallel=False, micro_batch=1,
                seq=2048)
    args.update(kw)
    return rank_memory(GPT, load, **args)


def test_mixed_precision_adam_is_16_bytes_per_parameter():
    assert state_bytes_per_param("bf16", "adam") == (2, 2, 12)  # ZeRO paper, Sec. 3.1
    assert state_bytes_per_param("fp32", "adam") == (4, 4, 8)
    n = formulas.params(GPT)
    m = _mem()
    assert m.params == pytest.approx(2 * n)
    assert m.grads == pytest.approx(2 * n)
    assert m.optimizer == pytest.approx(12 * n)


def test_zero_stages_shard_over_data_parallel():
    n = formulas.params(GPT)
    z1, z2, z3 = (_mem(zero=z, dp=4) for z in (1, 2, 3))
    assert z1.optimizer == pytest.approx(3 * n) and z1.grads == pytest.approx(2 * n)
    assert z2.grads == pytest.approx(n / 2) and z2.params == pytest.approx(2 * n)
    assert z3.params == pytest.approx(n / 2)
    # FSDP holds the current and the prefetched layer unsharded (bf16 copies)
    working = 2 * formulas.layer_params(GPT) * 2
    tensors = z3.params + z3.grads + z3.optimizer + z3.activations + working
    assert z3.other == pytest.approx(DEFAULT.reserved_memory_bytes + working
                                     + DEFAULT.allocator_fragmentation * tensors)


def test_reserved_memory_and_fragmentation_come_from_the_profile():
    # a profile with 2 GiB outside the allocator and 10% fragmentation (made-up values)
    prof = dataclasses.replace(DEFAULT, reserved_memory_bytes=2 * 2**30,
                               allocator_fragmentation=0.1)
    base, m = _mem(), _mem(profile=prof)
    tensors = m.params + m.grads + m.optimizer + m.activations
    assert m.other == pytest.approx(2 * 2**30 + 0.1 * tensors)
    assert m.total - base.total == pytest.approx(
        2 * 2**30 - DEFAULT.reserved_memory_bytes + 0.1 * tensors
        - DEFAULT.allocator_fragmentation * tensors)


@pytest.mark.parametrize("name", framework_names())
def test_every_framework_file_states_its_memory_outside_the_tensors(name):
    # the two figures are data with a citation in each file, not defaults left implicit
    text = (FRAMEWORKS_DIR / f"{name}.toml").read_text()
    assert "reserved_memory_gib =" in text and "allocator_fragmentation =" in text
    spec = load_framework(name)
    assert spec.reserved_memory_gib >= 0 and 0 <= spec.allocator_fragmentation < 1


def test_full_recompute_stashes_layer_inputs_per_in_flight_layer():
    a, b = _mem(in_flight=8.0), _mem(in_flight=16.0)
    per_layer_input = 2 * 2048 * 2048  # 2 s b h bytes (Korthikanti et al. Table 2)
    assert b.activations - a.activations == pytest.approx(8 * per_layer_input)


def test_selective_without_sequence_parallel_matches_korthikanti():
    sel = _mem(recompute="selective", in_flight=1.0)
    none = _mem(recompute="none", in_flight=1.0)
    s, b, h, a = 2048, 1, 2048, 16
    assert none.activations - sel.activations == pytest.approx(5 * a * s * s * b)  # 5as^2b
    head = formulas.head_activation_bytes(GPT, 2048, 1)
    assert sel.activations - head == pytest.approx(s * b * h * 34)  # 10 + 24/t with t=1


def test_oom_is_a_verdict_not_an_error():
    m, c = load_model("llama3.1-70b"), load_cluster("selene-a100")
    rep = simulate(m, c, parse_inline_plan("tp=1,pp=1,dp=8,mbs=1,gbs=8"))
    assert rep.oom and rep.bottleneck == "memory"
    assert rep.memory[0].total > rep.memory[0].capacity


def test_1f1b_first_rank_holds_the_most():
    m, c = load_model("llama3.1-8b"), load_cluster("selene-a100")
    rep = simulate(m, c, parse_inline_plan("tp=1,pp=4,dp=1,mbs=1,gbs=16"))
    acts = [r.activations for r in rep.memory]
    assert acts[0] > acts[1] > acts[2]
    assert all(r.other >= DEFAULT.reserved_memory_bytes for r in rep.memory)


@pytest.mark.parametrize("name", ["tiny-gpt", "tiny-llama", "opt-350m", "gpt2-tied"])
@pytest.mark.parametrize("pp", [1, 2])
def test_weights_held_are_the_models_parameters(name: str, pp: int) -> None:
    """bf16 weights (2 bytes each) summed over the pipeline ranks: every parameter once, and
    a second copy of a tied table on the last stage when pp > 1 (Megatron's; the runtime's
    param_infos too). Single-stage tied models keep their final norm and projections
    (opt-350m: the 512 x 1024 project_out)."""
    from dataclasses import replace

    m = (replace(load_model("tiny-gpt"), name=name, tied_embeddings=True)
         if name == "gpt2-tied" else load_model(name))
    rep = simulate(m, load_cluster("selene-a100"),
                   parse_inline_plan(f"tp=1,pp={pp},dp=1,mbs=1,gbs=8,precision=bf16"))
    copy = formulas.word_embedding_params(m) if pp > 1 and m.tied_embeddings else 0
    assert sum(r.params for r in rep.memory) == 2 * (formulas.params(m) + copy)
