"""A run's snapshot: what it ran, so it can be shown (`forja runs --show`) and run again (`--again`).

Recorded on the controller when the run is sent, because the project is there: its git commit,
whether the work tree had uncommitted changes and their digest, the patch itself (tracked files'
changes and the untracked files git does not ignore), the config as given and the run's options.
The host adds its Python packages at the run's start (`packages.json` in the run folder, written by
forja-train-launch: trainer.run_folder.PACKAGES), which come back with the run's results. The
config as the trainer resolved it is the run folder's config.yaml (trainer.run_folder.CONFIG).

Where: the facts are the history's "snapshot" event of the run (forja.history); the files (the
patch, the config as given) live in <forja home>/snapshots/<run>/, private to the user (0700): a
patch may hold anything the work tree held.

Why `--again` checks out a temporary work tree instead of asking: "again" means the same code.
When the project's tree is the snapshot's (same commit, same changes) it is sent as it is; when it
differs, forja adds a git worktree at the snapshot's commit under a temporary folder, applies the
patch there, sends that, and removes it after; the user's own tree is never touched. A project
that was not a git repository cannot be put back: it is sent as it is now, and forja says so.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from forja import errors
from forja.paths import forja_home
from forja.project import git, git_root
from trainer import run_folder

if TYPE_CHECKING:
    from forja.session import Session

#: The history event that holds a run's snapshot, and the files beside it.
EVENT = "snapshot"
PATCH = "uncommitted.patch"
CONFIG = "config.yaml"
#: An untracked file larger than this is named in the snapshot but not copied into the patch.
UNTRACKED_MAX_BYTES = 10 << 20
#: The temporary worktrees `again` has checked out, while they live: the worktree -> the user's git root.
#: A run sent from one ran the user's project at that commit, so its snapshot names the project (`record`),
#: never the temporary folder, which is gone when a later `--again` of that run looks for it.
_WORKTREES: dict[Path, Path] = {}


def folder(run_id: str) -> Path:
    """<forja home>/snapshots/<run>: the patch and the config as given."""
    return forja_home() / "snapshots" / run_id


@dataclass(frozen=True)
class GitState:
    """A project folder's git facts: `commit` None when it is not a git repository."""

    root: str | None = None
    commit: str | None = None
    branch: str | None = None
    patch: bytes = b""
    untracked: tuple[str, ...] = ()
    too_big: tuple[str, ...] = ()

    @property
    def digest(self) -> str | None:
        """SHA-256 of the uncommitted changes (None when there are none, or no git)."""
        return hashlib.sha256(self.patch).hexdigest() if self.patch else None


def git_state(project: Path) -> GitState:
    """Read `project`'s commit and uncommitted changes (tracked and untracked, ignored files left out)."""
    root = git_root(project)
    commit = git(project, "rev-parse", "--verify", "HEAD") if root else None
    if root is None or not commit:
        return GitState()
    branch = (git(root, "symbolic-ref", "--short", "-q", "HEAD") or "").strip() or None
    patch = (git(root, "diff", "HEAD", "--binary", "--no-color", "--no-ext-diff") or "").encode()
    listed = git(root, "ls-files", "--others", "--exclude-standard", "-z") or ""
    untracked = tuple(sorted(p for p in listed.split("\0") if p))
    too_big = []
    for rel in untracked:
        path = root / rel
        if not path.is_file() or path.stat().st_size > UNTRACKED_MAX_BYTES:
            too_big.append(rel)
            continue
        # `git diff --no-index` exits 1 when the files differ, which they do: read it as it is.
        done = subprocess.run(["git", "-C", str(root), "diff", "--binary", "--no-color", "--no-index",
                               "/dev/null", rel], capture_output=True, check=False)
        patch += done.stdout
    return GitState(str(root), commit.strip(), branch, patch, untracked, tuple(too_big))


def record(
    session: Session, run_id: str, *, project: Path | None, config: Path | None, options: dict[str, Any],
) -> dict[str, Any]:
    """Take the run's snapshot and record it (the history event and the files); return its facts.

    `options` are what the run was sent with (script, args, excludes, procs, hooks, -e variables),
    so `--again` can send it the same way.
    """
    where = folder(run_id)
    if where.exists():
        shutil.rmtree(where)  # a name sent again (a resumed run) gets the snapshot of this sending
    where.mkdir(parents=True, mode=0o700)
    state = git_state(project) if project is not None else GitState()
    project, root = _origin(project, state.root)
    facts: dict[str, Any] = {
        "project": str(project) if project else None,
        "git": state.commit is not None,
        "git_root": root,
        "commit": state.commit,
        "branch": state.branch,
        "dirty": bool(state.patch),
        "patch_sha256": state.digest,
        "untracked": list(state.untracked),
        "untracked_not_in_patch": list(state.too_big),
        "config": str(config) if config else None,
        "options": options,
        "folder": str(where),  # kept with the facts: `--replace` renames a run, not this folder
    }
    if state.patch:
        (where / PATCH).touch(mode=0o600)  # private before a byte is written: it may hold anything
        (where / PATCH).write_bytes(state.patch)
    if config is not None and config.is_file():
        shutil.copyfile(config, where / CONFIG)
    session.history.record_event(run_id, EVENT, **facts)
    return facts


