"""Atomic writes: a reader sees the old file or the whole new one, never part of one.

Every file a run writes and later reads back (``config.gin``, ``operative_config.gin``,
``metrics.json``, evaluation and sweep JSON, report CSVs and tables) goes through
:func:`write_text`: the text is written to a temporary file in the same directory,
flushed to disk, and renamed over the target (``os.replace``, atomic on POSIX), so a
process killed at any moment leaves either the previous file or the complete new one
(and at worst a stray ``.<name>.*.tmp``). Checkpoints are TensorFlow's (see
:func:`metalearn.training.loop.train`).
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

from metalearn.runs.workdir import Workdir


def write_text(path: str, text: str) -> None:
    """Writes ``text`` to ``path`` atomically (temporary file, fsync, rename)."""
    directory = os.path.dirname(os.path.abspath(path))
    handle, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp",
                                   dir=directory)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # as open() would create it, not mkstemp's 0600
        with os.fdopen(handle, "w", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def write_json(path: str, value: Any) -> None:
    """``value`` as indented JSON with sorted keys, written atomically."""
    write_text(path, json.dumps(value, indent=2, sort_keys=True))


def check_writable(path: str) -> str:
    """Makes sure ``path`` can be written before the work whose result it will hold:
    creates its folder if missing, and writes and removes a temporary file there.

    Returns:
      ``path``, absolute.

    Raises:
      ValueError: ``path`` is a folder.
      PermissionError, OSError: the folder cannot be created or written; the message
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
    except OSError as error:
        raise type(error)(f"cannot write the output {path!r}: {error.strerror or error} "
                          f"(folder {directory!r}); nothing was run") from error
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
