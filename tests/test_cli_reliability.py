"""The named cases of issue 14: no traceback, no silent wrong answer, files and processes."""

from __future__ import annotations

import json
import os
import shlex
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from loadscale import deadline
from test_cli_fuzz import TINY, Result, assert_clean, check, run_cli

from hetpar.cli.main import COMMANDS, REPORT_BUG, build_parser

ROOT = Path(__file__).resolve().parent.parent
HETPAR = [sys.executable, "-m", "hetpar.cli.main"]


def refused(argv: list[str], needle: str) -> Result:
    """``hetpar ARGV`` exits 2 with one line containing ``needle``."""
    r = check(argv)
    assert r.code == 2, (argv, r.out[-500:])
    assert needle in r.err, (needle, r.err)
    return r


def explicit_plan(tmp_path: Path, body: str) -> str:
    path = tmp_path / "plan.toml"
    path.write_text(body)
    return str(path)


# ---- silent wrong answers ---------------------------------------------------------------

def test_duplicate_inline_keys_are_refused() -> None:
    refused(["simulate", "--model", "llama3.1-8b", "--cluster", "selene-a100",
             "--plan", "tp=2,tp=4,gbs=64"], "key 'tp' given twice")
    refused(["simulate", "--model", "llama3.1-8b", "--cluster", "selene-a100",
             "--plan", "mbs=1,micro_batch=2,gbs=64"], "given twice")
    refused(["replay", "--model", "tiny-llama", "--job", "gbs=64,gbs=32",
             "--trace", "straggler-node"], "given twice")


@pytest.mark.parametrize("argv", [
    ["simulate", "--plan", ""],
    ["simulate", "--model", " "],
    ["export", "--plan", "", "--model", "tiny-llama", "--to", "megatron"],
    ["report", "--compare", "", "--out", "r.html"],
])
def test_empty_values_are_refused_not_defaulted(argv: list[str]) -> None:
    refused(argv, "empty value")


TWO_ON_ONE = """
[[replicas]]
batch = 4
micro_batch = 1
[[replicas.stages]]
layers = [0, 2]
group = "a100"
tp = 2
devices = [0, 1]

[[replicas]]
batch = 4
micro_batch = 1
[[replicas.stages]]
layers = [0, 2]
group = "a100"
tp = 2
devices = [1, 2]
"""


def test_two_replicas_pinned_to_one_device_are_refused_everywhere(tmp_path: Path) -> None:
    plan = explicit_plan(tmp_path, TWO_ON_ONE)
    refused(["simulate", "--model", "tiny-llama", "--cluster", TINY, "--plan", plan],
            "device 1 of node group 'a100' is pinned by replica 0 stage 0 and replica 1")
    refused(["run", "--model", "tiny-llama", "--cluster", TINY, "--plan", plan, "--dry-run"],
            "device 1")
    refused(["report", "--model", "tiny-llama", "--cluster", TINY, "--plan", plan,
             "--out", str(tmp_path / "r.html")], "pinned")


def test_explicit_stage_tp_that_does_not_divide_the_heads_is_not_silent(tmp_path: Path) -> None:
    # tiny-llama has 4 heads: an explicit tp=3 stage is refused as the uniform tp=3 is, unless
    # the plan states nonuniform TP (uneven_tp, as the NTP plans of `hetpar failures
    # --write-plan` do): then simulated by its largest shard, the report says so, and the
    # runtime, like an inline tp=3, refuses it
    plan = explicit_plan(tmp_path, """
uneven_tp = true
[[replicas]]
batch = 4
micro_batch = 1
[[replicas.stages]]
layers = [0, 2]
group = "a100"
tp = 3
""")
    r = check(["simulate", "--model", "tiny-llama", "--cluster", TINY, "--plan", plan])
    assert r.code == 0 and "stage tp=3 does not divide n_heads=4" in r.out
    refused(["simulate", "--model", "tiny-llama", "--cluster", TINY,
             "--plan", "tp=3,gbs=4,group=a100"], "n_heads (4) not divisible by tp (3)")
    refused(["run", "--model", "tiny-llama", "--cluster", TINY, "--plan", plan, "--dry-run"],
            "not divisible by tp (3)")


def test_export_refuses_more_pipeline_stages_than_layers() -> None:
    refused(["export", "--plan", "pp=64,gbs=64", "--model", "llama3.1-8b", "--to", "megatron"],
            "pp*vpp = 64 pipeline chunks > 32 layers")