def _origin(project: Path | None, root: str | None) -> tuple[Path | None, str | None]:
    """The project folder and git root a snapshot names: the user's, for a folder inside one of
    `again`'s temporary worktrees (`_WORKTREES`)."""
    if project is None:
        return None, root
    resolved = project.resolve()
    for tree, origin in _WORKTREES.items():
        if resolved.is_relative_to(tree):
            return origin / resolved.relative_to(tree), str(origin)
    return project, root


@dataclass(frozen=True)
class Snapshot:
    """A run's snapshot as recorded, and what its host said (`packages`: name -> version)."""

    run_id: str
    facts: dict[str, Any]
    folder: Path
    packages: dict[str, str] = field(default_factory=dict)
    resolved_config: str | None = None

    @property
    def patch(self) -> Path | None:
        path = self.folder / PATCH
        return path if path.is_file() else None

    @property
    def config(self) -> Path | None:
        """The config as given, kept beside the snapshot (the original may have changed since)."""
        path = self.folder / CONFIG
        return path if path.is_file() else None

    def as_dict(self) -> dict[str, Any]:
        return {"run": self.run_id, **self.facts, "patch_file": str(self.patch) if self.patch else None,
                "config_file": str(self.config) if self.config else None, "packages": self.packages,
                "resolved_config": self.resolved_config}

    def lines(self) -> list[str]:
        """The snapshot for people (forja runs --show)."""
        f = self.facts
        if not f.get("project"):
            code = "project: none sent (the built-in trainer's config)"
        elif not f.get("git"):
            code = f"project: {f['project']} (not a git repository: no commit recorded)"
        else:
            branch = f" ({f['branch']})" if f.get("branch") else ""
            code = f"project: {f['project']} at {f['commit'][:12]}{branch}"
        out = [code]
        if f.get("git"):
            out.append(f"uncommitted changes: sha256 {f['patch_sha256'][:16]}, patch {self.patch}"
                       if f.get("dirty") else "uncommitted changes: none")
            if f.get("untracked_not_in_patch"):
                out.append(f"untracked, too big for the patch: {', '.join(f['untracked_not_in_patch'])}")
        opts = f.get("options") or {}
        kept = f" (as given: {self.config})" if self.config else ""
        out.append(f"config: {f.get('config') or '-'}{kept}")
        if opts.get("script"):
            out.append(f"script: {opts['script']} {' '.join(opts.get('args') or [])}".rstrip())
        if opts.get("extravars"):
            out.append("overrides: " + ", ".join(f"{k}={v}" for k, v in sorted(opts["extravars"].items())))
        if self.resolved_config:
            out.append(f"resolved config: {self.resolved_config}")
        known = ", ".join(f"{n} {self.packages[n]}" for n in ("torch", "numpy") if n in self.packages)
        out.append(f"packages: {len(self.packages)} on the host{f' ({known})' if known else ''}, all "
                   "under --json" if self.packages else "packages: not fetched yet (forja fetch RUN)")
        return out


def load(session: Session, name: str) -> Snapshot:
    """The snapshot of run `name`. RunNotFound (saying `forja runs` lists them) for an unknown run;
    ConfigError for a run sent before snapshots were recorded, or by another machine."""
    try:
        record_ = session.history.find(name)
    except errors.RunNotFound:
        raise errors.RunNotFound(f"no run {name!r} in the history; `forja runs` lists them") from None
    found = [e for e in session.history.events(record_.run_id) if e.kind == EVENT]
    if not found:
        raise errors.ConfigError(
            "--again", f"run {record_.run_id} has no snapshot (it was sent before forja recorded them, or "
            "by another machine); send it with forja train CONFIG")
    packages, resolved = _from_results(record_.artifact_dir)
    facts = dict(found[-1].data)
    return Snapshot(record_.run_id, facts, Path(facts.get("folder") or folder(record_.run_id)), packages,
                    resolved)


def _from_results(artifact_dir: str | None) -> tuple[dict[str, str], str | None]:
    """The host's packages.json and resolved config.yaml from a run's fetched results, if there
    (the history's artifact_dir is the rank-0 host's folder; a run folder of host folders is read too)."""
    if not artifact_dir or not Path(artifact_dir).is_dir():
        return {}, None
    root = Path(artifact_dir)
    for host in [root, *sorted(p for p in root.iterdir() if p.is_dir())]:
        listed = host / run_folder.PACKAGES
        if listed.is_file():
            with contextlib.suppress(ValueError):
                data = json.loads(listed.read_text())
                config = host / run_folder.CONFIG
                return dict(data.get("packages", data)), str(config) if config.is_file() else None
    return {}, None


