"""The ``hetpar`` console script: dispatches to one module per subcommand."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from hetpar.errors import ConfigError, Infeasible

# Each module defines NAME, HELP, add_arguments(parser) and run(args) -> int.
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
)


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every subcommand registered."""
    parser = argparse.ArgumentParser(
        prog="hetpar",
        description="Plan, simulate and run hybrid-parallel LLM training on "
        "heterogeneous clusters.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for modname in COMMANDS:
        mod = importlib.import_module(modname)
        p = sub.add_parser(
            mod.NAME,
            help=mod.HELP,
            description=mod.__doc__,
            epilog=getattr(mod, "EXAMPLES", None),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: returns the exit code (2 for bad input, never a traceback for it)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args._run(args))
    except ConfigError as e:
        print(f"hetpar: error: {e}", file=sys.stderr)
        return 2
    except Infeasible as e:
        print(f"hetpar: infeasible plan: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
