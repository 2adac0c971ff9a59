"""A user's own modules (outer rules, learners, heads, data), imported before gin parses.

A research file ``my_rule.py`` whose classes are ``@gin.configurable`` must be imported
before a gin file that binds them is parsed. Every entry point takes it as
``--module=path/to/my_rule.py`` (or a dotted name, ``--module=my_package.my_rule``;
repeatable), and :func:`metalearn.runs.experiment.parse_config` as ``modules=``: it
imports each (:func:`import_modules`) before gin parses, and remembers them as part of
the config being parsed (:func:`current`). ``train`` writes them into the workdir
(``modules.json``, files as absolute paths), and ``parse_config(workdir=...)`` imports
the recorded ones first: ``restore``, ``python -m metalearn.evaluate`` and a sweep's
run processes find the run's classes with no flag of their own.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
from typing import Dict, List, Sequence

import gin

from metalearn.runs.files import read_json, write_text
from metalearn.runs.workdir import Workdir


_LOADED: Dict[str, str] = {}  # absolute file path -> module name
_CURRENT: List[str] = []


class ModuleImportError(ImportError):
    """A ``--module`` file does not exist, or importing it (or a dotted name) failed."""


def _describe(error: BaseException) -> str:
    """An import's error for the message; ``sys.exit`` named as such (``SystemExit`` is
    no ``Exception``: let through, a ``train`` would exit 0 having trained nothing)."""
    if isinstance(error, SystemExit):
        return (f"it called sys.exit({error.code!r}) on import (a script's main code "
                "outside `if __name__ == '__main__':`?); a module must only define")
    return f"{type(error).__name__}: {error}"


def _is_file(spec: str) -> bool:
    return spec.endswith(".py") or os.sep in spec or "/" in spec


def canonical(spec: str) -> str:
    """A module spec as it is recorded: a file as its absolute path, a dotted name as
    given."""
    spec = spec.strip()
    return os.path.abspath(os.path.expanduser(spec)) if _is_file(spec) else spec


def _import_file(path: str) -> None:
    if path in _LOADED:  # once per process: its configurables register with gin once
        return
    if not os.path.isfile(path):
        raise ModuleImportError(f"module file {path!r} does not exist (--module, or "
                                f"modules= of parse_config; working directory "
                                f"{os.getcwd()!r})")
    name = os.path.splitext(os.path.basename(path))[0]
    existing = sys.modules.get(name)
    if existing is not None and os.path.abspath(getattr(existing, "__file__", "") or "") \
            == path:  # imported already, e.g. by the user's script
        _LOADED[path] = name
        return
    if existing is not None:
        raise ModuleImportError(f"module file {path!r}: a module named {name!r} is already "
                                f"imported (from {getattr(existing, '__file__', None)!r}); "
                                "rename the file")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    folder = os.path.dirname(path)
    if folder not in sys.path:  # its sibling files import as they would from a script
        sys.path.append(folder)
    sys.modules[name] = module
    try:
        with gin.unlock_config():
            spec.loader.exec_module(module)
    except (Exception, SystemExit) as error:  # noqa: BLE001  (re-raised, naming the file)
        del sys.modules[name]
        raise ModuleImportError(f"importing module file {path!r} failed: "
                                f"{_describe(error)}") from error
    _LOADED[path] = name


def import_modules(specs: Sequence[str]) -> List[str]:
    """Imports each module (a ``.py`` file path, or a dotted module name), once per
    process, so that its ``@gin.configurable`` classes are registered.

    Returns:
      The specs as recorded (:func:`canonical`).

    Raises:
      ModuleImportError: a file does not exist, or importing a file or a name failed
        (an exception, or ``sys.exit`` called on import); the message names it (the
        import's own error is chained).
    """
    done = []
    for spec in specs:
        spec = canonical(spec)
        if not spec:
            continue
        if _is_file(spec):
            _import_file(spec)
        else:
            try:
                with gin.unlock_config():
                    importlib.import_module(spec)
            except (Exception, SystemExit) as error:  # noqa: BLE001  (re-raised, naming it)
                raise ModuleImportError(f"importing module {spec!r} failed: "
                                        f"{_describe(error)}") from error
        if spec not in done:
            done.append(spec)
    return done


def use(specs: Sequence[str]) -> None:
    """Sets the modules of the config being parsed (what :func:`current` returns)."""
    _CURRENT[:] = list(specs)


def current() -> List[str]:
    """The modules of the config last parsed by ``parse_config``."""
    return list(_CURRENT)


def recorded(workdir: str) -> List[str]:
    """The modules a run's workdir records (``modules.json``; none without it)."""
    path = Workdir(workdir).modules
    if not os.path.isfile(path):
        return []
    saved = read_json(path, "a list of module files and names")
    if not isinstance(saved, list) or not all(isinstance(s, str) for s in saved):
        raise ValueError(f"{path} is not a list of module files and names: {saved!r}")
    return saved


def write_record(workdir: str) -> None:
    """Adds :func:`current` to ``workdir/modules.json`` (the modules recorded before
    are kept: a run resumed without its ``--module`` still records it); no file when
    there are none."""
    before = recorded(workdir)
    modules = before + [m for m in current() if m not in before]
    if modules != before:
        write_text(Workdir(workdir).modules, json.dumps(modules, indent=2))
