"""`python -m hetpar.cli`: the same entry point as the `hetpar` script."""

from hetpar.cli.main import main

raise SystemExit(main())
