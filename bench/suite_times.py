"""Where the test suite's time goes: tables per file, per bring-up and per test, from one run.

`make test` records every test phase and every fixture set-up over 0.1 s in
`.ci-logs/test-times.jsonl` (tests/timings.py). This script reads that file and prints:

- the margin: each pytest session's wall time and the whole run's, against CI's 90 minutes;
- the bring-ups: fixture set-ups (the sandbox, test hosts, converges), counted apart from tests;
- time per test file, with its set-up, call and teardown phases;
- the slowest tests.

With ``--before OLD.jsonl`` it also prints each file's time then and now, so a change to the suite
is judged by one table. Examples:

    python bench/suite_times.py                        # the last `make test`
    python bench/suite_times.py --top 25 --margin-only # what CI prints at its end
    python bench/suite_times.py --before before.jsonl  # a before/after table
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

#: CI's hard limit for one `.ci/run` (DEVELOPERS.md), and the suite's own goal for `make test`.
CI_LIMIT_S = 5400
GOAL_S = 35 * 60
#: Fixture set-ups at least this long are bring-ups (a host, the sandbox, a converge, a server).
BRING_UP_MIN_S = 2.0


@dataclass
class Run:
    """One recorded run: pytest sessions, test phases and fixture set-ups."""

    sessions: list[tuple[float, float, list[str]]] = field(default_factory=list)
    phases: dict[str, dict[str, float]] = field(default_factory=lambda: defaultdict(dict))
    outcomes: dict[str, str] = field(default_factory=dict)
    fixtures: list[dict[str, object]] = field(default_factory=list)


def load(path: Path) -> Run:
    """Read a timings file; a session that never finished (a killed run) ends at its last record."""
    run = Run()
    start: tuple[float, list[str]] | None = None
    last = 0.0
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by a killed run
        kind = rec.get("kind")
        if kind == "session" and rec["event"] == "start":
            if start is not None:
                run.sessions.append((start[0], last, start[1]))
            start, last = (rec["time"], rec.get("args", [])), rec["time"]
        elif kind == "session" and rec["event"] == "finish" and start is not None:
            run.sessions.append((start[0], rec["time"], start[1]))
            start = None
        elif kind == "phase":
            run.phases[rec["nodeid"]][rec["when"]] = rec["duration"]
            if rec["outcome"] != "passed" or rec["when"] == "call":
                run.outcomes.setdefault(rec["nodeid"], rec["outcome"])
                if rec["outcome"] == "failed":
                    run.outcomes[rec["nodeid"]] = "failed"
            last = max(last, rec.get("stop", last))
        elif kind == "fixture":
            run.fixtures.append(rec)
    if start is not None:
        run.sessions.append((start[0], last, start[1]))
    return run


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def per_file(run: Run) -> dict[str, tuple[int, float, float, float]]:
    """Each file's test count and its setup, call and teardown seconds."""
    out: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0, 0.0])
    for nodeid, ph in run.phases.items():
        row = out[file_of(nodeid)]
        row[0] += 1
        row[1] += ph.get("setup", 0.0)
        row[2] += ph.get("call", 0.0)
        row[3] += ph.get("teardown", 0.0)
    return {k: (int(v[0]), v[1], v[2], v[3]) for k, v in out.items()}


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


