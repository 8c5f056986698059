"""An export target registered in one module (here) is listed, exported, read back and refuses
a schedule it has no name for; the bundled targets' schedule tables agree with their option
tables."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from hetpar import catalog, schedules
from hetpar.cli.main import main
from hetpar.errors import ConfigError
from hetpar.export import (
    TARGETS,
    Export,
    ScheduleNames,
    Target,
    export,
    get,
    names,
    parse,
    register,
    unregister,
)
from hetpar.export.nearest import common
from hetpar.export.options import TABLES, VERSIONS
from hetpar.export.schema import Option, OptionTable, Rule, int_option
from hetpar.io import from_dict
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import Plan

NAME = "toy-kv"
TABLE = OptionTable(
    framework=NAME, version="1.0", commit="toy", sources=("this test",),
    options=(int_option("tp"), int_option("pp"), int_option("dp"), int_option("mbs"),
             int_option("gbs"), Option(name="schedule", type="str", choices=("OneF", "Loop")),
             int_option("chunks")),
    rules=(Rule(when=("pp>1",), then="schedule", why="a pipeline needs its schedule"),),
)
SCHEDULES = ScheduleNames(label="Toy", by_name={"1f1b": "OneF", "interleaved": "Loop"})


def write(plan: Plan, model: ModelSpec, *, table: OptionTable, per_node: int | None,
          config_name: str) -> Export:
    """``key=value`` lines; a schedule the toy framework lacks is refused, not replaced."""
    near, lost = common(plan, model, label=SCHEDULES.label)
    opts: dict[str, object] = {"tp": near.tp, "pp": near.pp, "dp": near.dp,
                               "mbs": near.micro_batch, "gbs": near.batch}
    if near.pp > 1:
        opts |= {"schedule": SCHEDULES.require(near.schedule), "chunks": near.vpp}
    text = "".join(f"{k}={v}\n" for k, v in opts.items())
    return Export(target=NAME, plan=near, warnings=tuple(lost),
                  files=((config_name or "toy.kv", text),), options=opts, version=table.version)


def read_back(text: str, model: ModelSpec) -> Plan:
    kv = dict(line.split("=", 1) for line in text.splitlines())
    data: dict[str, object] = {"tp": int(kv["tp"]), "pp": int(kv["pp"]), "dp": int(kv["dp"]),
                               "micro_batch": int(kv["mbs"]), "global_batch": int(kv["gbs"])}
    if "schedule" in kv:
        data |= {"schedule": SCHEDULES.schedule_of(kv["schedule"]), "vpp": int(kv["chunks"])}
    return from_dict(Plan, data, "toy")


@pytest.fixture(autouse=True)
def toy() -> Iterator[None]:
    register(Target(name=NAME, help="key=value lines for the toy framework", tables=(TABLE,),
                    schedules=SCHEDULES, write=write, parse=read_back))
    yield
    unregister(NAME)


LLAMA = catalog.load_model("llama3.1-8b")


def test_listed_by_the_registry_and_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    assert NAME in names() and NAME not in TARGETS  # TARGETS: the bundled ones
    assert VERSIONS[NAME] == {"1.0": TABLE} and TABLES[NAME] is TABLE
    for command in ("export", "import"):
        with pytest.raises(SystemExit) as done:
            main([command, "--help"])
        assert done.value.code == 0
        assert NAME in capsys.readouterr().out  # a --to / --from choice


def test_export_help_names_its_help_line_and_versions(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["export", "--help"])
    out = "".join(capsys.readouterr().out.split())  # argparse wraps, also after hyphens
    assert "toy-kv:key=valuelinesforthetoyframework" in out
    assert "toy-kv:1.0)" in out  # its --framework-version choices


def test_exports_and_reads_back(tmp_path: Path) -> None:
    plan = catalog.load_plan("tp=2,pp=4,vpp=2,dp=2,gbs=64,schedule=interleaved")
    e = export(plan, LLAMA, NAME)
    assert e.files == (("toy.kv", "tp=2\npp=4\ndp=2\nmbs=1\ngbs=64\nschedule=Loop\nchunks=2\n"),)
    assert e.problems() == [] and e.version == "1.0"
    assert parse(NAME, e.files[0][1], LLAMA) == e.plan == plan
    # the option table is what problems() checks: a name outside its choices fails
    assert any("schedule" in p for p in replace(e, options={**e.options,
                                                            "schedule": "GPipe"}).problems())
    # the same through the command line, both ways
    out, back = tmp_path / "run.kv", tmp_path / "plan.toml"
    assert main(["export", "--plan", "tp=2,pp=4,vpp=2,dp=2,gbs=64,schedule=interleaved",
                 "--model", "llama3.1-8b", "--to", NAME, "--out", str(out)]) == 0
    assert out.read_text() == e.files[0][1]
    assert main(["import", str(out), "--from", NAME, "--model", "llama3.1-8b",
                 "--out", str(back)]) == 0
    assert catalog.load_plan(str(back)) == plan


def test_refuses_a_schedule_it_has_no_name_for(capsys: pytest.CaptureFixture[str]) -> None:
    plan = catalog.load_plan("pp=4,gbs=32,schedule=gpipe")
    with pytest.raises(ConfigError, match=r"Toy has no name for schedule 'gpipe'; it names: "
                                          r"1f1b, interleaved"):
        export(plan, LLAMA, NAME)
    assert main(["export", "--plan", "pp=4,gbs=32,schedule=gpipe", "--model", "llama3.1-8b",
                 "--to", NAME]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no name for schedule 'gpipe'" in err
    assert export(replace(plan, pp=1, global_batch=32), LLAMA, NAME).problems() == []
    with pytest.raises(ConfigError, match=r"unknown target 'toy'; known: .*toy-kv"):
        export(plan, LLAMA, "toy")


def test_bundled_schedule_tables_agree_with_the_option_tables() -> None:
    for target in TARGETS:
        t = get(target)
        # the fallback of a target that replaces an unnamed schedule must itself be named
        assert t.schedules.name_of(schedules.DEFAULT), target
        if t.schedules.by_traits is None:  # a table by name reads back one to one
            for name in t.schedules.named():
                assert t.schedules.schedule_of(t.schedules.require(name)) == name
    titan = get("torchtitan")
    for table in titan.tables:
        option = next(o for o in table.options if o.name.endswith("pipeline_parallel_schedule"))
        assert set(titan.schedules.known()) <= set(option.choices), table.version
    # DeepSpeed's PipelineEngine runs TrainSchedule, i.e. exactly the lock-step schedules
    ds = get("deepspeed").schedules
    assert ds.named() == [n for n in schedules.names() if schedules.traits(n).lockstep]
    assert ds.known() == ["TrainSchedule"]
