"""Fuzz every command with random and broken documents and option values (issue 14).

Each case runs `hetpar` in-process through ``main()`` with captured output (a few run as
real subprocesses) and must end in exit 0 with output, or exit 2 with exactly one line on
stderr (warnings aside) -- never a traceback, never a hang. Hypothesis draws a fresh sample
per run; FUZZ_EXAMPLES=N runs more (the counts in the issue's report came from N=400).
"""

from __future__ import annotations

import contextlib
import copy
import io
import itertools
import json
import os
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from loadscale import deadline

from hetpar.catalog import ROOT as CATALOG
from hetpar.cli.main import main
from hetpar.io import dump_toml, read_document

FIX = Path(__file__).parent / "fixtures"
TINY = str(FIX / "fuzz" / "tiny.toml")
EXPLICIT = FIX / "fuzz" / "explicit.toml"
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "25"))
# a case that runs longer is a hang (the slowest valid case takes ~2 s on an idle machine);
# stretched by the load, so that a busy CI machine does not turn a slow case into a "hang"
HANG_S = int(deadline(30))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
COUNT = itertools.count()
TALLY: dict[int, int] = {}  # exit code -> cases (FUZZ_STATS=FILE writes it at the end)


class Hang(BaseException):
    """Raised by the alarm; a BaseException, so the CLI's error boundary cannot swallow it."""


@dataclass
class Result:
    code: int
    out: str
    err: str


def _alarm(signum: int, frame: Any) -> None:
    raise Hang(f"no result after {HANG_S} s")


