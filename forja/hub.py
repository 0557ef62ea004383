"""A run's exported model (trainer.export's ``model/`` folder) pushed to the Hugging Face Hub.

Why the controller uploads, not the VM: the token stays on the user's machine. It is never sent
to a VM that other people's code runs on, never put in Ansible variables, a unit's environment
or a journal. The VM may also be gone by then (stopped, preempted, deleted) while the model sits
on this machine after ``forja fetch`` (or in the bucket). The cost is one more hop for the bytes.

The token comes from ``--token-file`` (read here, never echoed), else ``HF_TOKEN``, else the one
``hf auth login`` saved. It is never a command-line argument, and forja never logs it. Before
anything is created, ``whoami`` says whose token it is and whether it may write at all. A
read-only token stops there with an error naming the repo and the fix. A fine-grained token
without write access to that namespace gets the Hub's 403 on its first write, reported the
same way.

Protocol: the upload uses the Hub's LFS path (preupload, LFS batch, PUT, verify, commit), the
same requests that forja_sandbox/hub_standin.py answers in the tests. huggingface_hub would use
Xet (hf_xet, chunk-level dedup) when it is installed; forja turns that off for its push unless
``HF_HUB_DISABLE_XET=0`` is set, so the path it ships is the path it tests.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from forja import errors
from forja.token_file import read_private
from trainer.export import CONFIG, WEIGHTS, ExportError, verify
from trainer.run_folder import MODEL_DIR

if TYPE_CHECKING:
    from forja.session import Session

#: The environment variable huggingface_hub itself reads for the token.
TOKEN_ENV = "HF_TOKEN"
#: Where a user creates a token with write access (the fix an access error names).
TOKENS_PAGE = "https://huggingface.co/settings/tokens"
REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}$")


@dataclass(frozen=True)
class HubPush:
    """What a push left on the Hub: the repo, its commit, the files and the model they hold."""

    repo: str
    url: str
    commit: str
    commit_url: str
    files: list[str]
    step: int
    sha256: str
    user: str


def read_token(token_file: str | Path | None = None, env: dict[str, str] | None = None) -> str:
    """The Hub token: ``token_file``'s first line, else $HF_TOKEN, else ``hf auth login``'s saved one.

    A token file readable by others is refused (chmod 600), as ssh refuses such a key.
    """
    env = dict(os.environ) if env is None else env
    if token_file is not None:
        return read_private(token_file, "token_file", "the Hub token")
    if env.get(TOKEN_ENV, "").strip():
        return env[TOKEN_ENV].strip()
    from huggingface_hub import get_token

    saved = get_token()
    if saved:
        return saved
    raise errors.ConfigError(
        "token",
        f"no Hugging Face token: set {TOKEN_ENV}, give --token-file PATH (mode 600), or run `hf auth login`; "
        f"create one with write access at {TOKENS_PAGE}",
    )


@contextlib.contextmanager
def _lfs_protocol() -> Iterator[None]:
    """huggingface_hub's LFS upload path for this push (see the module doc), unless Xet was asked for."""
    from huggingface_hub import constants

    if os.environ.get("HF_HUB_DISABLE_XET", "").strip().lower() in ("0", "false", "no", "off"):
        yield
        return
    before = constants.HF_HUB_DISABLE_XET
    constants.HF_HUB_DISABLE_XET = True
    try:
        yield
    finally:
        constants.HF_HUB_DISABLE_XET = before


def _no_write(repo: str, user: str, why: str) -> errors.ConfigError:
    return errors.ConfigError(
        "token",
        f"the Hugging Face token of {user!r} cannot write to {repo} ({why}); create a token with write "
        f"access to {repo.split('/')[0]!r} at {TOKENS_PAGE} (a 'write' token, or a fine-grained one with "
        f"'repo.write' on that namespace) and set {TOKEN_ENV} or --token-file",
    )


