"""`python -m hetpar`: the same entry point as the `hetpar` script."""

from hetpar.cli.main import main

raise SystemExit(main())