def test_export_of_a_mixture_of_experts_warns_that_experts_are_not_exported(
        tmp_path: Path) -> None:
    r = check(["export", "--plan", "tp=2,gbs=64", "--model", "mixtral-8x7b", "--to",
               "deepspeed", "--out", str(tmp_path / "x.json")])
    assert r.code == 0 and "mixture of experts (8 experts, top-2)" in r.err


def test_torchtitan_export_of_a_mixture_of_experts_is_refused(tmp_path: Path) -> None:
    refused(["export", "--plan", "tp=2,gbs=64", "--model", "mixtral-8x7b", "--to", "torchtitan",
             "--framework-version", "2025-10", "--out", str(tmp_path / "x.toml")],
            "is a mixture of experts")
    # ... naming the targets that do export this plan (tests/test_export_oracles.py checks
    # that they accept it)
    r = refused(["export", "--plan", "tp=2,gbs=64", "--model", "mixtral-8x7b", "--to",
                 "torchtitan"], "; this plan exports with --to ")
    assert "--to megatron" in r.err and "--to deepspeed" in r.err
    assert not (tmp_path / "x.toml").exists()


def test_megatron_export_of_a_mixture_of_experts_keeps_the_experts() -> None:
    r = check(["export", "--plan", "tp=2,gbs=64", "--model", "mixtral-8x7b", "--to", "megatron"])
    assert r.code == 0 and "--num-experts 8" in r.out and "mixture" not in r.err


QWEN_MOE = str(Path(__file__).parent / "fixtures" / "hf" / "qwen1.5-moe-a2.7b.json")


def test_hf_qwen_moe_config_simulates_and_exports_its_expert_sizes(tmp_path: Path) -> None:
    r = check(["simulate", "--model", QWEN_MOE, "--cluster", "selene-a100", "--plan",
               "tp=2,dp=4,gbs=64", "--json"])
    assert r.code == 0 and json.loads(r.out)["inputs"]["model"] == "qwen1.5-moe-a2.7b"
    r = check(["export", "--plan", "tp=2,gbs=64", "--model", QWEN_MOE, "--to", "megatron"])
    assert r.code == 0 and "--moe-ffn-hidden-size 1408" in r.out
    assert "--moe-shared-expert-intermediate-size 5632" in r.out
    assert "shared_expert_gate" in r.err  # no argument for the gate at the cited commit
    refused(["export", "--plan", "tp=2,gbs=64", "--model", QWEN_MOE, "--to", "torchtitan",
             "--out", str(tmp_path / "x.sh")], "moe_ffn_hidden=1408")


def test_misspelt_gpu_in_price_is_named() -> None:
    r = check(["plan", "--model", "tiny-llama", "--cluster", TINY, "--job", "gbs=8",
               "--objective", "cost", "--price", "H10O=2.5,A100=1.0", "--workers", "1",
               "--top", "1"])
    assert r.code == 0
    assert "--price 'H10O' matches no GPU of the cluster" in r.err and "'A100'" not in r.err


def _runs(tmp_path: Path, **cells: str) -> str:
    from hetpar.validation.rows import BUNDLED_RUNS

    lines = BUNDLED_RUNS.read_text().splitlines()
    header = lines[0].split(",")
    import csv
    import io

    row = next(csv.reader(io.StringIO(lines[1])))
    for k, v in cells.items():
        row[header.index(k)] = v
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows([header, row])
    path = tmp_path / "runs.csv"
    path.write_text(out.getvalue())
    return str(path)


@pytest.mark.parametrize("cells,status", [
    ({"measured_tokens_per_s_per_gpu": "inf"}, "unsupported"),
    ({"scaleout_gbps_per_gpu": "inf"}, "unsupported"),
    ({"n_layers": "1000000000000"}, "unsupported"),
    ({"n_layers": "inf"}, "unsupported"),
    ({"n_layers": "2400", "pp": "1"}, "oom"),  # a trained run the simulator calls OOM: a miss
])
def test_validate_never_prints_nan_nor_counts_a_broken_row_ok(
        cells: dict[str, str], status: str, tmp_path: Path) -> None:
    path = _runs(tmp_path, **cells)
    r = check(["validate", path])
    assert r.code == 0 and "nan%" not in r.out and "inf%" not in r.out
    total = next(ln for ln in r.out.splitlines() if ln.startswith("all "))
    assert total.split()[1:3] == ["1", "0"], r.out  # 1 row, 0 ok
    rows = json.loads(check(["validate", path, "--json"]).out)["rows"]
    assert rows[0]["status"] == status


