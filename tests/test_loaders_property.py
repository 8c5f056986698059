"""Property tests: every loader either loads a document or raises ConfigError, never crashes."""

from __future__ import annotations

import copy
import itertools
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hetpar import catalog
from hetpar.errors import ConfigError
from hetpar.hf.convert import model_from_hf_config
from hetpar.io import from_dict, read_document, to_dict
from hetpar.specs.cluster import ClusterSpec
from hetpar.specs.gpu import GPUSpec
from hetpar.specs.job import Job
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import Plan

HF_DIR = Path(__file__).parent / "fixtures" / "hf"
SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])

UNIFORM_PLAN = {"name": "p", "tp": 2, "pp": 2, "dp": 2, "micro_batch": 1, "global_batch": 8,
                "schedule": "1f1b", "recompute": "selective", "sequence_parallel": True}
EXPLICIT_PLAN = {
    "name": "x", "vpp": 1, "schedule": "1f1b",
    "replicas": [
        {"batch": 4, "micro_batch": 1, "stages": [
            {"layers": [0, 1], "group": "a", "tp": 2, "devices": [0, 1]},
            {"layers": [1, 2], "group": "a", "tp": 1, "cp": 1},
        ]},
        {"batch": 2, "micro_batch": 2, "stages": [{"layers": [0, 2], "group": "b", "tp": 4}]},
    ],
}
JOB = {"name": "j", "global_batch": 64, "seq_len": 2048, "precision": "bf16", "optimizer": "adam"}


def _bundled(kind: str) -> list[dict[str, Any]]:
    return [read_document(catalog._find(kind, n)) for n in catalog.names(kind)]


# (schema class, valid seed documents)
SEEDS: dict[str, tuple[type, list[dict[str, Any]]]] = {
    "models": (ModelSpec, _bundled("models")),
    "gpus": (GPUSpec, _bundled("gpus")),
    "clusters": (ClusterSpec, _bundled("clusters")),
    "plans": (Plan, [UNIFORM_PLAN, EXPLICIT_PLAN]),
    "jobs": (Job, [JOB]),
}
HF_SEEDS = [json.loads(p.read_text()) for p in sorted(HF_DIR.glob("*.json"))]

scalars = (st.none() | st.booleans() | st.integers(-(2**70), 2**70)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8))
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                max_size=4),
    max_leaves=12,
)
# values that stay near the schema's domain: small and negative numbers, the wrong kinds
near = st.sampled_from([0, -1, 1, 2, 3, -2.5, 0.0, 1e30, True, False, "", "x", "fp8", "gelu",
                        [], [1], [1, 2], {}, None, float("inf"), float("nan")])


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key path in a nested document (dict keys and list indices)."""
    out = []
    items: Any = []
    if isinstance(doc, dict):
        items = doc.items()
    elif isinstance(doc, list):
        items = enumerate(doc)
    for k, v in items:
        out.append((*prefix, k))
        out.extend(_paths(v, (*prefix, k)))
    return out


def _mutate(doc: Any, data: st.DataObject) -> Any:
    """Apply 1-3 random edits: delete, replace, add a key, or negate a number."""
    doc = copy.deepcopy(doc)
    for _ in range(data.draw(st.integers(1, 3))):
        paths = _paths(doc)
        if not paths:
            break
        path = data.draw(st.sampled_from(paths))
        parent = doc
        for k in path[:-1]:
            parent = parent[k]
        key = path[-1]
        action = data.draw(st.sampled_from(["delete", "near", "random", "add", "negate"]))
        if action == "delete":
            del parent[key]
        elif action == "near":
            parent[key] = copy.deepcopy(data.draw(near))  # near holds shared lists, dicts
        elif action == "random":
            parent[key] = data.draw(values)
        elif action == "add" and isinstance(parent, dict):
            parent[data.draw(st.text(min_size=1, max_size=6))] = data.draw(values)
        elif action == "negate" and isinstance(parent[key], int | float):
            parent[key] = -parent[key]
    return doc


def _numbers(obj: Any) -> list[float]:
    """Every number (not bool) in a loaded spec's file form."""
    if isinstance(obj, dict):
        return [x for v in obj.values() for x in _numbers(v)]
    if isinstance(obj, list):
        return [x for v in obj for x in _numbers(v)]
    return [obj] if isinstance(obj, int | float) and not isinstance(obj, bool) else []


