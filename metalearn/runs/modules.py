"""A user's own modules (outer rules, learners, heads, data), imported before gin parses.

A research file ``my_rule.py`` whose classes are ``@gin.configurable`` must be imported
before a gin file that binds them is parsed. Every entry point takes it as
``--module=path/to/my_rule.py`` (or a dotted name, ``--module=my_package.my_rule``;
repeatable), and :func:`metalearn.runs.experiment.parse_config` as ``modules=``: it
imports each (:func:`import_modules`) before gin parses, and remembers them as part of
the config being parsed (:func:`current`). ``train`` writes them into the workdir
(``modules.json``, files as absolute paths). A workdir is data: ``parse_config(
workdir=...)`` (``restore``, ``python -m metalearn.evaluate``, a resumed ``train``, a
sweep's run processes) imports a recorded module only if the user gives it again
(``--module``) or trusts the workdir (``--trust_workdir``), and so for the gin
``import`` lines of its saved config (:func:`allowed`); otherwise
:class:`UntrustedModulesError` lists them, and nothing is imported.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
from typing import Dict, List, Optional, Sequence

import gin

from metalearn.runs.files import read_json, write_text
from metalearn.runs.workdir import Workdir


_LOADED: Dict[str, str] = {}  # absolute file path -> module name
_CURRENT: List[str] = []


class ModuleImportError(ImportError):
    """A ``--module`` file does not exist, or importing it (or a dotted name) failed."""


class UntrustedModulesError(ModuleImportError):
    """A workdir names modules (``modules.json``, ``import`` lines of its config) that the
    user did not ask for: a workdir is data, and nothing it names is imported unless
    given on the command line (``--module``) or trusted (``--trust_workdir``)."""


def _trusted_import(module: str, given: Sequence[str]) -> bool:
    """Whether a gin ``import`` line of a workdir's config may run: the library itself,
    gin's own, a module imported already (importing it runs nothing), or one the user
    named (``--module``)."""
    top = module.split(".")[0]
    return (top in ("metalearn", "__gin__") or module in sys.modules
            or module in given or any(module.startswith(g + ".") for g in given))


def allowed(workdir: str, given: Sequence[str] = (), trust: bool = False,
            config: Optional[str] = None, config_name: Optional[str] = None) -> List[str]:
    """The modules ``workdir`` records (``modules.json``), once each is one the user
    asked for: a workdir is data (docs/errors.md, "Untrusted files").

    Args:
      given: the user's modules (``--module``, ``modules=``): a recorded one among them
        (by its recorded spelling: a file by absolute path) is allowed.
      trust: allow whatever the workdir names (``--trust_workdir``).
      config: the workdir's config text about to be parsed (its ``config.gin``, or the
        checkpoint's copy); its gin ``import`` lines follow the same rule.
      config_name: that config's file, for the message.

    Returns:
      The recorded modules, to import.

    Raises:
      UntrustedModulesError: listing each module the workdir names and the user did not
        give, and how to allow them; nothing is imported.
    """
    records = recorded(workdir)
    if trust:
        return records
    given = {canonical(g) for g in given if g.strip()}
    refused = [m for m in records if canonical(m) not in given]
    lines = []
    if config is not None:
        from metalearn.runs import gin_text  # the one reader of gin text
        for statement in gin_text.statements(config, config_name):
            if isinstance(statement, gin_text.config_parser.ImportStatement) and \
                    not _trusted_import(statement.module, given):
                lines.append(statement)
    if not refused and not lines:
        return records
    named = [f"{m} (in {Workdir(workdir).modules})" for m in refused] + [
        f"{s.module} (an import line of {config_name or 'the saved config'}, line "
        f"{s.location.line_num})" for s in lines]
    flags = " ".join(f"--module={m}" for m in refused + [s.module for s in lines])
    raise UntrustedModulesError(
        f"workdir {workdir!r} names code to import: {'; '.join(named)}. A workdir is data: "
        "nothing it names is imported unless you ask for it. If you trust it, give each "
        f"on the command line ({flags}; modules=[...] from Python), or pass "
        "--trust_workdir (trust_workdir=True) to import whatever it names")


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


def check_files(specs: Sequence[str]) -> None:
    """Raises :class:`ModuleImportError` naming the first module file among ``specs``
    (``--module``) that does not exist; dotted names are not looked up. An entry point
    calls it before it imports TensorFlow, so that a typo is told in a second."""
    for spec in specs:
        path = canonical(spec)
        if path and _is_file(path) and path not in _LOADED and not os.path.isfile(path):
            raise ModuleImportError(f"module file {path!r} does not exist (--module, or "
                                    f"modules= of parse_config; working directory "
                                    f"{os.getcwd()!r})")


def _import_file(path: str) -> None:
    if path in _LOADED:  # once per process: its configurables register with gin once
        return
    check_files([path])
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
