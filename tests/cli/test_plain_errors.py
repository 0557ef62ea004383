"""Every error reaches the user in plain words (issue 27): the real `forja` command, run as a user runs
it (a subprocess, from a folder that is not the repository), against the real-GCP inventory
(inventory/gcp_gpu.yml) with no project, with no credentials, and with a bad key, and against files
that are no forja inventory at all.

What each must say: the cause first, in the inventory's (or the key check's) own words, naming the
field and the fix and the file; exit 2, the code of every configuration error; never "task '-' failed
on -", never the `constructed` fallback's "Incorrect plugin name", never a Python traceback or the
plugin's module path; and nothing happened (no run in the history, nothing written where it ran).

No network: no project or no key stops the inventory before any request, google-auth is told not to
look for a metadata server (NO_GCE_CHECK), and HOME is empty, so no application default credentials.
Each case costs one `forja` start and at most one Ansible inventory parse (about a second), so every
verb is run once in one setup and the three setups on a few verbs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from forja import inventory
from forja.history import History

REPO = Path(__file__).resolve().parents[2]
GCP_INVENTORY = REPO / "inventory" / "gcp_gpu.yml"
FORJA = str(Path(sys.executable).with_name("forja")) if Path(sys.executable).with_name("forja").exists() \
    else (shutil.which("forja") or "forja")
DIGITS = REPO / "trainer" / "configs" / "digits.yaml"
#: How Ansible 2.19 names forja's inventory plugin in its warnings (it loaded it by path).
PLUGIN_MODULE = "ansible_collections.forja.gpu.plugins.inventory.gcp_gpu"

#: What no message may hold: the noise and the machinery this issue removed.
NEVER = ("task '-'", "failed on -", "Incorrect plugin name", "Traceback", "ansible_collections",
         "ansible-playbook exited with", "Ansible could not parse", "<class '")

#: An OAuth client secret as the Cloud console downloads it ("Create OAuth client ID"): JSON, but not a key.
CLIENT_SECRET = {"installed": {"client_id": "123-abc.apps.googleusercontent.com", "project_id": "my-project",
                               "auth_uri": "https://accounts.google.com/o/oauth2/auth",
                               "token_uri": "https://oauth2.googleapis.com/token",
                               "client_secret": "GOCSPX-x", "redirect_uris": ["http://localhost"]}}

#: Every verb that reads the inventory or runs a play, with what it needs to get that far.
VERBS_ON_THE_INVENTORY = {
    "up": ["up"],
    "configure": ["configure"],
    "down": ["down"],
    "train": ["train", str(DIGITS)],
    "watch": ["watch", "r1", "--fallback-zone", "us-east1-b"],
    "follow": ["follow", "r1"],
    "status": ["status"],
    "status NAME": ["status", "r1"],
    "logs": ["logs", "r1"],
    "fetch": ["fetch", "r1"],
    "stop": ["stop", "r1"],
    "runs --sync": ["runs", "--sync"],
    "tunnel": ["tunnel"],
    "cost": ["cost"],
    "data push": ["data", "push", "DATASET"],
}


def forja(tmp_path: Path, args: list[str], env: dict[str, str] | None = None,
          inventory_file: Path | None = GCP_INVENTORY) -> subprocess.CompletedProcess[str]:
    """`forja -i INVENTORY ARGS` from an empty folder, with an empty HOME and nothing of Google's set."""
    work, home, forja_home = tmp_path / "work", tmp_path / "home", tmp_path / "forja-home"
    for folder in (work, home, forja_home):
        folder.mkdir(exist_ok=True)
    dataset = tmp_path / "dataset"
    dataset.mkdir(exist_ok=True)
    (dataset / "a.txt").write_text("a\n")
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("FORJA_", "GOOGLE_", "CLOUDSDK_", "GCE_")) and k != "ANSIBLE_INVENTORY"}
    clean.update(HOME=str(home), FORJA_HOME=str(forja_home), NO_GCE_CHECK="true", COLUMNS="400",
                 **(env or {}))
    inv = ["-i", str(inventory_file)] if inventory_file is not None else []
    args = [str(dataset) if a == "DATASET" else a for a in args]
    return subprocess.run([FORJA, *inv, *args], cwd=work, env=clean, capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL, check=False)


def said_plainly(done: subprocess.CompletedProcess[str], *wanted: str) -> str:
    """The error line, after checking the exit code, the words wanted and none of NEVER."""
    text = done.stderr + done.stdout
    assert done.returncode == 2, f"exit {done.returncode}: {text}"
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, text
    for word in wanted:
        assert word in errors[0], f"{word!r} not in: {errors[0]}"
    for noise in NEVER:
        assert noise not in text, f"{noise!r} in: {text}"
    return errors[0]


