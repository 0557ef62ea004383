"""`python -m forja.cost ...` is `forja cost ...`: the same command of the one CLI, not a second one.

The options the main CLI takes before the verb (`--json`, `--inventory`/`-i`) are accepted after it
here too, so `python -m forja.cost --inventory hosts.yml --json` keeps working.
"""

import sys

from forja.cli import app

before: list[str] = []
after: list[str] = []
args = iter(sys.argv[1:])
for arg in args:
    if arg == "--json":
        before.append(arg)
    elif arg in ("--inventory", "-i"):
        before += ["-i", next(args, "")]
    elif arg.startswith("--inventory="):
        before += ["-i", arg.split("=", 1)[1]]
    else:
        after.append(arg)
app([*before, "cost", *after], prog_name="forja")
