"""`python -m forja ...` is the `forja` command (forja.cli:app, the console script), for a machine
where the venv's bin is not on PATH and for `python -X importtime -m forja --help`."""

from forja.cli import app

app(prog_name="forja")
