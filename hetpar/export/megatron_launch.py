"""Megatron-LM launch scripts both ways: the layer-split options, the torchrun script with one
pretrain_gpt.py argument per line, and reading such a script back into a plan."""

from __future__ import annotations

import re
import shlex

from hetpar.errors import ConfigError
from hetpar.export.megatron_options import MEGATRON, SCHEDULES
from hetpar.export.schema import argv_options
from hetpar.io import from_dict
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import Plan
from hetpar.specs.stage import split_layers

SCRIPT = "pretrain_gpt.py"


def layer_sizes(n: int, parts: int) -> list[int]:
    return [b - a for a, b in split_layers(n, parts)]


def first_last(n: int, pp: int) -> tuple[int | None, int | None] | None:
    """Megatron's first/last-stage layer counts giving hetpar's even split, None if none does.

    hetpar gives the first n % pp stages one extra layer; Megatron can only make the first
    and the last stage differ from the others.
    """
    k, extra = divmod(n, pp)
    if extra == 0:
        return None, None
    if extra == 1:
        return k + 1, None
    if extra == pp - 1:  # all but the last stage have k+1: the middle ones are "the others"
        return k + 1, k
    return None


def script(
    argv: list[str], nodes: int, per_node: int, header: list[str],
    env: dict[str, str | None] | None = None,
) -> str:
    """A launch script: the environment, then torchrun with one Megatron argument per line."""
    lines = [f"# {h}" for h in header]
    for var, value in (env or {}).items():
        lines.append(f"export {var}={shlex.quote(value)}" if value is not None else f"unset {var}")
    lines.append(f"torchrun --nnodes {nodes} --nproc-per-node {per_node} {SCRIPT} \\")
    i = 0
    while i < len(argv):
        take = 2 if i + 1 < len(argv) and not argv[i + 1].startswith("--") else 1
        lines.append("    " + " ".join(shlex.quote(x) for x in argv[i : i + take]) + " \\")
        i += take
    lines.append('    "$@"')
    return "#!/bin/sh\n" + "\n".join(lines) + "\n"


def split_script(text: str) -> tuple[dict[str, str], list[str]]:
    """(torchrun options, Megatron argv) from a launch script or a bare argument list."""
    body = " ".join(
        ln.rstrip("\\") for ln in text.splitlines()
        if not ln.lstrip().startswith(("#", "export ", "unset "))
    )
    try:
        words = [w for w in shlex.split(body) if w != "$@"]
    except ValueError as e:  # an unclosed quote
        raise ConfigError(f"megatron: cannot split the launch script into words: {e}") from None
    if SCRIPT in words:
        k = words.index(SCRIPT)
        launcher, words = words[:k], words[k + 1 :]
    else:
        launcher = []
    opts = {
        launcher[i]: launcher[i + 1]
        for i in range(len(launcher) - 1)
        if launcher[i].startswith("--")
    }
    return opts, words


def options_of(argv: list[str]) -> dict[str, object]:
    """Megatron argv as option -> value (typed per the option table, None for flags)."""
    return argv_options(argv, MEGATRON)


def _int(name: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"megatron: {name} expects an integer, got {text!r}") from None


