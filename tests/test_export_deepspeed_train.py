"""hetpar's DeepSpeed train script (hetpar.runtime.deepspeed_train): the model it builds is the
exported model to the parameter and hetpar's runtime decoder to the loss, and the exported
launcher runs it as written, on CPU with gloo, through DeepSpeed's own launcher and engine."""

from __future__ import annotations

import importlib
import json
import os
import re
import shlex
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from loadscale import deadline

from hetpar import formulas as F
from hetpar.catalog import load_model, load_plan
from hetpar.errors import ConfigError
from hetpar.export import deepspeed_launch, export
from hetpar.specs.model import ModelSpec

torch = pytest.importorskip("torch", reason="the runtime extra: pip install -e .[runtime]")
pytest.importorskip("deepspeed", reason="DeepSpeed is not installed")
# hetpar's own modules (they need torch): a broken import fails, it is no skip
train = importlib.import_module("hetpar.runtime.deepspeed_train")
modules = importlib.import_module("hetpar.runtime.deepspeed_modules")
rm = importlib.import_module("hetpar.runtime.model")
tp_mod = importlib.import_module("hetpar.runtime.tp")
TPContext = tp_mod.TPContext

ROOT = Path(__file__).resolve().parent.parent
LLAMA = load_model("tiny-llama")  # rope, RMSNorm, SwiGLU, GQA, untied, no biases
# learned positions, LayerNorm, GELU, biases, tied embeddings, 3 layers
GPT_TIED = replace(load_model("tiny-gpt"), name="tiny-gpt-tied", n_layers=3,
                   tied_embeddings=True)
MODELS = {"tiny-llama": LLAMA, "tiny-gpt": load_model("tiny-gpt"), "tiny-gpt-tied": GPT_TIED}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_model_built_has_hetpars_parameter_count(name: str) -> None:
    m = MODELS[name]
    assert sum(p.numel() for p in modules.Decoder(m, 0, "none").parameters()) == F.params(m)
    unique: dict[object, int] = {}  # a tied module (TiedLayerSpec.key) is built twice
    for i, spec in enumerate(modules.layer_specs(m, 0)):
        unique[getattr(spec, "key", i)] = sum(p.numel() for p in spec.build().parameters())
    assert sum(unique.values()) == F.params(m)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_loss_is_hetpars_runtime_decoders(name: str) -> None:
    """Same weights (seeded by name) and tokens: the modules' loss equals the loss of
    hetpar.runtime.model's reference forward on the full parameter dict."""
    m, seed = MODELS[name], 3
    full = rm.param_infos(m, range(m.n_layers), first=True, last=True)
    p = {k: rm.init_param(k, info, seed, torch.float32) for k, info in full.items()}
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, m.vocab, (2, m.seq_len + 1), generator=g)
    x, y = tokens[:, :-1], tokens[:, 1:]
    single = tp_mod.SINGLE
    h = rm.blocks(m, p, range(m.n_layers), rm.embed(m, p, x, single), single)
    want = rm.head_loss(m, p, h, y, single, denom=y.numel())
    got = modules.loss_fn(modules.Decoder(m, seed, "none")(x), y)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6), (float(got), float(want))


def _run(cmd: list[str], cwd: Path) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DS_ACCELERATOR": "cpu",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=deadline(240))
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _export(plan: str, model: ModelSpec, out: Path) -> list[str]:
    e = export(load_plan(plan), model, "deepspeed", config_name="ds.json")
    out.mkdir()
    for name, text in e.files:
        (out / name).write_text(text)
    assert [n for n, _ in e.files] == ["ds.json", "ds.sh", "ds.model.toml"]
    return [ln for ln in e.files[1][1].splitlines() if ln.startswith("deepspeed ")]


