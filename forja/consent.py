"""Consent before upload: say what will leave this machine, and ask when a person is there.

Why: `forja train` sends a project and `forja data push` a dataset to a cloud; a user should see
what goes (files, total size) and what stays behind and why (an exclude pattern, a key found in a
file) before it goes, as SimpleTuner's cloud training asks (issue 29, from seed 004).

The setting `forja_upload_consent` lives where the user's other forja settings do: the inventory's
variables (`group_vars/all/*.yml`, as `notify_webhook` and the bucket; `forja init` writes there), or
`-e forja_upload_consent=...` for one command:

- ``ask`` (the default): ask when a person is at a terminal; without one (a script, CI) the
  summary is printed and the upload goes on, as before this setting existed. `--yes` skips the
  question, and so does a run that sends nothing of the user's (a built-in config);
- ``always``: print the summary and send, never ask;
- ``never``: refuse every upload (nothing is sent; `--yes` does not override it).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from forja import errors, host_contract, module_utils

if TYPE_CHECKING:
    from forja.session import Session

#: The setting's name (an inventory variable or an -e) and its values, the default first.
SETTING = "forja_upload_consent"
VALUES = ("ask", "always", "never")
#: How many left-out paths the summary names (the rest are counted).
SHOWN = 10


@dataclass(frozen=True)
class Outgoing:
    """What an upload will send (`files`, `size` in bytes) from `folder`, and what it leaves out:
    `left_out` maps a path to why (a pattern it matched, a symlink), `keys` a path to the kind of
    key its content is."""

    what: str
    folder: str
    files: int
    size: int
    left_out: dict[str, str] = field(default_factory=dict)
    keys: dict[str, str] = field(default_factory=dict)
    #: What is sent, by its top-level name: a file, or a folder ("src/") with its file count.
    sent: dict[str, int] = field(default_factory=dict)
    #: False when all of it is forja's own (a built-in config): said, not asked about.
    yours: bool = True

    def describe(self) -> str:
        """The summary people read before they say yes: one line, then what stays behind and why."""
        files = f"{self.files} file{'' if self.files == 1 else 's'}"
        lines = [f"{self.what}: {files}, {_bundle().human(self.size)} from {self.folder}"]
        if self.sent:
            shown = [name if count == 1 and not name.endswith("/") else f"{name} ({count} files)"
                     for name, count in sorted(self.sent.items())[:SHOWN]]
            more = f", and {len(self.sent) - SHOWN} more" if len(self.sent) > SHOWN else ""
            lines.append(f"  sent: {', '.join(shown)}{more}")
        if self.keys:
            lines.append(f"  never sent, {len(self.keys)} holding keys:")
            lines += [f"    {path}: {kind}" for path, kind in sorted(self.keys.items())]
        others = {p: why for p, why in self.left_out.items() if p not in self.keys}
        if others:
            lines.append(f"  left out, {len(others)}:")
            lines += [f"    {path}: {why}" for path, why in sorted(others.items())[:SHOWN]]
            if len(others) > SHOWN:
                lines.append(f"    ... and {len(others) - SHOWN} more")
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return {"what": self.what, "folder": self.folder, "files": self.files, "bytes": self.size,
                "sent": self.sent, "left_out": self.left_out, "keys": self.keys}


def _bundle() -> Any:
    """forja_bundle.py (its sibling forja_files.py first), loaded by path as forja loads module_utils."""
    module_utils.load("forja_files")
    return module_utils.load("forja_bundle")


def survey(folder: Path, excludes: Sequence[str], what: str) -> Outgoing:
    """What sending `folder` sends: the host contract's send_excludes plus `excludes`, and the
    content check for keys (forja_files, the walk the bundle and the dataset push make)."""
    files_mod = module_utils.load("forja_files")
    found = files_mod.walk(str(folder), [*host_contract.value("send_excludes"), *excludes], True)
    sent: dict[str, int] = {}
    for item in found.files:
        top, sep, _ = item.rel.partition("/")
        sent[top + sep] = sent.get(top + sep, 0) + 1
    return Outgoing(what, str(folder), len(found.files), sum(f.size for f in found.files),
                    dict(found.why), {p: found.why[p].removeprefix("its content is ") for p in found.secrets},
                    sent)


def for_run(project: Path | None, excludes: Sequence[str], config: Path) -> Outgoing:
    """What `forja train` sends besides forja's own trainer: the project, else the config alone."""
    from forja.project import TRAINER_DIR

    if project is not None:
        return survey(project, excludes, "the project")
    built_in = TRAINER_DIR in config.resolve().parents
    return Outgoing("the built-in config (no project: the trainer carries it)" if built_in else
                    "the config alone (no project: --project sends one)", str(config), 1,
                    config.stat().st_size, yours=not built_in)


