"""The docs say what the command does: every `forja` command in a shell block of the README, SKILL.md
and docs/ parses against the real command tree; the README's quick start is the block the sandbox walk
runs (tests/sandbox/test_installed_walk.py); a broken link fails the site's strict build (`make docs`,
in `make lint`); the README stays a front door of two screens.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import docblocks
import pytest
import typer

import forja.cli
from forja.errors import ExitCode

ROOT = docblocks.ROOT
#: Two screens of rendered text: the README is the front door, everything else is in docs/.
README_MAX_LINES = 80


@pytest.fixture(scope="module")
def root_command():
    return typer.main.get_command(forja.cli.app)


def test_every_documented_forja_command_parses(root_command) -> None:
    checked, wrong = 0, []
    for path in docblocks.doc_files():
        for block in docblocks.blocks(path):
            for argv in docblocks.forja_commands(block):
                checked += 1
                try:
                    docblocks.parse(root_command, argv)
                except docblocks.DocCommandError as exc:
                    wrong.append(f"{block.where}: {exc}")
    assert checked > 50, f"only {checked} forja commands found in the docs' shell blocks"
    assert not wrong, "documented commands the real forja refuses:\n" + "\n".join(wrong)


@pytest.mark.parametrize(("argv", "said"), [
    (["trian", "x.yaml"], "No such command"),
    (["train", "x.yaml", "--detatch"], "No such option"),
    (["--json", "cost", "rate", "--spot"], "Missing"),
    (["status", "one", "two"], "unexpected extra argument"),
    (["train", "x.yaml", "--timeout", "soon"], "number"),
])
def test_a_command_the_real_forja_refuses_is_caught(root_command, argv: list[str], said: str) -> None:
    with pytest.raises(docblocks.DocCommandError, match=said):
        docblocks.parse(root_command, argv)


def test_marked_blocks_are_found_and_split_into_commands(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("Text.\n\n```bash\nforja up\n```\n\n<!-- walk: demo -->\n```bash\n"
                    "forja status; forja runs && forja cost   # three\n"
                    "forja train cfg.yaml \\\n  --detach -- --lr 3e-4\n```\n")
    plain, marked = docblocks.blocks(page)
    assert (plain.walk, marked.walk, marked.line) == (None, "demo", 8)
    assert docblocks.forja_commands(marked) == [
        ["status"], ["runs"], ["cost"], ["train", "cfg.yaml", "--detach", "--", "--lr", "3e-4"]]


def test_the_readme_quick_start_is_the_sandbox_walk() -> None:
    readme = [b for b in docblocks.blocks(ROOT / "README.md") if b.walk == "sandbox"]
    assert len(readme) == 1, "README.md must hold one block marked <!-- walk: sandbox -->"
    walk = docblocks.walk("sandbox")
    assert walk == docblocks.forja_commands(readme[0]), "only the README's quick start is the sandbox walk"
    verbs = [argv[0] for argv in walk]
    assert verbs[0] == "check" and verbs[-1] == "down" and "train" in verbs, verbs


def test_the_readme_is_a_front_door_whose_links_lead_somewhere() -> None:
    for name in ("README.md", "SKILL.md"):
        text = (ROOT / name).read_text()
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if "://" not in target:
                assert (ROOT / target).is_file(), f"{name} links to {target}, which does not exist"
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines: move the detail to docs/"


def test_skill_lists_every_exit_code() -> None:
    table = re.findall(r"^\| (\d+) \|", (ROOT / "SKILL.md").read_text(), re.MULTILINE)
    assert sorted(int(code) for code in table) == sorted(int(code) for code in ExitCode)


def test_a_broken_link_fails_the_docs_build(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path)
    with (tmp_path / "docs" / "cost.md").open("a") as page:
        page.write("\nSee [the rates](no-such-page.md) and [the cap](cost.md#no-such-anchor).\n")
    # Never -q: MkDocs counts the warnings it logs, and -q logs none, so a strict quiet build passes.
    build = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f",
                            str(tmp_path / "mkdocs.yml"), "-d", str(tmp_path / "site")],
                           capture_output=True, text=True, timeout=120, check=False)
    said = build.stdout + build.stderr
    assert build.returncode != 0, said
    assert "no-such-page.md" in said and "no-such-anchor" in said, said
