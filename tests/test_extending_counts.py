"""docs/extending.md's file counts against the code: the modules an extension registers into."""

import ast
import re
import sys
from pathlib import Path

import pytest

import hetpar
from hetpar import feasibility
from hetpar.errors import ConfigError
from hetpar.sim import axis_costs
from hetpar.specs import axes

DOC = Path(__file__).resolve().parents[1] / "docs" / "extending.md"


def _row(name: str) -> str:
    rows = [line for line in DOC.read_text().splitlines() if line.startswith(f"| {name}")]
    assert len(rows) == 1, f"one table row for {name!r}"
    return rows[0]


def _registries() -> dict[tuple[str, str], int]:
    """The size of every module-level dict of every loaded hetpar module."""
    out = {}
    for mod_name, mod in list(sys.modules.items()):
        if not mod_name.startswith("hetpar.") or mod is None:
            continue
        for attr, value in list(vars(mod).items()):
            if isinstance(value, dict) and not attr.startswith("__"):
                out[mod_name, attr] = len(value)
    return out


def _touched(register) -> set[str]:
    """The hetpar modules whose registries ``register()`` grows (found, not listed)."""
    before = _registries()
    register()
    after = _registries()
    return {m for (m, a), n in after.items() if n != before.get((m, a), n)}


def test_the_parallel_axis_row_counts_the_modules_a_costed_axis_needs():
    row = _row("a parallel axis")
    bundled = int(re.search(r"\| (\d+) for a plan-wide axis that costs", row).group(1))
    free = int(re.search(r", (\d+) for one that costs nothing", row).group(1))
    plugin = int(re.search(r"; (\d+) as a plugin module holding all", row).group(1))

    def predicate(model, degree, degrees):
        return feasibility.Verdict(name="count_fit", ok=True, reason="")

    def row_and_predicate():
        axes.register(axes.AxisDef(name="cnt", scope="plan", predicate="count_fit",
                                   collective="none (a toy)"))
        feasibility.PREDICATES["count_fit"] = predicate

    def cost():
        axis_costs.register("cnt", axis_costs.AxisCost(key="cnt_comm", word="cnt-link",
                                                       op="all_to_all", nbytes=lambda la: 0.0))

    try:
        without = _touched(row_and_predicate)
        costed = without | _touched(cost)
    finally:
        axis_costs.unregister("cnt")
        axes.unregister("cnt")
        feasibility.PREDICATES.pop("count_fit", None)
    assert without == {"hetpar.specs.axes", "hetpar.feasibility"}
    assert costed == without | {"hetpar.sim.axis_costs"}
    # bundled: one file per module registered into; as a plugin: all of it in this one file
    assert (bundled, free, plugin) == (len(costed), len(without), 1)


def _device_axis_modules() -> set[str]:
    """The modules outside the axis table and the runtime whose code names ``cp``, the last
    device axis added, as an attribute, a keyword or a string: what a new device axis is read
    by the same way (found in the code, not listed)."""
    root = Path(hetpar.__file__).resolve().parent
    out = set()
    for path in root.rglob("*.py"):
        rel = path.relative_to(root.parent).as_posix()
        if rel.startswith("hetpar/runtime/") or rel == "hetpar/specs/axes.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if ((isinstance(node, ast.Attribute) and node.attr == "cp")
                    or (isinstance(node, ast.keyword) and node.arg == "cp")
                    or (isinstance(node, ast.Constant) and node.value == "cp")):
                out.add(rel)
                break
    return out


def test_a_device_axis_is_not_a_row_and_its_modules_are_counted():
    # the toy device-level axis: one row, as docs/extending.md says a plan-wide axis is added;
    # the table refuses it, so what it needs is every module that names a device axis
    toy = axes.AxisDef(name="toy", scope="stage", predicate="context_split",
                       collective="none (a toy)")
    with pytest.raises(ConfigError, match="only plan-scope axes can be registered"):
        axes.register(toy)
    assert "toy" not in {a.name for a in axes.axes()}
    found = _device_axis_modules()
    assert {"hetpar/specs/stage.py", "hetpar/specs/expand.py", "hetpar/placement/grid.py",
            "hetpar/sim/layout.py"} <= found  # where the device axes are laid out by name
    row = _row("a parallel axis")
    in_row = int(re.search(r"a new device axis .*?: (\d+) modules outside its row", row)[1])
    section = DOC.read_text().split("## A parallel axis")[1]
    in_section = int(re.search(r"device axis would touch the same way: \*\*(\d+)\*\*",
                               section)[1])
    met = re.search(r"device axis: no \((\d+), target 3\)", row)
    assert met and in_row == in_section == int(met[1]) == len(found), sorted(found)
