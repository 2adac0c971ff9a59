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
from typing import Optional

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
