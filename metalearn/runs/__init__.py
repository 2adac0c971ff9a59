"""Run management below training: the experiment a config builds, the workdir and the
one table of its file names (``workdir.py``), the one reader of gin text
(``gin_text.py``), checks before any work, files written atomically, the workdir lock
and the cluster wait. Sweeps and results are above training, in
:mod:`metalearn.studies`."""

_MOVED = {"sweeps": "metalearn.studies.sweeps", "results": "metalearn.studies.results"}


def __getattr__(name: str):
    """``from metalearn.runs import sweeps`` (or ``results``): an error naming where it
    moved (CHANGELOG.md, "Migration"), instead of a bare "cannot import name"."""
    if name in _MOVED:
        raise ImportError(f"metalearn.runs.{name} moved to {_MOVED[name]} (sweeps and "
                          f"results are above training now): from metalearn.studies "
                          f"import {name}")
    raise AttributeError(f"module 'metalearn.runs' has no attribute {name!r}")
