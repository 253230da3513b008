"""``python -m verification.audit MODULE:FUNCTION [...]``: the same as ``tmc audit``."""

from verification.audit.cli import cli_main

raise SystemExit(cli_main())