def push_model(
    folder: str | Path,
    repo: str,
    *,
    token: str,
    private: bool | None = None,
    endpoint: str | None = None,
    commit_message: str | None = None,
) -> HubPush:
    """Upload ``folder``'s model.safetensors and model.json to the model repo ``repo`` (made if missing).

    ``endpoint``: the Hub's URL (default ``$HF_ENDPOINT``, else https://huggingface.co).
    """
    import httpx2
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError

    if not REPO_ID.match(repo):
        raise errors.ConfigError("repo", f"{repo!r} is not a Hub repo id; use NAMESPACE/NAME (alice/digits)")
    folder = Path(folder)
    try:
        info = verify(folder)
    except ExportError as exc:
        raise errors.ConfigError("model", str(exc)) from None
    api = HfApi(endpoint=endpoint or os.environ.get("HF_ENDPOINT") or None, token=token)
    try:
        who = api.whoami()
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else None
        if status == 401:
            raise errors.ConfigError(
                "token", f"the Hub rejected the token (401: invalid or revoked); create one with write "
                f"access at {TOKENS_PAGE} and set {TOKEN_ENV} or --token-file"
            ) from None  # fmt: skip
        raise _failed(exc) from None
    except httpx2.TransportError as exc:  # the client's transport (huggingface_hub depends on it)
        raise _unreachable(api.endpoint, exc) from None
    user = str(who.get("name", "?"))
    role = str(((who.get("auth") or {}).get("accessToken") or {}).get("role", ""))
    if role == "read":
        raise _no_write(repo, user, "it is a read-only token")
    message = commit_message or f"forja: model of run {info.get('run')} at step {info.get('step')}"
    try:
        with _lfs_protocol():
            # An existing repo is not created again: a token may write to a repo without the right to
            # create one there (and huggingface_hub 2.4's create_repo cannot rebuild the URL of an
            # existing repo on any Hub but huggingface.co when the create is refused).
            if api.repo_exists(repo):
                url = f"{api.endpoint}/{repo}"
            else:
                url = str(api.create_repo(repo, private=private, exist_ok=True))
            commit = api.upload_folder(
                repo_id=repo, folder_path=folder, allow_patterns=[WEIGHTS, CONFIG], commit_message=message
            )
    except RepositoryNotFoundError:
        raise errors.ConfigError(
            "repo", f"{repo} does not exist or {user!r} cannot see it; check the name or the token"
        ) from None
    except HfHubHTTPError as exc:
        if exc.response is not None and exc.response.status_code == 403:
            raise _no_write(repo, user, f"the Hub answered 403: {_server_message(exc)}") from None
        raise _failed(exc) from None
    except httpx2.TransportError as exc:
        raise _unreachable(api.endpoint, exc) from None
    return HubPush(
        repo=repo, url=str(url), commit=commit.oid, commit_url=commit.commit_url, files=[WEIGHTS, CONFIG],
        step=int(info.get("step", 0)), sha256=str(info["sha256"]), user=user,
    )  # fmt: skip


def _server_message(exc: Any) -> str:
    """The Hub's own error text (its X-Error-Message header or JSON error), without the request URL."""
    response = exc.response
    text = response.headers.get("X-Error-Message") if response is not None else None
    if not text and response is not None:
        with contextlib.suppress(ValueError):
            text = response.json().get("error")
    return str(text or exc).strip()


def _failed(exc: Any) -> errors.ForjaError:
    status = exc.response.status_code if exc.response is not None else "no answer"
    return errors.ForjaError(f"the Hub answered {status}: {_server_message(exc)}")


def _unreachable(endpoint: str, exc: Exception) -> errors.ForjaError:
    return errors.ForjaError(f"cannot reach the Hub at {endpoint} ({type(exc).__name__}: {exc})")


def model_push(
    session: Session,
    run: str,
    repo: str,
    token_file: str | Path | None = None,
    private: bool | None = None,
    folder: str | Path | None = None,
    endpoint: str | None = None,
) -> HubPush:
    """Push a run's exported model (model.safetensors + model.json) to a Hugging Face Hub model repo.

    The model is the one `forja fetch RUN` (or `forja train`) brought to this machine, in the run's
    results (`model/`), or the folder given. This machine uploads it, not the VM: the token never
    leaves it. The token is read from --token-file (mode 600), else HF_TOKEN, else the one `hf auth
    login` saved; never from the command line, never logged. The repo is created when missing
    (--private makes a new one private). A token that cannot write to the repo is an error naming
    the repo and how to get one that can, before anything is uploaded when the Hub says so up front.
    The Hub is HF_ENDPOINT when set (a stand-in for tests: forja_sandbox/hub_standin.py).
    """
    where = Path(folder).expanduser() if folder is not None else model_folder(session, run)
    return push_model(where, repo, token=read_token(token_file), private=private, endpoint=endpoint)

def model_folder(session: Session, run: str) -> Path:
    """The exported model in a run's fetched results: the folder the history recorded (the rank-0
    host's), else the default results folder's host subfolders (as `fetch` lays them out)."""
    places: list[Path] = []
    with contextlib.suppress(errors.RunNotFound):
        recorded = session.history.find(run).artifact_dir
        if recorded:
            places.append(Path(recorded))
    places.append(session.results_dir(run))
    for place in places:
        _, host_dir = session.read_results(run, place)
        for candidate in (place, host_dir):
            if candidate is not None and (candidate / MODEL_DIR / CONFIG).is_file():
                return candidate / MODEL_DIR
    if not any(place.is_dir() for place in places):
        raise errors.RunNotFound(
            f"no results of run {run!r} on this machine (looked in {', '.join(map(str, places))}); "
            f"fetch them with `forja fetch {run}`"
        )
    raise errors.ConfigError(
        "run", f"{run} has no exported model in its results ({', '.join(map(str, places))}): the run "
        "did not complete, or export_model was off (export it on the host: python -m trainer export "
        f"RUN_DIR), then `forja fetch {run}`"
    )  # fmt: skip