def nothing_happened(tmp_path: Path) -> None:
    """No run recorded, nothing written where the command ran (no forja-runs/)."""
    history = tmp_path / "forja-home" / "history.sqlite"
    if history.exists():
        assert History(history).list() == [], "a run was recorded"
    assert list((tmp_path / "work").iterdir()) == [], "something was written where forja ran"


def bad_key(tmp_path: Path, kind: str) -> str:
    key = tmp_path / ("client_secret.json" if kind == "client secret" else "key.txt")
    key.write_text(json.dumps(CLIENT_SECRET) if kind == "client secret" else "not a key at all\n")
    return str(key)


# -- (a) no project: every verb -------------------------------------------------------------------
@pytest.mark.parametrize("verb", list(VERBS_ON_THE_INVENTORY))
def test_every_verb_without_a_project_says_so_and_the_fix(tmp_path: Path, verb: str) -> None:
    done = forja(tmp_path, VERBS_ON_THE_INVENTORY[verb])
    said_plainly(done, f"inventory {GCP_INVENTORY}: projects: no project given", "FORJA_GCP_PROJECT")
    nothing_happened(tmp_path)


# -- (b) a project, no credentials; (c) a project and a bad key: a few verbs ----------------------------
SETUPS = {
    "no credentials": ({}, ("credentials: none found", "FORJA_GCP_CREDENTIALS_FILE",
                            "gcloud auth application-default login", "project 'my-project'")),
    "client secret": ({"FORJA_GCP_CREDENTIALS_FILE": "client secret"},
                      ("credentials_file: ", "is an OAuth client secret", "not a service-account key",
                       "Service accounts > Keys", "FORJA_GCP_CREDENTIALS_FILE")),
    "not JSON": ({"FORJA_GCP_CREDENTIALS_FILE": "not JSON"},
                 ("credentials_file: ", "is not JSON", "Service accounts > Keys")),
}


@pytest.mark.parametrize("verb", ["up", "cost"])  # a play's parse, and forja's own read of the inventory
@pytest.mark.parametrize("setup", list(SETUPS))
def test_a_project_without_a_usable_key_names_the_key_and_the_fix(tmp_path: Path, setup: str,
                                                                   verb: str) -> None:
    env, wanted = SETUPS[setup]
    env = {k: bad_key(tmp_path, v) for k, v in env.items()}
    done = forja(tmp_path, [verb], {"FORJA_GCP_PROJECT": "my-project", **env})
    said_plainly(done, f"inventory {GCP_INVENTORY}: ", *wanted)
    nothing_happened(tmp_path)


@pytest.mark.parametrize("setup", list(SETUPS))
def test_json_says_the_same_as_one_document(tmp_path: Path, setup: str) -> None:
    env, wanted = SETUPS[setup]
    env = {k: bad_key(tmp_path, v) for k, v in env.items()}
    done = forja(tmp_path, ["--json", "up"], {"FORJA_GCP_PROJECT": "my-project", **env})
    assert done.returncode == 2, done.stderr + done.stdout
    error = json.loads(done.stdout)
    assert error["error"] == "ConfigError" and error["field"] == "inventory", error
    assert error["source"] == str(GCP_INVENTORY), error
    for word in wanted:
        assert word in error["message"], error
    for noise in NEVER:
        assert noise not in done.stdout + done.stderr
    nothing_happened(tmp_path)


@pytest.mark.parametrize("setup", list(SETUPS))
def test_vertex_names_a_missing_or_bad_key_with_the_same_exit_code(tmp_path: Path, setup: str) -> None:
    """Vertex AI reads no inventory, but its key is the same user input: exit 2, the key check's words."""
    env, wanted = SETUPS[setup]
    env = {k: bad_key(tmp_path, v) for k, v in env.items()}
    done = forja(tmp_path, ["vertex", "cancel", "r1"], {"FORJA_GCP_PROJECT": "my-project", **env})
    said_plainly(done, *[w for w in wanted if w != "project 'my-project'"])
    nothing_happened(tmp_path)


# -- files that are no forja inventory ----------------------------------------------------------------
NOT_FORJA = {
    "another plugin's config": (
        "aws_ec2.yml", "plugin: amazon.aws.aws_ec2\nregions: [us-east-1]\n",
        "it configures the inventory plugin 'amazon.aws.aws_ec2', which is not installed"),
    "a YAML list": ("hosts.yml", "- gpu-a\n- gpu-b\n", "it is a YAML list, not an inventory"),
    "a YAML of no groups": ("settings.yml", "project: my-project\nzone: us-east1-d\n",
                            "'project' is not a group"),
    "an OAuth client secret": ("client_secret.json", json.dumps(CLIENT_SECRET),
                               "it is an OAuth client secret"),
}