def _check_sane(spec: Any) -> None:
    """What loads is usable: no negative counts, sizes, rates or latencies anywhere."""
    negative = [x for x in _numbers(to_dict(spec)) if x < 0]
    assert not negative, f"{type(spec).__name__} loaded with negative numbers {negative}"
    if isinstance(spec, GPUSpec):
        for table in (spec.matmul_efficiency, spec.attention_efficiency, spec.memory_efficiency):
            for size in (1.0, table.size[0], table.size[-1] * 10):
                assert 0 < table(size) <= 1


def _loads_or_config_error(load: Callable[[], Any]) -> Any:
    try:
        return load()
    except ConfigError as e:
        msg = str(e)
        assert msg and "\n" not in msg, f"error message must be one line: {msg!r}"
        return None


@pytest.mark.parametrize("kind", list(SEEDS))
@SETTINGS
@given(data=st.data())
def test_mutated_documents(kind: str, data: st.DataObject) -> None:
    cls, seeds = SEEDS[kind]
    doc = _mutate(data.draw(st.sampled_from(seeds)), data)
    got = _loads_or_config_error(lambda: from_dict(cls, doc, "doc"))
    assert got is None or isinstance(got, cls)
    if got is not None:
        _check_sane(got)


@pytest.mark.parametrize("kind", list(SEEDS))
@SETTINGS
@given(doc=values)
def test_random_documents(kind: str, doc: Any) -> None:
    cls, _ = SEEDS[kind]
    got = _loads_or_config_error(lambda: from_dict(cls, doc, "doc"))
    assert got is None or isinstance(got, cls)


@SETTINGS
@given(data=st.data())
def test_mutated_hf_configs(data: st.DataObject) -> None:
    doc = _mutate(data.draw(st.sampled_from(HF_SEEDS)), data)
    got = _loads_or_config_error(lambda: model_from_hf_config(doc, "hf"))
    assert got is None or isinstance(got, ModelSpec)
    if got is not None:
        _check_sane(got)


@SETTINGS
@given(doc=values)
def test_random_hf_configs(doc: Any) -> None:
    got = _loads_or_config_error(lambda: model_from_hf_config(doc, "hf"))
    assert got is None or isinstance(got, ModelSpec)


INLINE_KEYS = ["tp", "pp", "dp", "cp", "vpp", "mbs", "gbs", "sp", "schedule", "recompute",
               "zero", "precision", "order", "v", "bogus", ""]


@SETTINGS
@given(
    items=st.lists(st.tuples(st.sampled_from(INLINE_KEYS),
                             st.sampled_from(["0", "-1", "1", "2", "8", "64", "true", "x", "",
                                              "1f1b", "full", "tp-cp-dp-pp", "=", "1.5"])),
                   max_size=6),
    junk=st.text(max_size=10),
)
def test_inline_plans(items: list[tuple[str, str]], junk: str) -> None:
    text = ",".join(f"{k}={v}" for k, v in items) + ("," + junk if junk else "")
    if "=" not in text:
        text += ",tp="  # load_plan routes only text with '=' to the inline parser
    got = _loads_or_config_error(lambda: catalog.parse_inline_plan(text))
    assert got is None or isinstance(got, Plan)


LOADERS: dict[str, Callable[[str], Any]] = {
    "models": catalog.load_model, "gpus": catalog.load_gpu, "clusters": catalog.load_cluster,
    "plans": catalog.load_plan, "jobs": catalog.load_job,
}
_counter = itertools.count()


