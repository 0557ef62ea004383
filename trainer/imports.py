"""Resolve what a config names in the user's code: ``package.module:attr`` or ``./file.py:attr``.

Why file paths too: a researcher's model is usually a file next to their notebook, not an installed
package. A file is loaded as a top-level module named after the file, with its folder first on
``sys.path``, exactly as ``python my_model.py`` would see it: its sibling imports work, and DataLoader
workers started by spawn/forkserver can import it again by name. Relative paths are looked up in
``project_dir`` (default: the project forja sent, ``FORJA_PROJECT_DIR``, then the current folder,
then the folders on ``PYTHONPATH``).

Errors name the config key. A path that does not resolve is a :class:`ConfigError` (exit 2); a file
that is found but raises while importing is a :class:`UserCodeError` (exit 4): both are for the
user to fix, and a restart cannot help.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from trainer.config import ConfigError
from trainer.errors import UserCodeError, user_code


def is_file_spec(module_part: str) -> bool:
    """``./net.py``, ``models/net.py`` or ``/abs/net.py`` rather than ``package.module``."""
    return module_part.endswith(".py") or "/" in module_part or os.sep in module_part


def search_dirs(project_dir: str | None) -> list[Path]:
    """Where a relative file path is looked up, in order: ``project_dir``, else the project forja
    sent (``FORJA_PROJECT_DIR`` of the run contract), the current folder and ``PYTHONPATH``."""
    if project_dir:
        return [Path(os.path.expanduser(project_dir))]
    from trainer.runlib import Contract

    try:
        sent = Contract.from_env().project_dir
    except ValueError:  # a malformed contract variable is the launcher's to report, not ours
        sent = None
    extra = [Path(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return [*([sent] if sent else []), Path.cwd(), *extra]


def find_file(module_part: str, key: str, project_dir: str | None) -> Path:
    """The file a spec names; ConfigError(key) listing where it looked when it is not there."""
    raw = Path(os.path.expanduser(module_part))
    candidates = [raw] if raw.is_absolute() else [folder / raw for folder in search_dirs(project_dir)]
    for candidate in candidates:
        if candidate.is_file():
            return candidate.resolve()
    looked = ", ".join(str(c.parent.resolve()) for c in candidates)
    raise ConfigError(
        [f"{key}: no file {module_part!r} (looked in {looked}; set project_dir or give an absolute path)"]
    )


def import_file(path: Path, key: str) -> ModuleType:
    """Import ``path`` as the top-level module named after it, its folder first on sys.path."""
    name = path.stem
    if not name.isidentifier():
        raise ConfigError([f"{key}: {path.name!r} is not an importable module name (rename the file)"])
    if name not in sys.modules:  # ./datasets.py must not hide the installed `datasets` from everyone
        try:
            other = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            other = None
        origin = other.origin if other is not None else None
        if origin is not None and (not os.path.isfile(origin) or Path(origin).resolve() != path):
            raise ConfigError(
                [f"{key}: {path.name} would hide the module {name!r} ({origin}); rename the file"]
            )
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    loaded = sys.modules.get(name)
    if loaded is not None:
        origin = getattr(loaded, "__file__", None)
        if origin and Path(origin).resolve() == path:
            return loaded
        raise ConfigError(
            [
                f"{key}: {path} would be imported as {name!r}, but the module {name!r} is already "
                f"loaded from {origin or 'the interpreter'} (rename the file)"
            ]
        )
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ConfigError([f"{key}: {path} cannot be loaded as Python"])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:
        del sys.modules[name]
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            raise
        raise UserCodeError(f"{key}: importing {path} raised {type(exc).__name__}: {exc}") from exc
    return module


def import_module(module_name: str, key: str) -> ModuleType:
    """``importlib.import_module`` with a missing module told apart from a module that fails."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if module_name == missing or module_name.startswith(missing + "."):
            raise ConfigError(
                [f"{key}: cannot import module {module_name!r} ({exc}); check the path, or install it"]
            ) from None
        raise UserCodeError(
            f"{key}: importing {module_name!r} failed: {exc} (install it, or list it in requirements.txt)"
        ) from exc
    except Exception as exc:
        raise UserCodeError(f"{key}: importing {module_name!r} raised {type(exc).__name__}: {exc}") from exc


def load_object(spec: str, key: str, project_dir: str | None = None) -> Any:
    """The object ``spec`` names (``package.module:attr`` or ``path/file.py:attr``; attr may be dotted)."""
    module_part, sep, attr = spec.rpartition(":")
    if not sep or not module_part or not attr:
        raise ConfigError([f"{key}: must be 'package.module:name' or './file.py:name' (got {spec!r})"])
    if is_file_spec(module_part):
        module = import_file(find_file(module_part, key, project_dir), key)
    else:
        module = import_module(module_part, key)
    target: Any = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise ConfigError([f"{key}: module {module_part!r} has no attribute {attr!r} (check the name)"])
        target = getattr(target, part)
    return target


def load_callable(path: str, key: str, project_dir: str | None = None) -> Callable[..., Any]:
    """Like :func:`load_object`, and the object must be callable (a function or a class)."""
    target = load_object(path, key, project_dir)
    if not callable(target):
        raise ConfigError([f"{key}: {path!r} is not callable (point it at a function or class)"])
    return target


def check_arguments(target: Callable[..., Any], args: Mapping[str, Any], key: str, *leading: Any) -> None:
    """ConfigError naming ``key`` when ``target(*leading, **args)`` cannot bind (before it runs)."""
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):  # builtins without a signature: let the call speak
        return
    try:
        signature.bind(*leading, **args)
    except TypeError as exc:
        takes = ", ".join(
            name
            for name, p in signature.parameters.items()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        )
        name = getattr(target, "__qualname__", repr(target))
        raise ConfigError([f"{key}: {name}() {exc} (it takes: {takes or 'no keyword arguments'})"]) from None


def build(
    spec: str,
    key: str,
    args: Mapping[str, Any],
    args_key: str,
    project_dir: str | None = None,
) -> Callable[..., Any]:
    """A callable from a spec plus arguments: a class is instantiated with them, a function gets them bound.

    So ``loss: torch.nn:CrossEntropyLoss`` and ``loss: torch.nn.functional:cross_entropy`` both work,
    as do ``collate: transformers:DataCollatorWithPadding``-style classes and plain functions.
    """
    target = load_callable(spec, key, project_dir)
    if inspect.isclass(target):
        check_arguments(target, args, args_key)
        with user_code(key, f"{spec} with {args_key} {dict(args)}"):
            made = target(**args)
        if not callable(made):
            raise UserCodeError(f"{key}: {spec}(...) made a {type(made).__name__}, which is not callable")
        return made
    return functools.partial(target, **args) if args else target
