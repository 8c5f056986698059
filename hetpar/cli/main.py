"""The ``hetpar`` console script: dispatches to one module per subcommand."""

from __future__ import annotations

import argparse
import ast
import functools
import importlib
import importlib.util
import os
import sys
import traceback
from collections.abc import Sequence
from typing import Any, NoReturn

from hetpar.cli.progress import add_quiet
from hetpar.errors import ConfigError, Infeasible

# Each module defines NAME, HELP, add_arguments(parser) and run(args) -> int. Only the chosen
# command's module is imported: NAME and HELP are read from the others' source, so
# `hetpar simulate` does not pay for the planner's (or the runtime's) imports.
COMMANDS = (
    "hetpar.cli.simulate",
    "hetpar.cli.plan",
    "hetpar.cli.describe",
    "hetpar.cli.validate",
    "hetpar.cli.validate_collectives",
    "hetpar.cli.export",
    "hetpar.cli.import_cluster",
    "hetpar.cli.failures",
    "hetpar.cli.replay",
    "hetpar.cli.report",
    "hetpar.cli.run",
    "hetpar.cli.calibrate",
    "hetpar.cli.probe",
)

REPORT_BUG = ("hetpar: internal error (a bug, not your input): please report it with the "
              "command line and the traceback above")


class Parser(argparse.ArgumentParser):
    """argparse with the project's one-line error (argparse prints usage + error)."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"{message} (see `{self.prog} --help`)")


@functools.cache  # 13 modules parsed took 40 ms a call: in-process tests call main() often
def _header(modname: str) -> tuple[str, str]:
    """A command module's NAME and HELP, read from its source without importing it."""
    spec = importlib.util.find_spec(modname)
    assert spec is not None and spec.origin is not None, f"{modname}: no such module"
    tree = ast.parse(open(spec.origin, encoding="utf-8").read(), spec.origin)
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and target.id in ("NAME", "HELP"):
                found[target.id] = ast.literal_eval(node.value)  # a literal, by contract
    assert set(found) == {"NAME", "HELP"}, f"{modname}: NAME and HELP must be string literals"
    return found["NAME"], found["HELP"]


def _fill(p: argparse.ArgumentParser, modname: str) -> None:
    """Import one command's module and give its parser the description, options and run."""
    mod = importlib.import_module(modname)
    p.description = mod.__doc__
    p.epilog = getattr(mod, "EXAMPLES", None)
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    mod.add_arguments(p)
    add_quiet(p)
    p.set_defaults(_run=mod.run, _parser=p)


class _Commands(argparse._SubParsersAction):
    """Subcommand parsers filled in only when chosen (argparse's action, made lazy)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.modules: dict[str, str] = {}

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        modname = self.modules.pop(values[0], None)
        if modname is not None:
            _fill(self._name_parser_map[values[0]], modname)
        super().__call__(parser, namespace, values, option_string)


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every subcommand registered (each filled in when chosen)."""
    parser = Parser(
        prog="hetpar",
        description="Plan, simulate and run hybrid-parallel LLM training on "
        "heterogeneous clusters.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True,
                                action=_Commands)
    assert isinstance(sub, _Commands)
    for modname in COMMANDS:
        name, help_text = _header(modname)
        sub.add_parser(name, help=help_text)
        sub.modules[name] = modname
    return parser


def _check_empty(args: argparse.Namespace) -> None:
    """An explicitly empty option value (``--plan ""``) is an error, not the default."""
    parser: argparse.ArgumentParser = args._parser
    for action in parser._actions:
        value = getattr(args, action.dest, None)
        values = value if isinstance(value, list) else [value]
        if action.default != "" and any(isinstance(v, str) and not v.strip() for v in values):
            name = action.option_strings[-1] if action.option_strings else action.metavar
            raise ConfigError(f"{name or action.dest}: empty value; give a value or leave the "
                              "option out")


def _first_line(e: BaseException) -> str:
    return (str(e).splitlines() or [type(e).__name__])[0]


LINE_MAX = 400
"""The longest error line printed: a message quoting a whole input (a 100,000-bracket file)
keeps its start and its end, which name the field and what was expected."""


def _one_line(e: BaseException) -> str:
    line = "; ".join(x.strip() for x in str(e).splitlines() if x.strip()) or type(e).__name__
    if len(line) <= LINE_MAX:
        return line
    head, tail = LINE_MAX * 2 // 3, LINE_MAX // 4
    return f"{line[:head]} ...({len(line) - head - tail:,} characters left out)... {line[-tail:]}"


def _os_error(e: OSError) -> str:
    where = f"{e.filename}: " if e.filename else ""
    return f"{where}{e.strerror or _first_line(e)}"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: returns the exit code (2 for bad input, never a traceback for it).

    Expected failures (malformed input, infeasible plans, unreadable or unwritable paths,
    undecodable or absurdly nested files) print one line and return 2; anything else is a
    bug: its traceback and a request to report it, exit code 1.
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        _check_empty(args)
        return int(args._run(args))
    except ConfigError as e:
        print(f"hetpar: error: {_one_line(e)}", file=sys.stderr)
    except Infeasible as e:
        print(f"hetpar: infeasible plan: {_one_line(e)}", file=sys.stderr)
    except BrokenPipeError:
        # stdout closed early (`hetpar ... | head`): not an error; silence the flush at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as e:  # unreadable input, unwritable output, a directory for a file
        print(f"hetpar: error: {_os_error(e)}", file=sys.stderr)
    except UnicodeError as e:
        print(f"hetpar: error: cannot decode the input as UTF-8 text: {_first_line(e)}",
              file=sys.stderr)
    except RecursionError:
        print("hetpar: error: the input is nested too deeply to read", file=sys.stderr)
    except MemoryError:
        print("hetpar: error: out of memory; the options ask for more than this machine has",
              file=sys.stderr)
    except KeyboardInterrupt:
        print("hetpar: interrupted", file=sys.stderr)
        return 130
    except Exception:
        traceback.print_exc()
        print(REPORT_BUG, file=sys.stderr)
        return 1
    return 2


if __name__ == "__main__":
    sys.exit(main())
