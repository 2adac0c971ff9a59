"""Where the repository is: the one place that computes it from this package's path.

``ROOT`` is the folder that holds the ``metalearn`` package: the repository root in a
checkout (or an editable install), ``site-packages`` in a plain install, where
``experiments/`` is then absent.
"""

from __future__ import annotations

import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
"""The folder holding the ``metalearn`` package (the repository root in a checkout)."""

EXPERIMENTS_DIR = os.path.join(ROOT, "experiments")
"""The shipped gin files (``experiments/<task family>/<method>.gin``)."""


def has_experiments() -> bool:
    """Whether :data:`ROOT` holds the shipped ``experiments/`` (a checkout)."""
    return os.path.isdir(EXPERIMENTS_DIR)