@pytest.mark.timeout(deadline(300))
def test_the_exported_pipeline_launcher_runs_as_written(tmp_path: Path) -> None:
    """pp=2, tied embeddings across the stages, full recomputation, bf16: the launch line of
    ds.sh runs DeepSpeed's launcher and PipelineEngine; the stages hold hetpar's split."""
    (line,) = _export("pp=2,dp=1,gbs=8,mbs=2,zero=1,recompute=full", GPT_TIED, tmp_path / "x")
    words = shlex.split(line)  # the line as written, on a free port (not 29500, which
    assert words[-1] == "$@"   # other jobs on a shared machine may hold)
    port = _free_port()
    cmd = [words[0], "--master_port", str(port), *words[1:-1], "--steps", "2"]
    out = _run(cmd, tmp_path / "x")
    # DeepSpeed's CPU all-reduce buffers (66 MiB a rank, named by the port; its launcher sets
    # LOCAL_SIZE, which turns them on) are gone: deepspeed_train._unlink_shm_buffer removes
    # the names, which DeepSpeed never does
    left = list(Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_*_{port}_*"))
    assert not left, left
    held = dict(re.findall(r"hetpar: stage (\d) holds transformer layers (\[\d+, \d+\))", out))
    assert held == {"0": "[0, 2)", "1": "[2, 3)"}  # hetpar's split_layers(3, 2)
    losses = [float(v) for v in re.findall(r"hetpar: step \d+ loss (\S+)", out)]
    assert len(losses) == 2 and all(abs(v - 5.545) < 0.5 for v in losses)  # ~ ln(256) at init
    assert "trained tiny-gpt-tied for 2 steps" in out


@pytest.mark.timeout(deadline(300))
def test_zero3_data_parallel_export_trains(tmp_path: Path) -> None:
    """dp=2 ZeRO-3 with gradient accumulation, through torchrun (DeepSpeed reads the same
    environment as from its launcher): the launcher's arguments, unchanged."""
    (line,) = _export("dp=2,gbs=8,mbs=2,zero=3", LLAMA, tmp_path / "z")
    args = line.split(" --module ")[1].split()[1:-1]  # after the module name, without "$@"
    out = _run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                "--master-port", str(_free_port()), "-m", deepspeed_launch.MODULE,
                *args, "--steps", "2"], tmp_path / "z")
    assert "trained tiny-llama for 2 steps" in out


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_tp_shards_sum_to_hetpars_parameter_count(name: str) -> None:
    """tp=2: the sharded parameters of both TP ranks plus the replicated ones (counted once)
    are formulas.params; a shard is the full seeded tensor's Megatron chunk."""
    m, tp = MODELS[name], 2
    ranks = [modules.Decoder(m, 0, "none", TPContext(None, tp, r)) for r in range(tp)]
    sharded = sum(p.numel() for d in ranks for p in d.parameters() if p.tensor_model_parallel)
    replicated = [sum(p.numel() for p in d.parameters() if not p.tensor_model_parallel)
                  for d in ranks]
    assert sharded > 0 and replicated[0] == replicated[1]
    assert sharded + replicated[0] == F.params(m)
    full = rm.init_param("layers.0.wq", rm.param_infos(m, range(1), False, False)["layers.0.wq"],
                         0, torch.float32)
    assert torch.equal(ranks[1].layers[0].tensors()["layers.0.wq"], full.chunk(tp)[1])


def _reference_losses(m: ModelSpec, cfg: dict[str, int], seed: int = 1234,
                      lr: float = 3e-4) -> list[float]:
    """Replica 0's loss at steps 1 and 2 of one process training the full model (hetpar's
    runtime.model forward, the script's data and AdamW), with each step's gradient the mean
    over the dp replicas' micro-batches (gradient accumulation 1)."""
    dp = cfg["train_batch_size"] // cfg["train_micro_batch_size_per_gpu"]
    infos = rm.param_infos(m, range(m.n_layers), first=True, last=True)
    p = {k: torch.nn.Parameter(rm.init_param(k, i, seed, torch.float32))
         for k, i in infos.items()}
    opt = torch.optim.AdamW(p.values(), lr=lr)
    data = [train._batches(m.vocab, cfg["train_micro_batch_size_per_gpu"], m.seq_len, seed, r)
            for r in range(dp)]
    single, out = tp_mod.SINGLE, []
    for _ in range(2):
        losses = []
        for replica in data:
            x, y = next(replica)
            h = rm.blocks(m, p, range(m.n_layers), rm.embed(m, p, x, single), single)
            losses.append(rm.head_loss(m, p, h, y, single, denom=y.numel()))
        out.append(float(losses[0].detach()))
        opt.zero_grad()
        (sum(losses) / dp).backward()
        opt.step()
    return out


