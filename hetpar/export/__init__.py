"""Export hetpar plans to training frameworks (the registered targets: Megatron-LM, torchtitan
and DeepSpeed are bundled), and read such exports back."""

from __future__ import annotations

import dataclasses

from hetpar.errors import ConfigError, Infeasible
from hetpar.export import (
    builtin,  # noqa: F401  (imports the bundled targets: they register)
    hybrid,
)
from hetpar.export.collectives import carry
from hetpar.export.schema import OptionTable
from hetpar.export.target import (
    Export,
    ModelRefused,
    ScheduleNames,
    Target,
    get,
    names,
    register,
    unregister,
)
from hetpar.specs.cluster import ClusterSpec
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import Plan

TARGETS = names()
"""The targets registered when hetpar.export was imported (the bundled ones); ``names()``
gives the registry as it is now, plug-ins included."""


def export(
    plan: Plan,
    model: ModelSpec,
    target: str,
    cluster: ClusterSpec | None = None,
    config_name: str = "",
    version: str | None = None,
) -> Export:
    """Export ``plan`` for ``model`` to ``target`` (one of ``names()``) at framework
    ``version`` (one of the target's table versions; default the newest).

    ``cluster`` sets GPUs per node for the launch command (default 8); ``config_name`` is
    the file name the launch command refers to. A plan the version cannot run even in its
    nearest form raises ConfigError naming the nearest plan it can; a model the target has no
    form for at all (ModelRefused), the other targets that accept this very plan.
    """
    t = get(target)
    _check_layers(plan, model)
    table = t.table(version)
    try:
        return _write(t, table, plan, model, cluster, config_name)
    except ModelRefused as err:
        raise ConfigError(f"{err}; {_elsewhere(plan, model, cluster, t.name)}") from None


def _write(t: Target, table: OptionTable, plan: Plan, model: ModelSpec,
           cluster: ClusterSpec | None, config_name: str) -> Export:
    per_node = None
    if cluster is not None:
        group = cluster.group(plan.group) if plan.group else cluster.node_groups[0]
        per_node = group.gpus_per_node
    replicate = hybrid.replicas(plan, model, cluster, t.name, t.hybrid)
    kw = {"replicate": replicate} if replicate > 1 else {}  # plug-ins may not take it
    e = t.write(plan, model, table=table, per_node=per_node, config_name=config_name, **kw)
    if replicate > 1:
        e = dataclasses.replace(e, files=hybrid.note(e.files, plan, replicate))
    return carry(e, plan)


def accepting(plan: Plan, model: ModelSpec, cluster: ClusterSpec | None = None,
              but: str = "") -> list[tuple[str, Export]]:
    """The registered targets (other than ``but``) whose newest version exports ``plan`` for
    ``model`` with no option-table or validator-rule problem, found by exporting it."""
    out = []
    for name in names():
        if name == but:
            continue
        t = get(name)
        try:
            e = _write(t, t.table(), plan, model, cluster, "")
        except (ConfigError, Infeasible):
            continue
        if not e.problems():
            out.append((name, e))
    return out


def _elsewhere(plan: Plan, model: ModelSpec, cluster: ClusterSpec | None, but: str) -> str:
    """Where the plan does export, for a target that refuses its model: one clause."""
    found = [f"--to {name}" + (f" ({len(e.warnings)} warning{'s' * (len(e.warnings) > 1)})"
                               if e.warnings else "")
             for name, e in accepting(plan, model, cluster, but)]
    if not found:
        return "no other registered target exports this plan either"
    return "this plan exports with " + " or ".join(found)


def _check_layers(plan: Plan, model: ModelSpec) -> None:
    """Every pipeline chunk needs a layer: pp=64 of a 32-layer model is not a plan to export."""
    chunks = plan.pp * plan.vpp if plan.uniform else max(len(r.stages) for r in plan.replicas)
    if chunks > model.n_layers:
        raise Infeasible("divisibility", f"pp*vpp = {chunks} pipeline chunks > "
                         f"{model.n_layers} layers of {model.name}: a stage would have no layers")
    for r in plan.replicas:
        if any(s.n_layers == 0 for s in r.stages):
            raise Infeasible("divisibility", "a pipeline stage has no layers")


def parse(target: str, text: str, model: ModelSpec) -> Plan:
    """Read an export back from its main file's text (e.g. a Megatron launch script, a
    torchtitan TOML or launch script, a ds_config JSON)."""
    return hybrid.read_back(get(target, "import: unknown framework").parse(text, model), text)


__all__ = ["TARGETS", "Export", "ModelRefused", "ScheduleNames", "Target", "accepting", "export",
           "get", "names", "parse", "register", "unregister"]
