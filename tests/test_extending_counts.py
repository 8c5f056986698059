"""docs/extending.md's file counts against the code: the modules an extension registers into."""

import re
import sys
from pathlib import Path

from hetpar import feasibility
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