def test_report_plans_dir_must_hold_plans(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    refused(["report", "--plans-dir", str(tmp_path / "empty"), "--out",
             str(tmp_path / "r.html")], "no plan files")


def test_plan_out_writes_one_set(tmp_path: Path) -> None:
    out = tmp_path / "plans"
    out.mkdir()
    for i in range(1, 6):
        (out / f"plan-{i}.toml").write_text("stale = true\n")
    (out / "notes.txt").write_text("mine\n")
    r = check(["plan", "--model", "tiny-llama", "--cluster", TINY, "--job", "gbs=8",
               "--workers", "1", "--top", "2", "--out", str(out)])
    assert r.code == 0 and "removed 3 stale plan files" in r.err
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "plan-1.toml", "plan-2.toml"]
    assert "stale" not in (out / "plan-1.toml").read_text()


# ---- option ranges, checked before any work ---------------------------------------------

RANGES = [
    ("failures --days 1000000000", "--days: 1000000000 not allowed; allowed: 0..3650"),
    ("failures --seed -1", "--seed: -1 not allowed; allowed: 0..4294967295"),
    ("failures --samples -3", "--samples"), ("failures --rate-scale nan", "--rate-scale"),
    ("failures --boost-fraction 2", "--boost-fraction"), ("failures --warmup-days inf", ""),
    ("failures --failed-fraction -0.1", ""), ("failures --spares -1", ""),
    ("failures --blast-radius -2", ""), ("failures --restart-s -5", ""),
    ("failures --checkpoint-interval-s 0", ""), ("failures --boost-max 0.5", ""),
    ("failures --fractions 0.1,2", "--fractions"), ("failures --ntp-degrees 2.5", ""),
    ("failures --power-curve 1.1:nan", "--power-curve"),
    ("run --model tiny-llama --plan tp=2,gbs=8 --timeout 0", "--timeout: 0 not allowed"),
    ("run --model tiny-llama --plan tp=2,gbs=8 --steps 0", "--steps"),
    ("run --model tiny-llama --plan tp=2,gbs=8 --every -1", "--every"),
    ("run --model tiny-llama --plan tp=2,gbs=8 --seed -1", "--seed"),
    ("plan --model tiny-llama --cluster selene-a100 --top 0", "--top"),
    ("plan --model tiny-llama --cluster selene-a100 --workers 0", "--workers"),
    ("failures --workers 0", "--workers: must be >= 1"),
    ("failures --workers rayy", "ray[:ADDRESS]"),
    ("replay --model tiny-llama --job gbs=64 --trace straggler-node --workers -2", "--workers"),
    ("plan --model tiny-llama --cluster selene-a100 --budget -1", "--budget"),
    ("plan --model tiny-llama --cluster selene-a100 --target nan", "--target"),
    ("describe model tiny-llama --seq-len 0", "--seq-len"),
    ("describe model tiny-llama --tp -1", "--tp"),
    ("describe model tiny-llama --micro-batch 1e9", "--micro-batch"),
    ("calibrate --ranks 0", "--ranks"), ("calibrate --seconds 0", "--seconds"),
    ("calibrate --seconds inf", "--seconds"),
]