def run_cli(argv: list[str]) -> Result:
    """``hetpar ARGV`` in this process: exit code, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(HANG_S)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as e:  # argparse: --help, usage errors
                code = e.code if isinstance(e.code, int) else 1
            except Hang:
                code = -1
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    TALLY[code] = TALLY.get(code, 0) + 1
    return Result(code, out.getvalue(), err.getvalue())


def assert_clean(argv: list[str], r: Result) -> None:
    """Exit 0 with output, or exit 2 with one error line; never a traceback."""
    what = f"hetpar {' '.join(map(repr, argv))}"
    assert r.code != -1, f"{what}: no result after {HANG_S} s"
    assert "Traceback" not in r.err, f"{what}: traceback\n{r.err[-3000:]}"
    if r.code == 0:
        assert r.out.strip() or r.err.strip(), f"{what}: exit 0 but printed nothing"
        return
    assert r.code == 2, f"{what}: exit {r.code}\n{r.err[-2000:]}"
    lines = [x for x in r.err.splitlines()
             if x.strip() and not x.startswith("hetpar: warning:")]
    assert len(lines) == 1 and lines[0].startswith("hetpar"), f"{what}: stderr\n{r.err[-2000:]}"


def check(argv: list[str]) -> Result:
    r = run_cli(argv)
    assert_clean(argv, r)
    return r


@pytest.fixture(scope="module", autouse=True)
def _stats() -> Iterator[None]:
    yield
    if os.environ.get("FUZZ_STATS"):
        Path(os.environ["FUZZ_STATS"]).write_text(json.dumps(TALLY) + "\n")


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def fresh(work: Path, suffix: str) -> Path:
    """A new file name each time: the catalog loaders cache by path."""
    return work / f"doc{next(COUNT)}{suffix}"


# ---- values and documents -------------------------------------------------------------

JUNK = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, -1, 1, 3, 10**12, 2**63]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.lists(st.integers(-3, 10**6), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(-3, 9), max_size=2),
)
OPTION_TEXT = st.one_of(
    st.sampled_from(["", " ", "-1", "0", "1", "2", "nan", "inf", "-inf", "1e308", "1e-320",
                     "2.5", "99999999999999999999", "abc", "tp=2,tp=4", "=", ",", "x=",
                     "\u00e9", "1,2", "-0"]),
    st.integers(-(2**40), 2**40).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
            max_size=8),
)
# Output paths stay inside the test's folder (the CLI runs there): no "/" or "..", but an
# existing folder, a file used as a folder, odd or missing suffixes.
OUTPUT_TEXT = st.one_of(
    st.sampled_from(["", ".", "adir", "afile/x.toml", "afile", "x", "x.png", "x.svg", "x.toml",
                     "x.json", "x.html", "x.csv", "new/deeper/x.json", "adir/"]),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="/\\\x00."),
            min_size=1, max_size=8),
)
OUTPUTS = {"--out", "--report", "--plot", "--write-plan", "--checkpoint", "--trace"}
BROKEN_TEXT = st.one_of(
    st.sampled_from(["", "\n", "[", "{", "a = ", "= 1", "[[x]]\n[x]", "{\"a\": }",
                     "[" * 5000 + "]" * 5000, "{\"a\":" * 3000 + "1" + "}" * 3000,
                     "x = [" * 3000, "a = 1\na = 2", "a = 1" + "0" * 5000]),
    st.text(max_size=60),
)


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _paths(v, (*prefix, i))


@st.composite
def mutated(draw: st.DrawFn, base: dict[str, Any]) -> dict[str, Any]:
    """``base`` with one to three keys replaced by junk, deleted, or added."""
    doc = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in _paths(doc) if p]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = doc
        for k in path[:-1]:
            parent = parent[k]
        action = draw(st.sampled_from(["junk", "junk", "delete", "add"]))
        if action == "junk":
            parent[path[-1]] = draw(JUNK)
        elif action == "delete" and isinstance(parent, dict):
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.text(min_size=1, max_size=6))] = draw(JUNK)
    return doc


def _serialise(doc: dict[str, Any], suffix: str) -> str:
    if suffix == ".json":
        return json.dumps(doc)  # NaN / Infinity literals too: json.loads accepts them
    try:
        return dump_toml(_no_none(doc))
    except AssertionError:  # a value TOML cannot hold
        return json.dumps(doc)


def _no_none(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _no_none(v) for k, v in x.items() if v is not None}
    if isinstance(x, list):
        return [_no_none(v) for v in x if v is not None]
    return x


@st.composite
def document(draw: st.DrawFn, base: dict[str, Any]) -> tuple[str, bytes]:
    """(suffix, bytes) of a broken document: a mutated ``base``, junk text or junk bytes."""
    suffix = draw(st.sampled_from([".toml", ".json"]))
    kind = draw(st.sampled_from(["mutated", "mutated", "mutated", "text", "bytes"]))
    if kind == "mutated":
        return suffix, _serialise(draw(mutated(base)), suffix).encode()
    if kind == "text":
        return suffix, draw(BROKEN_TEXT).encode("utf-8", "surrogatepass")
    return suffix, draw(st.binary(max_size=64)) + b"\xff\xfe\x00"


def _catalog(kind: str, name: str) -> dict[str, Any]:
    return read_document(next((CATALOG / kind).glob(f"{name}.*")))


BASES = {
    "model": _catalog("models", "tiny-llama"),
    "cluster": read_document(TINY),
    "plan": read_document(EXPLICIT),
    "job": _catalog("jobs", "default"),
    "gpu": _catalog("gpus", "A100-SXM4-80GB"),
    "rates": _catalog("failure_rates", "llama3"),
    "space": _catalog("spaces", "default"),
}
# The command in which each kind of document is read (DOC marks the fuzzed file).
USES = {
    "model": ["simulate", "--model", "DOC", "--cluster", TINY, "--plan", "tp=2,dp=2,gbs=8"],
    "cluster": ["simulate", "--model", "tiny-llama", "--cluster", "DOC",
                "--plan", "tp=2,dp=2,gbs=8,group=a100"],
    "plan": ["simulate", "--model", "tiny-llama", "--cluster", TINY, "--plan", "DOC"],
    "job": ["simulate", "--model", "tiny-llama", "--cluster", TINY,
            "--plan", "tp=2,dp=2,gbs=8,group=a100", "--job", "DOC"],
    "gpu": ["describe", "gpu", "DOC"],
    "rates": ["failures", "--model", "tiny-llama", "--cluster", TINY,
              "--plan", "tp=2,dp=2,gbs=8,group=a100", "--rates", "DOC", "--samples", "1",
              "--days", "1"],
    "space": ["plan", "--model", "tiny-llama", "--cluster", TINY, "--job", "gbs=8",
              "--space", "DOC", "--workers", "1", "--top", "2"],
}
# Where the same documents are read by other commands as well.
ALSO = {
    "model": [["describe", "model", "DOC"], ["export", "--plan", "tp=2,gbs=8", "--model", "DOC",
                                            "--to", "megatron"],
              ["run", "--model", "DOC", "--plan", "tp=2,gbs=8", "--dry-run"]],
    "cluster": [["describe", "cluster", "DOC"],
                ["plan", "--model", "tiny-llama", "--cluster", "DOC", "--job", "gbs=8",
                 "--workers", "1", "--top", "1"]],
    "plan": [["export", "--plan", "DOC", "--model", "tiny-llama", "--to", "deepspeed"],
             ["run", "--model", "tiny-llama", "--plan", "DOC", "--cluster", TINY, "--dry-run"],
             ["describe", "plan", "DOC"]],
}


@pytest.mark.parametrize("kind", sorted(USES))
def test_broken_documents_give_one_line_errors(kind: str, work: Path) -> None:
    @FUZZ
    @given(doc=document(BASES[kind]), also=st.integers(0, 3))
    def case(doc: tuple[str, bytes], also: int) -> None:
        path = fresh(work, doc[0])
        path.write_bytes(doc[1])
        uses = [USES[kind], *ALSO.get(kind, [])]
        argv = uses[also % len(uses)]
        check([str(path) if a == "DOC" else a for a in argv])

    case()


# ---- files read by one command each -----------------------------------------------------

RUNS_CSV = (CATALOG / "validation" / "runs.csv").read_text(encoding="utf-8").splitlines()
TRACE_CSV = (CATALOG / "traces" / "straggler-node.csv").read_text(encoding="utf-8")


@st.composite
def csv_rows(draw: st.DrawFn) -> str:
    header, row = RUNS_CSV[0], draw(st.sampled_from(RUNS_CSV[1:40]))
    cells = row.split(",")
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, min(len(cells), 29) - 1))
        cells[i] = draw(st.sampled_from(["", "inf", "-inf", "nan", "-1", "0", "1e12", "1e400",
                                         "abc", "1.5", "\"", "99999999999999999999999"]))
    return header + "\n" + ",".join(cells) + "\n"


def test_validate_fuzzed_rows(work: Path) -> None:
    @FUZZ
    @given(text=st.one_of(csv_rows(), BROKEN_TEXT), json_out=st.booleans())
    def case(text: str, json_out: bool) -> None:
        path = fresh(work, ".csv")
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        r = check(["validate", str(path), *(["--json"] if json_out else [])])
        assert "nan%" not in r.out and "inf%" not in r.out

    case()


@st.composite
def trace_text(draw: st.DrawFn) -> tuple[str, str]:
    lines = TRACE_CSV.splitlines()
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(lines) - 1))
        cells = lines[i].split(",")
        j = draw(st.integers(0, len(cells) - 1))
        cells[j] = draw(st.sampled_from(["", "nan", "-1", "1e300", "x", "inf", "#", "\""]))
        lines[i] = ",".join(cells)
    if draw(st.booleans()):
        return ".csv", "\n".join(lines)
    return draw(st.sampled_from([".csv", ".json"])), draw(BROKEN_TEXT)


def test_replay_fuzzed_traces(work: Path) -> None:
    @FUZZ
    @given(doc=trace_text())
    def case(doc: tuple[str, str]) -> None:
        path = fresh(work, doc[0])
        path.write_text(doc[1], encoding="utf-8", errors="surrogatepass")
        check(["replay", "--model", "tiny-llama", "--job", "gbs=64", "--trace", str(path),
               "--policy", "static"])

    case()


IMPORTS = [
    ["import", "--from", "metis", "DOC", "--cluster-file",
     str(FIX / "importers" / "metis" / "clusterfile.json")],
    ["import", "--from", "metis", str(FIX / "importers" / "metis" / "hostfile"),
     "--cluster-file", "DOC"],
    ["import", "--from", "astra-sim", "DOC", "--gpu", "H100-SXM5-80GB"],
    ["import", "--from", "megatron", "DOC", "--model", "tiny-llama"],
    ["import", "--from", "torchtitan", "DOC", "--model", "tiny-llama"],
    ["import", "--from", "deepspeed", "DOC", "--model", "tiny-llama"],
    ["report", "--model", "tiny-llama", "--cluster", TINY, "--plan", "tp=2,gbs=8,group=a100",
     "--curves", "DOC", "--out", "OUT"],
]
SAMPLES = [
    (FIX / "importers" / "metis" / "hostfile").read_text(),
    (FIX / "importers" / "metis" / "clusterfile.json").read_text(),
    (FIX / "importers" / "astra-sim" / "network.yml").read_text(),
    "torchrun pretrain_gpt.py --tensor-model-parallel-size 2 --global-batch-size 8 \\\n"
    "  --micro-batch-size 1 --bf16",
    '[parallelism]\ntensor_parallel_degree = 2\n[training]\nglobal_batch_size = 8\n',
    '{"train_batch_size": 8, "zero_optimization": {"stage": 1}}',
    '{"curves": [{"title": "t", "x_label": "x", "y_label": "y", '
    '"series": [{"name": "a", "x": [0, 1], "y": [1, 2]}]}]}',
]


@st.composite
def text_mutation(draw: st.DrawFn, base: str) -> str:
    text = base
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(text)))
        j = draw(st.integers(i, min(len(text), i + 12)))
        text = text[:i] + draw(st.sampled_from(["", "-1", "nan", "1e400", "[", "{", "\"", "0",
                                                "x", "\n", "99999999999999999999"])) + text[j:]
    return text


def test_imports_and_curves_fuzzed(work: Path) -> None:
    @FUZZ
    @given(which=st.integers(0, len(IMPORTS) - 1), data=st.data())
    def case(which: int, data: st.DataObject) -> None:
        text = data.draw(st.one_of(text_mutation(SAMPLES[which]), BROKEN_TEXT))
        suffix = {1: ".json", 6: ".json"}.get(which, ".txt")
        path = fresh(work, suffix)
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        out = fresh(work, ".html")
        argv = [str(path) if a == "DOC" else str(out) if a == "OUT" else a
                for a in IMPORTS[which]]
        check(argv)

    case()


# ---- option values ----------------------------------------------------------------------

BASE_ARGS = {
    "simulate": ["--model", "tiny-llama", "--cluster", TINY, "--plan", "tp=2,gbs=8,group=a100"],
    "plan": ["--model", "tiny-llama", "--cluster", TINY, "--job", "gbs=8", "--workers", "1"],
    "describe": ["model", "tiny-llama"],
    "validate": [str(FIX / "fuzz" / "runs3.csv")],
    "export": ["--plan", "tp=2,gbs=8", "--model", "tiny-llama", "--to", "megatron"],
    "import": [str(FIX / "importers" / "metis" / "hostfile"), "--from", "metis"],
    "failures": ["--model", "tiny-llama", "--cluster", TINY, "--plan",
                 "tp=2,dp=2,gbs=8,group=a100", "--samples", "1", "--days", "1"],
    "replay": ["--model", "tiny-llama", "--job", "gbs=64", "--trace", "straggler-node",
               "--policy", "static"],
    "report": ["--model", "tiny-llama", "--cluster", TINY, "--plan", "tp=2,gbs=8,group=a100"],
    "run": ["--model", "tiny-llama", "--plan", "tp=2,gbs=8", "--dry-run"],
    "calibrate": [],
    "probe": ["--gpu", "A10"],
}
# Options fuzzed per command; options that start expensive work when valid are left to the
# named tests (calibrate and probe measure, run trains) -- there only invalid values are drawn.
OPTIONS = {
    "simulate": ["--model", "--cluster", "--plan", "--job", "--trace"],
    "plan": ["--job", "--space", "--objective", "--price", "--prices", "--budget", "--target",
             "--top", "--workers", "--out", "--report", "--model", "--cluster"],
    "describe": ["--seq-len", "--micro-batch", "--tp"],
    "validate": [],  # no options but --json and --rows; its CSVs are fuzzed above
    "export": ["--plan", "--model", "--cluster", "--to", "--out"],
    "import": ["--cluster-file", "--bandwidth-unit", "--gpu", "--gpu-map", "--model", "--name",
               "--out"],
    "failures": ["--rates", "--rate-scale", "--blast-radius", "--warmup-days", "--policy",
                 "--seed", "--spares", "--fractions", "--ntp-degrees", "--boost-max",
                 "--power-curve", "--boost-fraction", "--restart-s", "--checkpoint-write-s",
                 "--checkpoint-interval-s", "--cost", "--plot", "--write-plan",
                 "--write-policy", "--failed-fraction"],
    "replay": ["--cluster", "--job", "--trace", "--policy", "--plan", "--cost", "--planner",
               "--plot", "--model"],
    "report": ["--job", "--compare", "--plans-dir", "--curves", "--out", "--plan"],
    "run": ["--steps", "--every", "--seed", "--timeout", "--cluster", "--plan", "--device",
            "--dtype", "--pp-engine", "--checkpoint"],
    "calibrate": ["--ranks", "--seconds", "--device", "--gpu"],
    # not --min/--max-bytes: a valid large --max-bytes alone would start a probe
    "probe": ["--ranks", "--factor", "--repeats", "--warmup", "--duration", "--interval",
              "--device", "--ops", "--fit-ops", "--statistic"],
}
INVALID_ONLY = {"calibrate", "probe"}


@pytest.fixture
def in_work(work: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run from the test folder, with an existing folder and file to trip output paths."""
    monkeypatch.chdir(work)
    (work / "adir").mkdir(exist_ok=True)
    (work / "afile").write_text("not a folder\n")
    return work