@pytest.mark.timeout(deadline(300))
@pytest.mark.parametrize(("plan", "name"), [
    ("tp=2,gbs=2,mbs=2,precision=fp32", "tiny-llama"),
    ("tp=2,dp=2,gbs=4,mbs=2,zero=1,precision=fp32", "tiny-gpt-tied"),
    ("tp=2,pp=2,gbs=2,mbs=2,zero=1,recompute=full,precision=fp32", "tiny-llama"),
])
def test_the_exported_tp_launcher_runs_as_written_with_the_reference_losses(
        tmp_path: Path, plan: str, name: str) -> None:
    """tp=2, tp=2 x dp=2 with ZeRO-1, tp=2 x pp=2 (vocabulary-parallel loss on the last
    stage, recomputation): ds.sh's launch line runs hetpar's TP decoder through DeepSpeed's
    launcher (and PipelineEngine) on gloo; replica 0's losses at steps 1 and 2 are a single
    process's on the full model (step 2 after one AdamW step on the dp-mean gradient: a
    reduction over the whole world instead of the dp group would average different shards)."""
    m = MODELS[name]
    (line,) = _export(plan, m, tmp_path / "t")
    words = shlex.split(line)
    cmd = [words[0], "--master_port", str(_free_port()), *words[1:-1], "--steps", "2"]
    out = _run(cmd, tmp_path / "t")
    got = [float(v) for v in re.findall(r"hetpar: step \d+ loss (\S+)", out)]
    assert "not DeepSpeed AutoTP" in (tmp_path / "t" / "ds.sh").read_text()
    cfg = json.loads((tmp_path / "t" / "ds.json").read_text())
    want = _reference_losses(m, cfg)
    # fp32; TP reorders the sums of the row-parallel outputs and of the vocabulary-parallel
    # softmax, and the script prints 6 decimals (measured: within 3e-7)
    assert got == pytest.approx(want, abs=1e-5), (got, want)
    assert f"trained {name} for 2 steps" in out


@pytest.mark.parametrize(("plan", "model", "why"), [
    ("tp=3,gbs=6", LLAMA, "not divisible by tp (3)"),
    ("pp=2,gbs=8", load_model("mixtral-8x7b"), "mixture-of-experts"),
])
def test_plans_it_cannot_run_launch_the_contracts_train_py(plan: str, model: ModelSpec,
                                                           why: str) -> None:
    e = export(load_plan(plan), model, "deepspeed")
    assert [n for n, _ in e.files] == ["ds_config.json", "ds_config.sh"]
    assert " train.py --deepspeed " in e.files[1][1] and why in e.files[1][1]
    assert "cannot run this plan" in e.files[1][1] and e.problems() == []


def test_the_script_refuses_a_model_it_cannot_build(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "m.toml"
    f.write_text(Path(ROOT / "hetpar/catalog/models/tiny-llama.toml").read_text()
                 + "qk_norm = true\n")
    with pytest.raises(ConfigError, match="cannot train 'tiny-llama': the runtime decoder "
                       "builds 131,392 parameters, hetpar counts 131,456"):
        train.main(["--model", str(f), "--deepspeed", "--deepspeed_config", "x.json"])


def _every_model() -> list[ModelSpec]:
    from hetpar import catalog
    from hetpar.hf.convert import model_from_hf_config
    from hetpar.io import read_document

    hf = sorted((ROOT / "tests/fixtures/hf").glob("*.json"))
    return ([catalog.load_model(n) for n in catalog.names("models")]
            + [model_from_hf_config(read_document(p), p.stem) for p in hf])


def test_the_export_launches_it_exactly_for_the_models_it_builds() -> None:
    """The export's feature list (deepspeed_launch.script_gap) and the script's own check (the
    parameters it builds = formulas.params) agree on every catalog model and HF fixture."""
    models = _every_model()
    agree = {m.name: (deepspeed_launch.script_gap(m, 1) == "") == (modules.shape_gap(m) == "")
             for m in models}
    assert all(agree.values()), [n for n, ok in agree.items() if not ok]
    gaps = [modules.shape_gap(m) for m in models]
    assert any(gaps) and not all(gaps)
