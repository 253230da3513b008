"""``python -m proofs_check``: see :mod:`proofs_check.cli`."""

from proofs_check.cli import cli_main

raise SystemExit(cli_main())