@pytest.mark.parametrize("case", list(NOT_FORJA))
def test_a_file_that_is_no_forja_inventory_says_so_and_names_forjas(tmp_path: Path, case: str) -> None:
    name, text, why = NOT_FORJA[case]
    source = tmp_path / name
    source.write_text(text)
    done = forja(tmp_path, ["up"], {"FORJA_GCP_PROJECT": "my-project"}, inventory_file=source)
    said_plainly(done, f"inventory {source}: not a forja inventory: {why}", "inventory/gcp_gpu.yml",
                 "inventory/sandbox", "forja init")
    nothing_happened(tmp_path)


def test_a_gcp_gpu_config_under_another_name_is_told_to_rename_it(tmp_path: Path) -> None:
    source = tmp_path / "mine.yml"
    source.write_text("plugin: forja.gpu.gcp_gpu\nprojects: [my-project]\n")
    done = forja(tmp_path, ["status"], inventory_file=source)
    said_plainly(done, f"inventory {source}: ", "reads only files named *gcp_gpu.yml", "mine.gcp_gpu.yml")
    nothing_happened(tmp_path)


def test_a_misspelt_option_of_forja_s_plugin_is_named_once_with_the_right_one(tmp_path: Path) -> None:
    source = tmp_path / "my.gcp_gpu.yml"
    source.write_text("plugin: forja.gpu.gcp_gpu\nprojects: [my-project]\nzone: [us-east1-d]\n")
    error = said_plainly(forja(tmp_path, ["status"], inventory_file=source),
                         "'zone' is not an option of forja.gpu.gcp_gpu; did you mean 'zones'?")
    assert error.count(str(source)) == 1, error
    nothing_happened(tmp_path)


# -- the reader of Ansible's words, without Ansible ---------------------------------------------------
def test_the_cause_is_the_plugin_that_owns_the_file_not_the_fallbacks() -> None:
    """What a play's output tail holds (every plugin's reason, joined): forja's plugin speaks; the
    `yaml`, `ini` and `constructed` plugins' "not my kind of file" is dropped."""
    source = str(GCP_INVENTORY)
    failed = "Failed to parse inventory with"
    said = (f"[ERROR]: Completely failed to parse inventory source {source} "
            f"{failed} '{PLUGIN_MODULE}' plugin: projects: no project given; set FORJA_GCP_PROJECT "
            f"{failed} 'yaml' plugin: Plugin configuration YAML file, not YAML inventory "
            f"{failed} 'ini' plugin: Failed to parse inventory: Invalid host pattern '---' "
            "supplied, '---' is normally a sign this is a YAML file. "
            f"{failed} 'auto' plugin: projects: no project given; set FORJA_GCP_PROJECT "
            f"{failed} 'constructed' plugin: Incorrect plugin name in file: forja.gpu.gcp_gpu")
    error = inventory.unparsed(said)
    assert error is not None
    assert error.message == f"inventory {source}: projects: no project given; set FORJA_GCP_PROJECT"
    assert (error.field, error.source, error.exit_code) == ("inventory", source, 2)


def test_stderr_of_ansible_inventory_reads_the_same() -> None:
    """ansible-inventory's stderr (2.19): one line per reason, then its `<<< caused by >>>` block."""
    source = str(GCP_INVENTORY)
    said = (f"[WARNING]: Failed to parse inventory with '{PLUGIN_MODULE}' plugin: credentials: none found. "
            "Set FORJA_GCP_CREDENTIALS_FILE (while listing the VMs of project 'p')\n\n"
            f"Failed to parse inventory with '{PLUGIN_MODULE}' plugin.\n\n<<< caused by >>>\n\n"
            "credentials: none found.\nOrigin: <inventory plugin "
            f"'{PLUGIN_MODULE}' with source '{source}'>\n\n"
            "[WARNING]: Failed to parse inventory with 'constructed' plugin: Incorrect plugin name in file: "
            f"forja.gpu.gcp_gpu\n[ERROR]: Completely failed to parse inventory source {source}\n")
    error = inventory.unparsed(said)
    assert error is not None
    assert error.message == (f"inventory {source}: credentials: none found. Set FORJA_GCP_CREDENTIALS_FILE "
                             "(while listing the VMs of project 'p')")
