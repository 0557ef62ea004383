"""`python -m forja.cost` is `forja cost` without the rest of the CLI."""

from forja.cost.cli import app

app(prog_name="forja cost")
