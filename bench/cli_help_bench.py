"""How long `forja --help` and a few verbs' `--help` take, and which imports the time goes to.

Issue 32's goal: `forja --help`, and every verb's, answers in at most 0.25 s. Not a test: wall
times on a shared machine are noisy, so this prints the median, min and max of --repeat runs of
each command (each a fresh process, as a person typing it starts one), then the slowest imports of
one `python -X importtime -m forja --help`. What the test suite holds instead is the cause:
tests/cli/test_cli_help.py fails if `import forja.cli` loads the API (pydantic, requests, ...).

  python bench/cli_help_bench.py               # 10 runs of each
  python bench/cli_help_bench.py --repeat 30 --top 25

It runs the installed `forja` console script beside this Python (the venv's bin), as a user does,
with HOME empty and no inventory named, so the help never depends on either.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GOAL_S = 0.25
#: The commands timed: the root's help and a few verbs', groups' and sub-commands' (the heaviest parts).
COMMANDS = (
    (),
    ("train",),
    ("runs",),
    ("cost",),
    ("cost", "rate"),
    ("sweep", "start"),
    ("queue", "move"),
)


def forja_command() -> list[str]:
    """The console script beside this Python, else `python -m forja` (the same app)."""
    script = Path(sys.executable).with_name("forja")
    return [str(script)] if script.exists() else [sys.executable, "-m", "forja"]


def time_once(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    took = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed (rc {proc.returncode}): {proc.stderr[-2000:]}")
    return took


def top_imports(env: dict[str, str], top: int) -> list[tuple[int, int, str]]:
    """(self µs, cumulative µs, module) of the `top` slowest imports by cumulative time."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "forja", "--help"], capture_output=True,
                          text=True, env=env, check=True)
    rows = []
    for line in proc.stderr.splitlines():
        parts = line.removeprefix("import time:").split("|")
        if len(parts) == 3 and parts[0].strip().isdigit():
            rows.append((int(parts[0]), int(parts[1]), parts[2].rstrip()))
    return sorted(rows, key=lambda r: r[1], reverse=True)[:top]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=10, help="runs of each command (default 10)")
    parser.add_argument("--top", type=int, default=15, help="slowest imports to list (default 15)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as home:
        env = {k: v for k, v in os.environ.items() if k not in ("FORJA_INVENTORY", "FORJA_HOME")}
        env["HOME"] = home
        base = forja_command()
        print(f"{' '.join(base)} ... --help, {args.repeat} runs each (goal {GOAL_S:.2f} s)\n")
        print(f"{'command':<28} {'median':>8} {'min':>8} {'max':>8}  goal")
        for words in COMMANDS:
            runs = [time_once([*base, *words, "--help"], env) for _ in range(args.repeat)]
            median = statistics.median(runs)
            name = " ".join(("forja", *words, "--help"))
            verdict = "ok" if median <= GOAL_S else "OVER"
            print(f"{name:<28} {median:8.3f} {min(runs):8.3f} {max(runs):8.3f}  {verdict}")
        print("\nslowest imports of python -X importtime -m forja --help (cumulative, ms):\n")
        for own, total, module in top_imports(env, args.top):
            print(f"{total / 1000:8.1f} {own / 1000:8.1f}  {module}")


if __name__ == "__main__":
    main()
