"""`python -m clawgym_cli ...` is the `clawgym` command."""

from clawgym_cli.app import app

app()