@dataclass(frozen=True)
class Again:
    """How to send a run again: its options, the project folder to send and what was said about it."""

    options: dict[str, Any]
    config: Path | None
    project: Path | None
    said: str
    #: What a new run's name is made from (forja.runs.new_run_id): the run's script, else the config it
    #: was given (not the snapshot's copy of it, whose name is config.yaml).
    name_source: Path

    def keywords(self, backend: str = "vm") -> dict[str, Any]:
        """`Forja.train`'s keywords that send this snapshot (`backend` "vm" or "vertex"): the config,
        script, arguments, project, exclusions and processes, and on a VM the hooks and -e variables.

        A Vertex AI job takes neither hooks nor -e variables: a run sent with them is refused (an
        override dropped would make a different run), naming them and the two ways out.
        """
        opts = self.options
        how: dict[str, Any] = {
            "config": self.config, "script": opts.get("script"), "args": list(opts.get("args") or []),
            "project": self.project, "excludes": list(opts.get("excludes") or []), "procs": opts.get("procs")}
        hooks, extravars = dict(opts.get("hooks") or {}), dict(opts.get("extravars") or {})
        if backend != "vertex":
            return {**how, "hooks": hooks or None, "extravars": extravars}
        given = [f"-e {k}={v}" for k, v in sorted(extravars.items())]
        given += [f"--hook {event}={script}" for event, script in hooks.items()]
        if given:
            raise errors.ConfigError(
                "--again", f"the run was sent with {', '.join(given)}, which a Vertex AI job does not take; "
                "send it again on the VM (drop --backend vertex), or send its config or script with "
                "forja train ... --backend vertex")
        return how


@contextlib.contextmanager
def again(session: Session, name: str) -> Iterator[Again]:
    """The run's snapshot made ready to send again (the module's docstring says how the code is put back).

    A temporary worktree, when one is needed, lives while the context does and is removed after.
    """
    snap = load(session, name)
    f = snap.facts
    opts = dict(f.get("options") or {})
    named = Path(opts.get("script") or f.get("config") or snap.run_id)
    with tempfile.TemporaryDirectory(prefix=f"forja-again-{snap.run_id}-config-") as kept:
        config = snap.config or (Path(f["config"]) if f.get("config") else None)
        if config is not None and config == snap.config:
            # the snapshot's own copy, which sending a run under this name replaces: send a copy of it
            config = Path(shutil.copy(config, Path(kept) / config.name))
        with _put_back(snap, opts, config, named) as plan:
            yield plan


@contextlib.contextmanager
def _put_back(snap: Snapshot, opts: dict[str, Any], config: Path | None, named: Path) -> Iterator[Again]:
    """`again`'s code: the project as it is when it is the run's, else the run's commit and patch in a
    temporary worktree, removed when the context ends."""
    f = snap.facts
    project = Path(f["project"]) if f.get("project") else None
    if project is None:  # no project: the config where it is, while it is the run's (a built-in one is)
        original = Path(f["config"]) if f.get("config") else None
        if original is not None and original.is_file() and (
                config is None or original.read_bytes() == config.read_bytes()):
            config = original
        yield Again(opts, config, None, f"run {snap.run_id} again: the same config, no project", named)
        return
    if not f.get("git"):
        yield Again(opts, config, project, f"run {snap.run_id} again: its project {project} was not a git "
                    "repository, so it is sent as it is now (its code may differ from the run's)", named)
        return
    now = git_state(project)
    if now.commit == f["commit"] and now.digest == f.get("patch_sha256"):
        yield Again(opts, config, project, f"run {snap.run_id} again: {project} is as it was "
                    f"({f['commit'][:12]}{', with the same uncommitted changes' if f.get('dirty') else ''})",
                    named)
        return
    root = Path(f.get("git_root") or project)
    tmp = Path(tempfile.mkdtemp(prefix=f"forja-again-{snap.run_id}-"))
    tree = tmp / root.name
    if git(root, "worktree", "add", "--detach", str(tree), f["commit"]) is None:
        shutil.rmtree(tmp, ignore_errors=True)
        raise errors.ConfigError("--again", f"commit {f['commit'][:12]} of run {snap.run_id} is not in "
                                 f"{root} any more (rebased or pruned?); check it out and send the run "
                                 "yourself")
    try:
        if snap.patch is not None:
            done = subprocess.run(["git", "-C", str(tree), "apply", "--binary", str(snap.patch)],
                                  capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise errors.ConfigError("--again", f"the run's uncommitted changes ({snap.patch}) do not "
                                         f"apply to {f['commit'][:12]}: {done.stderr.strip()[:300]}")
        sub = project.resolve().relative_to(root.resolve()) if project.resolve() != root.resolve() else Path()
        changes = " with its uncommitted changes" if snap.patch else ""
        _WORKTREES[tree.resolve()] = root
        yield Again(opts, config, tree / sub, f"run {snap.run_id} again: {project} differs from the run's "
                    f"code, so its commit {f['commit'][:12]}{changes} is sent from a temporary worktree "
                    f"({tree}); your own tree is untouched", named)
    finally:
        _WORKTREES.pop(tree.resolve(), None)
        git(root, "worktree", "remove", "--force", str(tree))
        shutil.rmtree(tmp, ignore_errors=True)
