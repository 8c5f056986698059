"""Exports of an uneven expert split: every target places n_experts / ep experts per EP rank,
so each refuses it in one line naming the field and the nearest plan (the even split)."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from hetpar import catalog
from hetpar.errors import ConfigError
from hetpar.export import export

MIXTRAL = catalog.load_model("mixtral-8x7b")
GPT_OSS = catalog.load_model("gpt-oss-20b")
EVEN = catalog.load_plan("tp=2,dp=4,ep=4,gbs=64")


@pytest.mark.parametrize(("target", "model", "version", "label"), [
    ("megatron", MIXTRAL, None, "Megatron-LM"), ("deepspeed", MIXTRAL, None, "DeepSpeed"),
    ("torchtitan", GPT_OSS, "2026-02", "torchtitan 2026-02")])
@pytest.mark.parametrize("split", ["by_speed", (1, 3, 2, 2)])
def test_uneven_split_is_refused_naming_the_nearest_plan(target, model, version, label,
                                                         split) -> None:
    plan = replace(EVEN, experts_per_rank=split)
    with pytest.raises(ConfigError) as err:
        export(plan, model, target, version=version)
    msg = str(err.value)
    shown = split if isinstance(split, str) else "1/3/2/2"
    # each target names itself (the Megatron export said "this target" before)
    assert "\n" not in msg and msg.startswith(f"export: experts_per_rank={shown} is not "
                                              f"carried by {label}, "), msg
    m = re.search(r"nearest plan: (\S+)$", msg)
    assert m, msg
    near = catalog.load_plan(m.group(1))
    assert near.experts_per_rank == "even" and near.degree("ep") == 4
    e = export(near, model, target, version=version)
    assert e.problems() == []


def test_even_counts_export_as_the_even_plan() -> None:
    counts = export(replace(EVEN, experts_per_rank=(2, 2, 2, 2)), MIXTRAL, "megatron")
    assert counts.files == export(EVEN, MIXTRAL, "megatron").files
