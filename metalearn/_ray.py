"""Ray, the optional extra (``pip install 'metalearn[ray]'``), joined the one way every
part that runs work on it does (sweeps' runs, the Gymnasium collector's simulators)."""

from __future__ import annotations

import os
from typing import Any, Tuple

from metalearn import repository


def require(what: str) -> Any:
    """The ``ray`` module.

    Raises:
      ImportError: Ray is not installed (naming ``what``, the part asking, and the extra).
    """
    try:
        import ray
    except ImportError as error:
        raise ImportError(f"{what} needs Ray: pip install 'metalearn[ray]'") from error
    return ray


def connect(address: str, what: str) -> Tuple[Any, bool]:
    """Ray, joined to the cluster at ``address`` unless this process has joined one
    already: ``"auto"`` (the cluster this machine belongs to), ``"host:6379"``, or
    ``"local"`` (a new instance on this machine). Its workers import this package from
    where this process does (``PYTHONPATH`` gets :data:`metalearn.repository.ROOT`
    first, then this process's own).

    Args:
      address: as above.
      what: the part asking, for the error when Ray is not installed.

    Returns:
      ``(ray, started)``: the module, and whether this call joined (the caller then
      calls ``ray.shutdown()`` when done).

    Raises:
      ImportError: Ray is not installed (naming ``what`` and the extra).
    """
    ray = require(what)
    started = not ray.is_initialized()
    if started:
        path = os.pathsep.join(p for p in (repository.ROOT, os.environ.get("PYTHONPATH"))
                               if p)
        ray.init(address=address, runtime_env={"env_vars": {"PYTHONPATH": path}},
                 log_to_driver=False)
    return ray, started