@pytest.mark.parametrize("command,needle", RANGES)
def test_option_ranges_are_checked_before_any_work(
        command: str, needle: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from hetpar.failures import analysis

    def no_work(*a: object, **k: object) -> None:
        raise AssertionError("work started before the options were checked")

    monkeypatch.setattr(analysis, "make_setup", no_work)
    refused(shlex.split(command), needle)


def test_calibrate_checks_options_before_measuring(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch", reason="the runtime extra: pip install -e .[runtime]")
    from hetpar.runtime import calibrate as cal

    def no_work(*a: object, **k: object) -> None:
        raise AssertionError("measured before the options were checked")

    monkeypatch.setattr(cal, "measure", no_work)
    refused(["calibrate", "--device", "tpu"], "--device 'tpu' unknown")
    refused(["calibrate", "--gpu", "H100-typo"], "unknown gpu 'H100-typo'")
    (tmp_path / "f").write_text("")
    refused(["calibrate", "--out", str(tmp_path / "f" / "x.toml")], "is not a directory")


# ---- files, paths and the error boundary ------------------------------------------------

def test_unreadable_and_unwritable_paths_are_one_line_errors(tmp_path: Path) -> None:
    d = tmp_path / "dir.toml"
    d.mkdir()
    (tmp_path / "afile").write_text("x\n")
    base = ["--plan", "tp=2,gbs=8", "--model", "tiny-llama", "--to"]
    check(["simulate", "--model", str(d)])  # a folder named like a model file
    refused(["export", *base, "megatron", "--out", str(d)], "is a directory")
    refused(["export", *base, "megatron", "--out", str(tmp_path / "afile" / "x.sh")],
            "afile is not a directory")
    refused(["simulate", "--trace", str(tmp_path / "afile" / "t.json")], "not a directory")
    refused(["validate", str(d)], "file not found")
    binary = tmp_path / "bin.csv"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    refused(["validate", str(binary)], "bin.csv")
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    refused(["report", "--curves", str(deep), "--out", str(tmp_path / "r.html")], "deep.json")
    refused(["import", "--from", "deepspeed", str(deep), "--model", "tiny-llama"], "deepspeed")
    refused(["replay", "--model", "tiny-llama", "--job", "gbs=64", "--trace", str(deep)],
            "deep.json")


def test_run_checkpoint_that_cannot_be_written_is_refused_before_forking(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # found by hand (docs/issue14-checklist.md): the ranks trained, then each died in a
    # PermissionError traceback when saving; now refused before anything is forked
    from hetpar.runtime import api

    def no_fork(*a: object, **k: object) -> None:
        raise AssertionError("ranks forked before --checkpoint was checked")

    monkeypatch.setattr(api, "run", no_fork)
    (tmp_path / "afile").write_text("x\n")
    run = ["run", "--model", "tiny-llama", "--plan", "tp=2,gbs=4", "--steps", "2"]
    refused([*run, "--checkpoint", str(tmp_path / "afile" / "ck")], "afile is not a directory")
    # root may write where os.access looks; a probe file says what the kernel allows
    refused([*run, "--checkpoint", "/proc/ck"], "--checkpoint /proc/ck: cannot write there")


def test_an_output_that_is_a_pipe_or_device_is_refused_not_replaced(tmp_path: Path) -> None:
    # found by hand: `export --out /dev/full` renamed a file over the device node
    fifo = tmp_path / "fifo.sh"
    os.mkfifo(fifo)
    refused(["export", "--plan", "tp=2,gbs=8", "--model", "tiny-llama", "--to", "megatron",
             "--out", str(fifo)], "is not a regular file")
    refused(["report", "--out", str(fifo)], "is not a regular file")
    assert stat.S_ISFIFO(fifo.stat().st_mode)


def test_an_error_quoting_a_huge_input_stays_a_short_line(tmp_path: Path) -> None:
    # found by hand: the megatron importer quoted a 200,000-character line in its error
    deep = tmp_path / "deep.sh"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    r = refused(["import", "--from", "megatron", str(deep), "--model", "tiny-llama"],
                "megatron: expected an option, got '[[[")
    assert len(r.err.strip()) < 500 and "characters left out" in r.err, len(r.err)
    assert r.err.strip().endswith("]]]'"), r.err[-80:]


def test_a_bug_prints_its_traceback_and_asks_for_a_report(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import hetpar.cli.describe as describe

    def bug(args: object) -> int:
        raise KeyError("an internal invariant")

    monkeypatch.setattr(describe, "run", bug)
    r = run_cli(["describe"])
    assert r.code == 1 and "Traceback" in r.err and r.err.strip().endswith(REPORT_BUG)


def test_output_files_are_0644_and_the_launcher_is_executable(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        check(["export", "--plan", "tp=2,dp=2,gbs=8,zero=1", "--model", "tiny-llama",
               "--to", "deepspeed", "--out", str(tmp_path / "ds.json")])
        check(["import", "--from", "metis", str(ROOT / "tests/fixtures/importers/metis/hostfile"),
               "--out", str(tmp_path / "c.toml")])
        check(["simulate", "--model", "tiny-llama", "--cluster", TINY,
               "--plan", "tp=2,gbs=8,group=a100", "--trace", str(tmp_path / "t.json")])
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()}
    # ds.model.toml: the model file the exported launcher's train module reads
    assert modes == {"ds.json": 0o644, "ds.sh": 0o755, "ds.model.toml": 0o644, "c.toml": 0o644,
                     "t.json": 0o644}


# ---- help, progress, subprocesses -------------------------------------------------------

def _help_examples() -> list[list[str]]:
    import importlib

    out = []
    for name in COMMANDS:
        text = (getattr(importlib.import_module(name), "EXAMPLES", "") or "")
        text = text.replace("\\\n", " ")
        for line in text.splitlines():
            line = line.split("#")[0].split("&&")[0].split(" > ")[0].strip()
            if line.startswith("hetpar "):
                out.append(shlex.split(line)[1:])
    return out


@pytest.mark.parametrize("argv", _help_examples(), ids=" ".join)
def test_help_examples_name_what_exists(argv: list[str]) -> None:
    from hetpar import catalog

    args = build_parser().parse_args(argv)
    loaders = {"model": catalog.load_model, "cluster": catalog.load_cluster,
               "job": catalog.load_job, "plan": catalog.load_plan}
    for key, load in loaders.items():
        ref = getattr(args, key, None)
        if isinstance(ref, str) and not ref.endswith((".toml", ".json")):
            load(ref)  # a ConfigError here is an example that fails as written


def test_progress_bars_only_on_a_terminal_and_never_with_quiet(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from hetpar.validation.rows import BUNDLED_RUNS

    small = tmp_path / "runs.csv"
    small.write_text("\n".join(BUNDLED_RUNS.read_text().splitlines()[:4]) + "\n")

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    def stderr_of(argv: list[str], tty: bool) -> str:
        err = Tty() if tty else io.StringIO()
        monkeypatch.setattr(sys, "stderr", err)
        monkeypatch.setattr(sys, "stdout", io.StringIO())
        from hetpar.cli.main import main

        assert main(argv) == 0
        monkeypatch.undo()
        return err.getvalue()

    assert "validating" in stderr_of(["validate", str(small)], tty=True)
    assert stderr_of(["validate", str(small)], tty=False) == ""
    assert stderr_of(["validate", str(small), "--quiet"], tty=True) == ""


def test_as_real_processes_bad_input_is_one_line_and_exit_2() -> None:
    # the console script's own path: argparse's usage error and a loader error, run at once
    cases = [["simulate", "--plan", "tp=2,tp=4"], ["failures", "--days", "1000000000"]]
    procs = [subprocess.Popen([*HETPAR, *argv], cwd=ROOT, text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE) for argv in cases]
    for p in procs:
        out, err = p.communicate(timeout=deadline(120))
        assert p.returncode == 2 and out == ""
        assert len(err.splitlines()) == 1 and err.startswith("hetpar: error:"), err


def test_a_closed_pipe_is_not_an_error() -> None:
    p = subprocess.run(f"{shlex.join(HETPAR)} describe models | head -1", shell=True,
                       capture_output=True, text=True, timeout=deadline(120), cwd=ROOT)
    assert p.returncode == 0 and p.stdout.startswith("models") and p.stderr == ""


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(x) for x in (task / "children").read_text().split()]
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")  # a zombie is dead, waiting for init to reap it


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sigkill_of_plan_leaves_no_worker_processes(tmp_path: Path) -> None:
    # Event-based: each worker writes a marker when it starts (HETPAR_WORKER_MARKERS), and
    # the test waits for that, however long the search takes to get there on a busy machine
    # (a fixed 90 s failed at load 12; the pool also starts its processes lazily, so one
    # marker is the event, not two children). The deadlines only stop a hang.
    marks = tmp_path / "workers"
    marks.mkdir()
    env = {**os.environ, "HETPAR_WORKER_MARKERS": str(marks)}
    # DeepSeek-V3 on the 32k-GPU B200 cluster: its workers start within seconds and the search
    # runs on for about 30 s more (idle 2-core machine: first worker 7.6 s, exit 39.8 s), where
    # hetero-1024's driver took 50-140 s before its first worker.
    p = subprocess.Popen([*HETPAR, "plan", "--model", "deepseek-v3", "--cluster",
                          "b200-nvl32-32k", "--workers", "2", "--quiet"], cwd=ROOT, env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    kids: list[int] = []
    try:
        until = time.monotonic() + deadline(600)
        while not kids and p.poll() is None and time.monotonic() < until:
            time.sleep(0.2)
            kids = [int(f.name) for f in marks.iterdir()]
        assert kids, f"the search started no workers (exit {p.poll()})"
        assert p.poll() is None, "the search ended before it could be killed: nothing tested"
        p.send_signal(signal.SIGKILL)
        p.wait(deadline(10))
        until = time.monotonic() + deadline(30)
        while any(map(_alive, kids)) and time.monotonic() < until:
            time.sleep(0.1)
        assert not any(map(_alive, kids)), "workers outlived a SIGKILLed hetpar plan"
    finally:
        p.kill()
        p.wait(deadline(10))
        for k in filter(_alive, kids):  # clean up after a failure
            os.kill(k, signal.SIGKILL)


def test_the_fuzz_helpers_reject_a_traceback_and_two_lines() -> None:
    with pytest.raises(AssertionError):
        assert_clean(["x"], Result(2, "", "Traceback (most recent call last):\nboom\n"))
    with pytest.raises(AssertionError):
        assert_clean(["x"], Result(2, "", "hetpar: error: a\nhetpar: error: b\n"))
    with pytest.raises(AssertionError):
        assert_clean(["x"], Result(1, "", "hetpar: error: a\n"))
    assert_clean(["x"], Result(2, "", "hetpar: warning: w\nhetpar: error: a\n"))