@pytest.mark.parametrize("command", sorted(c for c in BASE_ARGS if OPTIONS[c]))
def test_option_values(command: str, in_work: Path) -> None:
    work = in_work
    opts = OPTIONS[command]

    @FUZZ
    @given(picks=st.lists(st.sampled_from(opts).flatmap(
        lambda o: st.tuples(st.just(o), OUTPUT_TEXT if o in OUTPUTS else OPTION_TEXT)),
        min_size=1, max_size=3))
    def case(picks: list[tuple[str, str]]) -> None:
        argv = [command, *BASE_ARGS[command]]
        if command in {"report"}:
            argv += ["--out", str(fresh(work, ".html"))]
        for opt, value in picks:
            argv += [opt, value]
        if command in INVALID_ONLY and all(_valid_number(v) for _, v in picks):
            return  # a valid calibrate or probe measures for seconds: named tests cover it
        check(argv)

    case()


def _valid_number(v: str) -> bool:
    try:
        return 0 < float(v) < 1e6
    except ValueError:
        return False


SUBPROCESS_EXAMPLES = int(os.environ.get("FUZZ_SUBPROCESS_EXAMPLES", "2"))


def test_option_values_as_real_processes(in_work: Path) -> None:
    # a small sample through the console script itself (interpreter start-up, exit codes)
    import subprocess

    commands = sorted(c for c in OPTIONS if OPTIONS[c] and c not in INVALID_ONLY)

    @settings(FUZZ, max_examples=SUBPROCESS_EXAMPLES)
    @given(command=st.sampled_from(commands), data=st.data())
    def case(command: str, data: st.DataObject) -> None:
        opt = data.draw(st.sampled_from(OPTIONS[command]))
        value = data.draw(OUTPUT_TEXT if opt in OUTPUTS else OPTION_TEXT)
        argv = [command, *BASE_ARGS[command], opt, value]
        if command == "report":
            argv += ["--out", "r.html"]
        p = subprocess.run([sys.executable, "-m", "hetpar.cli.main", *argv], cwd=in_work,
                           capture_output=True, text=True, timeout=HANG_S)
        assert_clean(argv, Result(p.returncode, p.stdout, p.stderr))

    case()
