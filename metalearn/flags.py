"""Flags shared by the absl entry points (gin's conventional flag names), and the
constants their flags take (:data:`STRATEGIES`, :data:`EXPORT_FORMATS`,
:data:`SEED_KEY`): an entry point defines its flags from this module and absl only, so
that ``--help`` and flag errors import nothing heavy (no TensorFlow).

An entry point calls :func:`define_gin_flags` (and :func:`define_determinism_flag`) at
import; the flags they define belong to that entry point, as if it had defined them
itself: ``python -m metalearn.train --help`` lists them beside the entry point's own
(absl's ``--help`` shows the main module's key flags; this module disclaims the flags
it defines, so they are key to its caller).
"""

from __future__ import annotations

import os
from typing import Any, Callable, List, Sequence

from absl import flags

from metalearn.repository import EXPERIMENTS_DIR, ROOT, MovedGinFileError, moved_gin_file

# The flags defined below are the calling entry point's: defined by it and key to it,
# so that its --help (not only --helpfull) lists them.
flags.disclaim_key_flags()

STRATEGIES = ("default", "mirrored", "multi_worker")
"""The tf.distribute strategies by name: ``--strategy``'s choices and the names
:func:`metalearn.training.distribute.make_strategy` accepts."""

EXPORT_FORMATS = ("saved_model", "litert", "onnx")
"""``python -m metalearn.export --format``'s choices (:data:`metalearn.serving.FORMATS`):
only ``saved_model`` is written so far; the others are refused as not supported yet."""

SEED_KEY = "Runtime.seed"
"""The binding a report averages over (``--seed_key``'s default,
:func:`metalearn.studies.results.summarise`'s)."""

GIN_FILE_HELP = ("Gin config files, parsed in order. A relative path is looked up as gin "
                 "looks up an include: from the working directory, then from the "
                 "repository root (so --gin_file=experiments/sinusoid/maml.gin works from "
                 "any directory), then under experiments/")


def define_once(define: Callable[..., Any], name: str, *args: Any, **kwargs: Any) -> None:
    """``define(name, *args, **kwargs)`` (an absl ``flags.DEFINE_*``) for the calling
    entry point, or, where another entry point imported in this process defined a flag
    of that name already (a test or a notebook calling ``metalearn.evaluate.run`` and
    ``metalearn.export.run``), that flag declared key to the caller too: absl refuses a
    second definition from another module. A process run as one entry point defines
    each of its flags itself."""
    if name in flags.FLAGS:
        flags.declare_key_flag(name)
    else:
        define(name, *args, **kwargs)


def define_gin_flags() -> None:
    """Defines ``--gin_file``, ``--gin_param`` and ``--module`` for the calling entry
    point (key flags of it: its ``--help`` lists them)."""
    define_once(flags.DEFINE_multi_string, "gin_file", [], GIN_FILE_HELP)
    define_once(flags.DEFINE_multi_string, "gin_param", [],
                "Gin bindings applied after the files, "
                "e.g. --gin_param='Loop.num_steps=100'.")
    define_once(flags.DEFINE_multi_string, "module", [],
                "A module of your own to import before gin "
                "parses, so that its @gin.configurable classes can be "
                "bound: a file (--module=path/to/my_rule.py) or a dotted "
                "name (--module=my_package.my_rule); repeatable. Recorded "
                "in the workdir (modules.json); a workdir is data: "
                "restore, evaluation, resuming and a sweep's runs import "
                "what it records only when given here again (or with "
                "--trust_workdir).")
    define_once(flags.DEFINE_bool, "trust_workdir", False,
                "Import whatever the workdir names (its "
                "modules.json, the import lines of its config.gin) without giving "
                "each as --module: only for a workdir you trust, as you would a "
                "script.")


def define_determinism_flag() -> None:
    """Defines ``--deterministic`` for the calling entry point (a key flag of it)."""
    define_once(flags.DEFINE_bool, "deterministic", False,
                "Turn on TensorFlow's op determinism and "
                "seed every generator from Runtime.seed (the binding "
                "Runtime.deterministic=True, recorded in config.gin): the same "
                "config and seed then give the same weights and metrics on the "
                "same machine.")


def determinism_params(deterministic: bool) -> List[str]:
    """The gin binding the ``--deterministic`` flag adds (none when it is off)."""
    return ["Runtime.deterministic = True"] if deterministic else []


def gin_file_candidates(path: str) -> List[str]:
    """Where :func:`resolve_gin_files` looks for ``path``, in order: as given (from the
    working directory), from the repository root (where gin's ``include`` looks next:
    ``metalearn.configurables`` adds the root to gin's search path), then under
    ``experiments/`` (``--gin_file=sinusoid/maml.gin``). An absolute path: itself."""
    if os.path.isabs(path):
        return [path]
    candidates = [path, os.path.join(ROOT, path), os.path.join(EXPERIMENTS_DIR, path)]
    return [c for i, c in enumerate(candidates) if c not in candidates[:i]]


def resolve_gin_files(paths: Sequence[str]) -> List[str]:
    """Each path where it is first found among :func:`gin_file_candidates`, so that a
    ``--gin_file`` resolves as the files' own ``include`` lines do, from any working
    directory.

    Raises:
      MovedGinFileError: a path is in none of the places and is one of the gin files
        that moved (:data:`metalearn.repository.MOVED_GIN_FILES`); the message names
        the new path. A ``FileNotFoundError``.
      FileNotFoundError: a path is in none of the places; the message lists them.
    """
    resolved = []
    for path in paths:
        candidates = gin_file_candidates(os.fspath(path))
        found = next((c for c in candidates if os.path.isfile(c)), None)
        if found is None:
            moved = moved_gin_file(os.fspath(path))
            if moved is not None:
                raise MovedGinFileError(f"gin file {path!r} not found: {moved} (looked in "
                                        f"{candidates})")
            raise FileNotFoundError(f"gin file {path!r} not found (looked in {candidates})")
        resolved.append(found)
    return resolved