def table(headers: list[str], rows: list[list[str]]) -> str:
    """A Markdown table: it reads in a terminal and pastes into a closing note as it is."""
    rule = "|".join("---" if i == 0 else "---:" for i in range(len(headers)))
    lines = ["| " + " | ".join(headers) + " |", f"|{rule}|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def margin(run: Run, total_s: float | None) -> str:
    """Each session's wall time, the run's, and what is left of CI's limit."""
    rows = [[" ".join(a for a in args if not a.startswith("-"))[:60] or "pytest", f"{end - start:,.0f}",
             minutes(end - start)] for start, end, args in run.sessions]
    wall = sum(end - start for start, end, _ in run.sessions)
    out = [table(["pytest session", "s", "min"], rows),
           f"\npytest in all: {wall:,.0f} s ({minutes(wall)}); goal for make test {minutes(GOAL_S)}."]
    if total_s is not None:
        out.append(f"CI run so far: {total_s:,.0f} s of {CI_LIMIT_S:,} s ({total_s / CI_LIMIT_S:.0%}); "
                   f"margin {CI_LIMIT_S - total_s:,.0f} s ({minutes(CI_LIMIT_S - total_s)}).")
    return "\n".join(out)


def bring_ups(run: Run, min_s: float = BRING_UP_MIN_S) -> str:
    """Fixture set-ups of at least ``min_s``, grouped by fixture and the file that first used it."""
    grouped: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for rec in run.fixtures:
        if float(rec["duration"]) >= min_s:
            key = (str(rec["fixture"]), str(rec["scope"]), file_of(str(rec["nodeid"])))
            grouped[key].append(float(rec["duration"]))
    rows = sorted(grouped.items(), key=lambda kv: -sum(kv[1]))
    total = sum(sum(v) for _, v in rows)
    body = table(["fixture", "scope", "first used in", "times", "s"],
                 [[f, s, p, str(len(v)), f"{sum(v):,.0f}"] for (f, s, p), v in rows])
    return f"{body}\n\nbring-ups in all: {total:,.0f} s ({minutes(total)})"


def files(run: Run, before: Run | None, top: int) -> str:
    now = per_file(run)
    then = per_file(before) if before else {}
    keys = sorted(set(now) | set(then), key=lambda k: -sum(now.get(k, (0, 0, 0, 0))[1:]))
    rows = []
    for k in keys[:top] if top else keys:
        n, s, c, t = now.get(k, (0, 0.0, 0.0, 0.0))
        row = [k, str(n), f"{s:,.0f}", f"{c:,.0f}", f"{t:,.0f}", f"{s + c + t:,.0f}"]
        if before:
            bn, bs, bc, bt = then.get(k, (0, 0.0, 0.0, 0.0))
            row[1:1] = [str(bn)]
            row.insert(3, f"{bs + bc + bt:,.0f}")
        rows.append(row)
    headers = ["file", "tests", "setup s", "call s", "teardown s", "total s"]
    if before:
        headers = ["file", "tests before", "tests", "before s", "setup s", "call s", "teardown s", "total s"]
    total_now = sum(sum(v[1:]) for v in now.values())
    summary = f"\n{len(run.phases)} tests, {total_now:,.0f} s in test phases ({minutes(total_now)})"
    if before:
        total_then = sum(sum(v[1:]) for v in then.values())
        summary += f"; before: {len(before.phases)} tests, {total_then:,.0f} s ({minutes(total_then)})"
    return table(headers, rows) + summary


def slowest(run: Run, top: int) -> str:
    tests = sorted(run.phases.items(), key=lambda kv: -sum(kv[1].values()))[:top]
    return table(["test", "setup s", "call s", "total s"],
                 [[k, f"{v.get('setup', 0):,.0f}", f"{v.get('call', 0):,.0f}", f"{sum(v.values()):,.0f}"]
                  for k, v in tests])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("timings", nargs="?", type=Path, default=Path(".ci-logs/test-times.jsonl"),
                        help="the run's timings file (default: .ci-logs/test-times.jsonl)")
    parser.add_argument("--before", type=Path, help="an earlier run's timings file, for a before/after table")
    parser.add_argument("--top", type=int, default=25,
                        help="how many of the slowest tests (and files) to list")
    parser.add_argument("--all-files", action="store_true", help="list every file, not only the slowest")
    parser.add_argument("--margin-only", action="store_true",
                        help="only the margin, bring-ups and slowest tests")
    parser.add_argument("--bring-up-min", type=float, default=BRING_UP_MIN_S,
                        help=f"shortest fixture set-up counted as a bring-up, s (default {BRING_UP_MIN_S})")
    parser.add_argument("--ci-elapsed", type=float, help="seconds the whole CI run has taken so far")
    args = parser.parse_args(argv)
    if not args.timings.exists():
        print(f"no timings at {args.timings}: run `make test` (or pytest) first", file=sys.stderr)
        return 1
    run = load(args.timings)
    before = load(args.before) if args.before else None
    print("## Margin\n\n" + margin(run, args.ci_elapsed))
    print(f"\n## Bring-ups (fixture set-ups of {args.bring_up_min:g} s or more)\n\n"
          + bring_ups(run, args.bring_up_min))
    if not args.margin_only:
        print("\n## Time per test file\n\n" + files(run, before, 0 if args.all_files else args.top))
    print(f"\n## The {args.top} slowest tests\n\n" + slowest(run, args.top))
    failed = [k for k, v in run.outcomes.items() if v == "failed"]
    if failed:
        print(f"\n{len(failed)} failed: " + ", ".join(failed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
