"""Dense-family rules in the Megatron export: squared ReLU and partial rotary are written
(arguments.py --squared-relu, --rotary-percent); the rules without an argument are warnings."""

from __future__ import annotations

from pathlib import Path

from hetpar import catalog
from hetpar.export import export
from hetpar.export.options import TABLES, argv_options, check

HF = Path(__file__).parent / "fixtures" / "hf"
PLAN = catalog.load_plan("tp=2,pp=2,dp=2,gbs=64")


def _argv(name: str) -> tuple[list[str], list[str]]:
    e = export(PLAN, catalog.load_model(str(HF / f"{name}.json")), "megatron")
    return e.files[0][1].replace("\\\n", " ").split(), e.warnings


def test_nemotron_writes_squared_relu_and_rotary_percent() -> None:
    argv, _ = _argv("minitron-4b")
    assert "--squared-relu" in argv and "--swiglu" not in argv
    assert argv[argv.index("--rotary-percent") + 1] == "0.5"
    table = TABLES["megatron"]  # both are in the cited commit's option table
    items = argv_options(argv[argv.index("--squared-relu"):argv.index("--squared-relu") + 3],
                         table)
    assert items == {"--squared-relu": None, "--rotary-percent": 0.5}
    assert check(table, {"--tokenizer-type": "NullTokenizer", "--train-iters": 10,
                         **items}) == []


def test_full_rotary_writes_no_rotary_percent() -> None:
    argv, _ = _argv("llama-3.2-1b")
    assert "--rotary-percent" not in argv and "--squared-relu" not in argv


def test_rules_megatron_cannot_say_are_warned() -> None:
    _, gptj = _argv("gpt-j-6b")
    assert [w for w in gptj if "parallel attention and MLP" in w]
    assert [w for w in gptj if "LM head's bias" in w]
    _, bloom = _argv("bloom-560m")
    assert [w for w in bloom if "ALiBi" in w] and [w for w in bloom if "word embedding" in w]
    _, granite = _argv("granite-3.0-8b")
    assert [w for w in granite if "multipliers" in w]
    _, olmo = _argv("olmo-7b")
    assert [w for w in olmo if "parameter-free norms" in w]