@pytest.mark.parametrize("kind", list(LOADERS))
@pytest.mark.parametrize("suffix", [".toml", ".json"])
@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(blob=st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_random_bytes_in_files(kind: str, suffix: str, blob: bytes, tmp_path: Path) -> None:
    # unique names: the catalog loaders cache by path
    path = tmp_path / f"doc{next(_counter)}{suffix}"
    path.write_bytes(blob)
    _loads_or_config_error(lambda: LOADERS[kind](str(path)))


@pytest.mark.parametrize("kind", list(LOADERS))
@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mutated_files_through_catalog(kind: str, data: st.DataObject, tmp_path: Path) -> None:
    seeds = SEEDS[kind][1] + (HF_SEEDS if kind == "models" else [])
    doc = _mutate(data.draw(st.sampled_from(seeds)), data)
    path = tmp_path / f"doc{next(_counter)}.json"
    path.write_text(json.dumps(doc))
    _loads_or_config_error(lambda: LOADERS[kind](str(path)))


# Found by the properties above with larger inputs: parsers raise RecursionError on deep nesting
# and ValueError on integers beyond Python's 4300-digit limit; both must become ConfigError.
EDGE_FILES = [
    ("deep.json", "[" * 100_000),
    ("deep.toml", "a = " + "[" * 100_000),
    ("inline.toml", "a = {" * 5_000),
    ("digits.json", '{"n_layers": 1' + "0" * 5_000 + "}"),
    ("digits.toml", "n_layers = 1" + "0" * 5_000),
    ("latin1.toml", "name = 'caf\xe9'\n"),
    ("empty.json", ""),
]


@pytest.mark.parametrize(("name", "content"), EDGE_FILES)
@pytest.mark.parametrize("kind", list(LOADERS))
def test_edge_files(kind: str, name: str, content: str, tmp_path: Path) -> None:
    path = tmp_path / name
    path.write_bytes(content.encode("latin-1"))
    with pytest.raises(ConfigError):
        LOADERS[kind](str(path))


def _edit(doc: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    parent: Any = doc
    for k in path[:-1]:
        parent = parent[k]
    parent[path[-1]] = value
    return doc


# Found by _check_sane: these loaded before and broke later (log of a negative size) or meant
# nothing (negative peak or latency, a device listed twice).
@pytest.mark.parametrize(
    ("kind", "path", "value", "message"),
    [
        ("gpus", ("peak_tflops", "bf16"), -1.0, "peak_tflops.bf16 must be > 0"),
        ("gpus", ("matmul_efficiency", "size", 0), -5.0, "size must be > 0"),
        ("clusters", ("node_groups", 0, "nic_latency_us"), -1.0, "nic_latency_us must be >= 0"),
        ("plans", ("replicas", 0, "stages", 0, "devices"), [1, 1], "distinct"),
        ("plans", ("replicas", 0, "stages", 0, "devices"), [-1, 0], ">= 0"),
    ],
)
def test_semantic_regressions(kind: str, path: tuple[Any, ...], value: Any, message: str) -> None:
    cls, seeds = SEEDS[kind]
    seed = seeds[-1] if kind == "plans" else seeds[0]
    with pytest.raises(ConfigError, match=message):
        from_dict(cls, _edit(seed, path, value), "doc")


def test_huge_integer_in_error_message() -> None:
    with pytest.raises(ConfigError, match="name: expected a string, got <int too large"):
        from_dict(ModelSpec, {"name": 10**5000}, "doc")


# ----------------------------------------------------------------------------- CLI level


@pytest.mark.parametrize(
    ("kind", "name", "content"),
    [
        ("model", "m.toml", "n_layers = 'two'\n"),
        ("model", "m.toml", "[[[\n"),
        ("model", "config.json", '{"model_type": "bert"}'),
        ("model", "config.json", '{"model_type": "llama", "hidden_size": 64}'),
        ("gpu", "g.json", "[1, 2]"),
        ("cluster", "c.toml", "name = 'c'\nnode_groups = []\n"),
        ("plan", "p.toml", "tp = -1\nglobal_batch = 8\n"),
        ("job", "j.json", '{"global_batch": "many"}'),
        ("model", "m.yaml", "a: 1"),
    ],
)
def test_cli_malformed_file_exits_2_with_one_line(
    kind: str, name: str, content: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    from hetpar.cli import main as cli_main

    monkeypatch.setattr(cli_main, "COMMANDS", ("hetpar.cli.describe",))
    path = tmp_path / name
    path.write_text(content)
    code = cli_main.main(["describe", kind, str(path)])
    out, err = capsys.readouterr()
    assert code == 2
    assert out == ""
    assert err.startswith("hetpar: error: ") and err.count("\n") == 1
    assert "Traceback" not in err


@pytest.mark.parametrize("field", ["embedding_multiplier", "residual_multiplier",
                                   "attention_multiplier", "logit_scale"])
@pytest.mark.parametrize("value", [-1.0, 0.0, math.nan, math.inf])
def test_activation_scales_must_be_positive_and_finite(field: str, value: float) -> None:
    # found by test_mutated_documents (a negated embedding_multiplier of jamba-v0.1 loaded)
    doc = {**SEEDS["models"][1][0], field: value}
    with pytest.raises(ConfigError, match=field):  # one line naming the field
        from_dict(ModelSpec, doc, "doc")
