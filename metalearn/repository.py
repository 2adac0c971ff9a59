"""Where the repository is: the one place that computes it from this package's path,
and relative paths resolved against it rather than the working directory.

``ROOT`` is the folder that holds the ``metalearn`` package: the repository root in a
checkout (or an editable install), ``site-packages`` in a plain install, where
``experiments/`` is then absent.

The shipped gin files name their data relative to the repository root
(``load_omniglot.path = '../shared/data/omniglot'``) and include each other by their
path from the root (``include 'experiments/setups/omniglot.gin'``). From the root as
working directory these resolve as written; from anywhere else:

* the data loaders pass their folder through :func:`data_path`: a relative path not
  found from the working directory is taken from the repository root;
* gin's includes find the root through the search path ``metalearn.configurables``
  adds;
* a sweep records its gin files with :func:`portable` and reads them back with
  :func:`from_repository`, so that its records resolve whatever the working directory.
"""

from __future__ import annotations

import os
from typing import Dict, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
"""The folder holding the ``metalearn`` package (the repository root in a checkout)."""

EXPERIMENTS_DIR = os.path.join(ROOT, "experiments")
"""The shipped gin files (``experiments/<task family>/<method>.gin``, built from ``experiments/setups/``, ``learners/`` and ``budgets/``)."""


def has_experiments() -> bool:
    """Whether :data:`ROOT` holds the shipped ``experiments/`` (a checkout)."""
    return os.path.isdir(EXPERIMENTS_DIR)


def data_path(path: Optional[str]) -> Optional[str]:
    """A data folder or file as a loader reads it: an absolute path, or a relative one
    that exists from the working directory, as given; a relative path that does not is
    taken from the repository root when it exists there (the shipped configs' paths,
    e.g. ``'../shared/data/omniglot'``, name folders beside the checkout); otherwise
    as given (the loader's error names it). ``None`` stays ``None``."""
    if path is None:
        return None
    path = os.fspath(path)
    if os.path.isabs(path) or os.path.exists(path):
        return path
    candidate = os.path.normpath(os.path.join(ROOT, path))
    return candidate if os.path.exists(candidate) else path


def portable(path: str) -> str:
    """``path`` as a record keeps it: relative to the repository root when it lies in
    the repository (the record then holds wherever the checkout is), else absolute."""
    absolute = os.path.abspath(path)
    relative = os.path.relpath(absolute, ROOT)
    if relative == os.pardir or relative.startswith(os.pardir + os.sep):
        return absolute
    return relative


def from_repository(path: str) -> str:
    """A path :func:`portable` wrote, back as an absolute path: a relative one is
    relative to the repository root, whatever the working directory (a record
    written before records were portable, relative to its working directory, is
    still read from the working directory when the repository lacks it)."""
    if os.path.isabs(path):
        return path
    candidate = os.path.join(ROOT, path)
    if not os.path.exists(candidate) and os.path.exists(path):
        return os.path.abspath(path)
    return candidate


# --- gin files that moved ----------------------------------------------------------

_IMAGE_SETUPS = ("mini_imagenet", "tiered_imagenet", "cifar_fs", "fc100", "cub")

MOVED_GIN_FILES: Dict[str, str] = {
    "experiments/omniglot/base.gin": "experiments/setups/omniglot_common.gin",
    "experiments/omniglot/full.gin": "experiments/setups/omniglot.gin",
    "experiments/omniglot/minimal/base.gin": "experiments/setups/omniglot_minimal.gin",
    **{f"experiments/{name}/base.gin": f"experiments/setups/{name}.gin"
       for name in _IMAGE_SETUPS},
    "experiments/meta_dataset/base.gin": "experiments/setups/meta_dataset.gin",
    "experiments/resnet12.gin": "experiments/setups/resnet12.gin",
    **{f"experiments/{name}/smoke.gin": "experiments/budgets/smoke.gin"
       for name in _IMAGE_SETUPS + ("meta_dataset",)},
}
"""Gin files of ``experiments/`` that moved (old path -> new path, both from the
repository root): CHANGELOG.md's table "Experiments: where the gin files went", as data
(tests/moved_gin_files_test.py keeps the two in step). :func:`moved_gin_file` reads it
wherever a gin file is looked up (``--gin_file``, an ``include`` line)."""

_MOVED_NOTES: Dict[str, str] = {
    **{f"experiments/setups/{name}.gin": "its shared part is "
       "experiments/setups/image_classification.gin" for name in _IMAGE_SETUPS},
    "experiments/setups/resnet12.gin": "RFS's backbone is "
    "experiments/setups/resnet12_rfs.gin",
}


class MovedGinFileError(FileNotFoundError):
    """A gin file is missing because it moved (:data:`MOVED_GIN_FILES`); the message
    names the new path."""


def moved_gin_file(path: str) -> Optional[str]:
    """Where the gin file ``path`` went, if it is one of :data:`MOVED_GIN_FILES` (as
    given from the repository root, under ``experiments/`` as ``--gin_file`` takes it,
    or absolute inside this checkout): a sentence naming the new path, else ``None``."""
    path = os.path.normpath(os.fspath(path))
    if os.path.isabs(path):
        path = os.path.relpath(path, ROOT)
    for old in (path, os.path.join("experiments", path)):
        new = MOVED_GIN_FILES.get(old.replace(os.sep, "/"))
        if new is not None:
            note = _MOVED_NOTES.get(new)
            return (f"{old} moved to {new}{f' ({note})' if note else ''}: give "
                    f"--gin_file={new}, or include '{new}' (CHANGELOG.md, \"Experiments: "
                    "where the gin files went\")")
    return None