def parse(text: str, model: ModelSpec) -> Plan:
    """The uniform hetpar plan a Megatron-LM launch script describes.

    The data-parallel degree comes from torchrun's --nnodes x --nproc-per-node (the world
    size), so the script must contain the torchrun line.
    """
    launcher, argv = split_script(text)
    o = options_of(argv)

    def num(key: str, default: int = 1) -> int:
        v = o.get(key, default)
        assert isinstance(v, int)
        return v

    tp, pp, cp = (
        num("--tensor-model-parallel-size"),
        num("--pipeline-model-parallel-size"),
        num("--context-parallel-size"),
    )
    world = _world(launcher)
    if o.get("--num-layers", model.n_layers) != model.n_layers:
        raise ConfigError(
            f"megatron: --num-layers {o['--num-layers']} but model {model.name!r} has "
            f"{model.n_layers} layers"
        )
    if world % (tp * pp * cp):
        raise ConfigError(f"megatron: world size {world} not divisible by tp*pp*cp={tp * pp * cp}")
    vpp = num("--num-virtual-stages-per-pipeline-rank")
    if "--num-layers-per-virtual-pipeline-stage" in o:
        vpp = model.n_layers // (pp * num("--num-layers-per-virtual-pipeline-stage"))
    _check_split(o, model, pp, vpp)
    zero = 0
    if "--use-distributed-optimizer" in o:
        zero = {"optim_grads": 2, "optim_grads_params": 3}.get(
            str(o.get("--data-parallel-sharding-strategy")), 1
        )
    precision = (
        "fp8"
        if "--fp8-format" in o
        else "bf16"
        if "--bf16" in o
        else "fp16"
        if "--fp16" in o
        else "fp32"
    )
    data = {
        "name": _plan_name(text),
        "tp": tp,
        "pp": pp,
        "cp": cp,
        "dp": world // (tp * pp * cp),
        "vpp": vpp,
        "schedule": _schedule(vpp),
        "micro_batch": num("--micro-batch-size"),
        "global_batch": num("--global-batch-size"),
        "sequence_parallel": "--sequence-parallel" in o,
        "recompute": _recompute(o.get("--recompute-granularity")),
        "zero": zero,
        "precision": precision,
    }
    ep = num("--expert-model-parallel-size")
    if ep > 1:  # --expert-tensor-parallel-size's default (None) is the tp degree
        data["ep"] = ep
        if (etp := num("--expert-tensor-parallel-size", tp)) > 1:
            data["etp"] = etp
    if zero and num("--num-distributed-optimizer-instances") > 1:  # export/hybrid.py
        data |= {"zero_scope": "group", "collectives": {"dp_sync": "hierarchical"}}
    return from_dict(Plan, data, "megatron arguments")


def _plan_name(text: str) -> str:
    """The plan name from the export header (``# hetpar export of plan NAME for ...``)."""
    m = re.search(r"^# hetpar export of plan (.+) for \S+ -> ", text, re.MULTILINE)
    return m.group(1) if m and m.group(1) != "(unnamed)" else ""


def _world(launcher: dict[str, str]) -> int:
    """torchrun's world size (either spelling of --nproc-per-node)."""
    per = launcher.get("--nproc-per-node", launcher.get("--nproc_per_node"))
    if per is None:
        raise ConfigError(
            "megatron: the data-parallel degree needs the world size: give the launch script "
            "with its 'torchrun --nnodes N --nproc-per-node G pretrain_gpt.py' line"
        )
    return _int("--nnodes", launcher.get("--nnodes", "1")) * _int("--nproc-per-node", per)


def _recompute(value: object) -> str:
    return str(value) if value in ("full", "selective") else "none"


def _check_split(o: dict[str, object], model: ModelSpec, pp: int, vpp: int) -> None:
    """A uniform hetpar plan has hetpar's even split; other Megatron splits cannot import."""
    if vpp > 1:
        if model.n_layers % (pp * vpp):
            raise ConfigError(
                f"megatron: {model.n_layers} layers not divisible by pp*vpp={pp * vpp}"
            )
        return
    given = (
        o.get("--decoder-first-pipeline-num-layers"),
        o.get("--decoder-last-pipeline-num-layers"),
    )
    want = first_last(model.n_layers, pp) if pp > 1 else (None, None)
    if given != want:
        raise ConfigError(
            f"megatron: first/last stage layers {given} do not give hetpar's even split "
            f"{layer_sizes(model.n_layers, pp)}; import supports that split only"
        )


def _schedule(vpp: int) -> str:
    """The registered schedule for Megatron's pipeline function (interleaved iff vpp > 1)."""
    fn = "forward_backward_pipelining_with" + ("" if vpp > 1 else "out") + "_interleaving"
    name = SCHEDULES.schedule_of(fn)
    if name is None:
        raise ConfigError(f"megatron arguments: no registered schedule is Megatron's {fn}")
    return name