def setting(session: Session) -> str:
    """`forja_upload_consent`: an -e, else the inventory's (any host's), else "ask". A value that is
    not one of VALUES is a ConfigError naming the field and the three values, before anything is sent."""
    value: Any = session.extravars.get(SETTING)
    if value is None and session.inventory:
        sources = session.inventory if isinstance(session.inventory, list) else [session.inventory]
        value = _inventory_setting(tuple(sources))
    if value is None:
        return VALUES[0]
    if value not in VALUES:
        raise errors.ConfigError(
            SETTING, f"{value!r} is not one of {', '.join(VALUES)} (ask: ask at a terminal; always: send "
            "without asking; never: refuse every upload); set it in the inventory's group_vars/all")
    return str(value)


@functools.lru_cache(maxsize=8)
def _inventory_setting(sources: tuple[str, ...]) -> Any:
    """The inventory's forja_upload_consent (any host's), read once per process: `forja train` asks
    before its progress display and checks again as it sends, and each read is an ansible-inventory."""
    from forja import inventory

    try:
        hosts = inventory.hosts(list(sources), "all")
    except errors.ForjaError:
        return None
    return next((h.vars[SETTING] for h in hosts if SETTING in h.vars), None)


def obtain(
    session: Session, outgoing: Outgoing | Callable[[], Outgoing], *, yes: bool = False,
    ask: Callable[[str], bool] | None = None, say: Callable[[str], None] | None = None,
) -> None:
    """Say what will be sent (`say`), then let it go or stop it before anything is sent.

    `ask` is the question put to a person (None: nobody is there to answer, as in a script or CI,
    and `ask` then means "go on"). Raises ConfigError when the setting is `never` (or not one of
    VALUES), and errors.Cancelled when the person says no.

    `outgoing` may be the survey still to make (`lambda: for_run(...)`): it is made only when
    something is said, asked or refused. So a caller that asked already (`ask_once`, then `yes` and
    no `say`, as `forja train` does before its progress display) sends without walking the project
    a second time.
    """
    chosen = setting(session)
    if callable(outgoing) and (chosen == "never" or say is not None
                               or not (chosen == "always" or yes or ask is None)):
        outgoing = outgoing()
    if not isinstance(outgoing, Outgoing):  # not needed: nothing is said, asked or refused
        return
    if chosen == "never":
        raise errors.ConfigError(
            SETTING, f"is never: forja sends no upload from this machine ({outgoing.what}: {outgoing.files} "
            "files). Nothing was sent; set it to ask or always in the inventory to allow uploads")
    if say is not None:
        say(outgoing.describe())
    if chosen == "always" or yes or ask is None or not outgoing.yours:
        return
    if not ask(f"Send {outgoing.what}?"):
        raise errors.Cancelled("you said no; nothing was sent (--yes sends without asking)")


def ask_once(
    session: Session, project: str | Path | None, config: str | Path | None, script: str | Path | None,
    excludes: Sequence[str], *, yes: bool = False, ask: Callable[[str], bool] | None = None,
    say: Callable[[str], None] | None = None,
) -> None:
    """`obtain` for a run sent later by someone else (the managed watcher, which sends the run again
    unattended after a preemption): the same project `train` will send, asked about now, once."""
    folder = session.project_folder(project, config, script)
    anchor = Path(config or script or ".").expanduser()
    if folder is None and not anchor.is_file():
        return  # train's own check says what is wrong with the config
    obtain(session, for_run(folder, excludes, anchor), yes=yes, ask=ask, say=say)
