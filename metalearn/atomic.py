"""Atomic file writes: a reader sees the old file or the whole new one, never part of one.

The one writer of every file metalearn writes and later reads back or hands to a person
(run files through :mod:`metalearn.runs.files`, data caches, report figures): the bytes
go to a temporary file in the same directory, are flushed to disk and renamed over the
target (``os.replace``, atomic on POSIX), so a process killed at any moment leaves the
previous file or the complete new one. A write that fails (a full disk, a lost
permission) removes its temporary file and raises ``OSError`` of the same ``errno``,
its message naming the file and the reason.
"""

from __future__ import annotations

import errno
import os
import tempfile
from typing import Union


def named(error: OSError, path: str, after: str = "") -> OSError:
    """``error`` again (the same ``errno``, so the same ``OSError`` subclass), its
    message naming ``path`` and the reason, then ``after``."""
    reason = error.strerror or str(error)
    return OSError(error.errno or errno.EIO, f"cannot write {path!r}: {reason}{after}")


def write_unnamed(path: str, data: Union[str, bytes]) -> None:
    """Writes ``data`` (text or bytes) to ``path`` atomically; a failure raises the
    system's ``OSError`` as it came (for a caller that names the file its own way)."""
    directory = os.path.dirname(os.path.abspath(path))
    handle, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp",
                                   dir=directory)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # as open() would create it, not mkstemp's 0600
        mode = "wb" if isinstance(data, bytes) else "w"
        with os.fdopen(handle, mode, **({} if mode == "wb" else {"newline": ""})) as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def write(path: str, data: Union[str, bytes]) -> None:
    """Writes ``data`` (text or bytes) to ``path`` atomically (temporary file, fsync,
    rename).

    Raises:
      OSError: the file cannot be written (a full disk, no permission); the message
        names ``path`` and the reason, the ``errno`` is the system's. The previous
        file, if any, is left as it was, and no temporary file is left behind.
    """
    try:
        write_unnamed(path, data)
    except OSError as error:
        raise named(error, path) from error
