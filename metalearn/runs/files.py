"""Atomic writes: a reader sees the old file or the whole new one, never part of one.

Every file a run writes and later reads back (``config.gin``, ``operative_config.gin``,
``metrics.json``, evaluation and sweep JSON, report CSVs and tables) goes through
:func:`write_text` (:func:`metalearn.atomic.write`): the text is written to a temporary
file in the same directory, flushed to disk, and renamed over the target (``os.replace``,
atomic on POSIX), so a process killed at any moment leaves either the previous file
or the complete new one (and at worst a stray ``.<name>.*.tmp``). Checkpoints are TensorFlow's (see
:func:`metalearn.training.loop.train`).

A write that fails (a full disk, a lost permission) raises ``OSError`` of the same
``errno`` whose message names the file and the reason. Results, the figures a run took
hours to compute, go through :func:`write_results`: *results first, then the file* —
the figures are logged before the file is written, and a failed write logs the file's
whole text too, so nothing computed is lost to it.
"""

from __future__ import annotations

import errno
import json
import os
import tempfile
from typing import Any, Optional

from absl import logging

from metalearn import atomic
from metalearn.runs.workdir import Workdir


def write_text(path: str, text: str) -> None:
    """Writes ``text`` to ``path`` atomically (temporary file, fsync, rename):
    :func:`metalearn.atomic.write`.

    Raises:
      OSError: the file cannot be written (a full disk, no permission); the message
        names ``path`` and the reason, the ``errno`` is the system's. The previous
        file, if any, is left as it was.
    """
    atomic.write(path, text)


def write_json(path: str, value: Any) -> None:
    """``value`` as indented JSON with sorted keys, written atomically."""
    write_text(path, json.dumps(value, indent=2, sort_keys=True))


def write_results(path: str, text: str, figures: Optional[str],
                  what: str = "results") -> None:
    """Results first, then the file: logs ``figures`` (the results in a line or a
    table), then writes ``text`` to ``path`` atomically (:func:`write_text`). What every
    entry point that writes results (evaluation reports, final metrics, report tables)
    writes them with.

    Args:
      path: the results file.
      text: its whole content.
      figures: the results as a person reads them, logged before anything is written
        (``None``: the caller logged them already, e.g. before its first file).
      what: what the results are, for the log and the error (``"evaluation"``).

    Raises:
      OSError: the file cannot be written (its ``errno`` the system's); the message
        names ``path`` and the reason and says that the figures were logged. The
        file's whole text is logged (at error level) first, so nothing is lost.
    """
    if figures is not None:
        logging.info("%s (to be written to %s):\n%s", what, path, figures)
    try:
        atomic.write_unnamed(path, text)
    except OSError as error:
        logging.error("could not write %s (%s); its whole content follows:\n%s", path,
                      error.strerror or error, text)
        raise atomic.named(error, path, f"; nothing is lost: the {what} figures were logged "
                     "before the write, and the file's whole content just before this "
                     "error: copy them from the log, or free space (or fix the "
                     "permission) and run again") from error


def write_json_results(path: str, value: Any, figures: Optional[str],
                       what: str = "results") -> None:
    """:func:`write_results` of ``value`` as indented JSON with sorted keys."""
    write_results(path, json.dumps(value, indent=2, sort_keys=True), figures, what)


MIN_FREE_BYTES = 1 << 20
"""Free bytes :func:`check_writable` wants on an output's disk: an empty file can be
created on a full disk, so creating one alone does not show that results fit."""


def _free_bytes(directory: str):
    """Bytes an unprivileged process may still write on ``directory``'s file system
    (``None`` where the system does not say, or the file system counts no blocks, as
    some network and FUSE ones do)."""
    try:
        found = os.statvfs(directory)
    except (AttributeError, OSError):
        return None
    return found.f_bavail * found.f_frsize if found.f_blocks else None


def check_writable(path: str) -> str:
    """Makes sure ``path`` can be written before the work whose result it will hold:
    creates its folder if missing, and writes and removes a temporary file there.

    Returns:
      ``path``, absolute.

    Raises:
      ValueError: ``path`` is a folder.
      PermissionError, OSError: the folder cannot be created or written, or its disk
        has less than :data:`MIN_FREE_BYTES` free (``errno.ENOSPC``); the message
        names it.
    """
    path = os.path.abspath(path)
    if os.path.isdir(path):
        raise ValueError(f"output {path!r} is a folder: give a file name, e.g. "
                         f"{Workdir(path).evaluation()!r}")
    directory = os.path.dirname(path)
    try:
        os.makedirs(directory, exist_ok=True)
        handle, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp",
                                       dir=directory)
        os.close(handle)
        os.remove(tmp)
        free = _free_bytes(directory)
        if free is not None and free < MIN_FREE_BYTES:
            raise OSError(errno.ENOSPC, f"No space left on device ({free} bytes free, "
                          f"fewer than {MIN_FREE_BYTES})")
    except OSError as error:
        message = (f"cannot write the output {path!r}: {error.strerror or error} "
                   f"(folder {directory!r}); nothing was run")
        # the same errno, so the same OSError subclass (PermissionError, ...)
        raise (OSError(error.errno, message) if error.errno else type(error)(message)) \
            from error
    return path


def check_version_folder(directory: str, version: int = 1, overwrite: bool = False
                         ) -> str:
    """The version folder ``directory/<version>`` (TensorFlow Serving's layout) that an
    export writes, checked before any work: ``version`` a positive integer, and the
    folder absent or empty unless ``overwrite``. Needs no TensorFlow.

    Raises:
      ValueError: ``version`` below 1 (or not a whole number).
      FileExistsError: a non-empty version folder, or a file there (naming it).
    """
    if isinstance(version, bool) or int(version) != version or version < 1:
        raise ValueError(f"version must be a positive integer (TensorFlow Serving's "
                         f"folder name), got {version!r}")
    path = os.path.join(directory, str(int(version)))
    if os.path.exists(path) and not os.path.isdir(path):
        raise FileExistsError(f"{path} is a file, not a version folder")
    if os.path.isdir(path) and os.listdir(path) and not overwrite:
        raise FileExistsError(f"{path} exists and is not empty: give another version, or "
                              "overwrite=True (--overwrite) to replace it")
    return path


def read_json(path: str, what: str = "JSON") -> Any:
    """The JSON value in ``path``; a file that is not JSON (truncated, binary, hand
    edited) raises ``ValueError`` naming it and saying what it should hold (``what``)."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path} is not valid JSON ({error}); expected {what}: "
                         "rewrite it (the run that wrote it can), or move it away") from None
