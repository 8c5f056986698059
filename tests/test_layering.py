"""The package layering of docs/CONTRACTS.md, checked against every import (lazy ones too)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "hetpar"

BASE = {"errors", "io", "specs"}
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "strict": {"errors"},  # the strict parsers of numbers, names and bytes (io re-exports)
    "outputs": {"errors"},  # output paths probed before work (io re-exports)
    "io": {"errors", "strict", "outputs"},
    "specs": {"errors"},
    "formulas": {"errors", "specs"},
    "hf": BASE,
    "catalog": BASE | {"hf"},
    "schedules": {"errors"},
    "feasibility": {"errors", "schedules", "specs", "feasibility_decoder"},
    "feasibility_decoder": BASE,  # the runtime decoder's gaps, re-exported by feasibility
    "placement": {"errors", "specs"},
    # net: hardware arrives as values (resolved GPUs), never looked up by name
    "net": BASE,
    "sim": BASE | {"catalog", "formulas", "schedules", "feasibility", "placement", "net"},
    # workers: where independent work runs (this process, worker processes, Ray); used by the
    # planner, the failure analyses and replay, and imports nothing of theirs
    "workers": {"errors"},
    "search": BASE | {"catalog", "formulas", "schedules", "feasibility", "placement", "sim",
                      "ranking", "workers"},
    # The runtime depends on specs and schedules (and the simulator's memory model for the
    # dry run), never on the planner's internals.
    # failures: the degraded (NTP or drop) plan written after a rank dies
    "runtime": BASE | {"catalog", "formulas", "schedules", "feasibility", "placement", "sim",
                       "failures"},
    "export": BASE | {"catalog", "schedules", "feasibility", "placement"},  # the mesh (hybrid.py)
    "importers": BASE | {"catalog"},
    "failures": BASE | {"catalog", "formulas", "schedules", "feasibility", "placement", "sim",
                        "workers"},
    "dynamic": BASE | {"catalog", "formulas", "schedules", "feasibility", "placement", "sim",
                       "search", "workers"},
    "validation": BASE | {"catalog", "sim", "schedules"},
    "ranking": BASE | {"catalog", "sim", "validation"},
    "fit": BASE | {"catalog", "fit_gpu", "sim", "validation"},
    "fit_gpu": BASE | {"catalog", "sim"},  # the GPU asymptotes as coordinates of the fit
    "validation_hetero": BASE | {"catalog", "sim"},
    "validation_collectives": BASE | {"catalog", "net", "sim"},
    # a fabric kind's constants fitted to bundled collective measurements
    "fabric_fit": BASE | {"net", "validation_collectives"},
    "report": {"io", "__init__"},  # its version string only
    "__init__": set(),
}
"""Units (a module directly under hetpar/ or a subpackage) and what each may import.
``cli`` may import everything and is not listed."""


def _unit(path: Path) -> str:
    rel = path.relative_to(ROOT)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _imports(path: Path) -> set[str]:
    """hetpar units imported anywhere in ``path`` (module level or inside functions)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] if node.module != "hetpar" else [
                f"hetpar.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "hetpar":
                out.add(parts[1] if len(parts) > 1 else "__init__")
    return out


def test_every_import_follows_the_layering() -> None:
    bad = []
    for path in sorted(ROOT.rglob("*.py")):
        unit = _unit(path)
        if unit in ("cli", "__init__", "__main__"):
            continue
        assert unit in ALLOWED, f"{unit} (from {path}) is not in the layering table"
        for dep in _imports(path) - {unit} - ALLOWED[unit]:
            bad.append(f"{path.relative_to(ROOT.parent)} imports hetpar.{dep}")
    assert not bad, "imports against docs/CONTRACTS.md's layering:\n" + "\n".join(bad)


def test_the_layering_has_no_cycles() -> None:
    seen: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def visit(u: str, path: list[str]) -> None:
        assert seen.get(u) != 1, "cycle: " + " -> ".join([*path, u])
        if seen.get(u) == 2:
            return
        seen[u] = 1
        for v in ALLOWED.get(u, set()):
            visit(v, [*path, u])
        seen[u] = 2

    for u in ALLOWED:
        visit(u, [])


def test_only_the_runtime_imports_torch() -> None:
    """The planner and simulator never need torch; the run commands import it lazily."""
    users = {
        str(p.relative_to(ROOT.parent))
        for p in ROOT.rglob("*.py")
        if _unit(p) != "runtime" and any(
            (isinstance(n, ast.Import) and any(a.name.split(".")[0] == "torch" for a in n.names))
            or (isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == "torch")
            for n in ast.walk(ast.parse(p.read_text())))
    }
    assert users == {"hetpar/cli/run.py", "hetpar/cli/calibrate.py"}
    for cmd in users:  # inside run(), never at module level
        tree = ast.parse((ROOT.parent / cmd).read_text())
        assert not any(isinstance(n, ast.Import) and n.names[0].name == "torch"
                       for n in tree.body), cmd
