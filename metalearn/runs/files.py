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
