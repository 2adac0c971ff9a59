"""One training process per workdir: an exclusive lock held while a run trains.

The lock is ``fcntl.flock`` on ``<workdir>/.train.lock``, which the kernel releases
when the holding process ends in any way (``SIGKILL`` included): a lock left behind by
a dead process is never in force, and the next run takes it over. The file itself
holds the holder's pid, host and start time, as JSON, so that a second process can
say who holds it. (The sweep runner's ``.sweep.lock`` is another file: a sweep's run
process holds both.)
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from typing import Dict, Optional

from absl import logging

from metalearn.runs.workdir import Workdir


class WorkdirLockedError(RuntimeError):
    """Another process is training in the workdir."""


def _holder(fd: int) -> Dict[str, object]:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        text = os.read(fd, 4096).decode("utf-8", "replace")
        holder = json.loads(text) if text.strip() else {}
        return holder if isinstance(holder, dict) else {}
    except (OSError, ValueError):
        return {}


def _alive(pid: object) -> Optional[bool]:
    try:
        os.kill(int(pid), 0)
        return True
    except ProcessLookupError:
        return False
    except (PermissionError, TypeError, ValueError, OverflowError):
        return None


class WorkdirLock:
    """Holds ``<workdir>/.train.lock`` from ``acquire()`` (or ``with``) to ``release()``.

    Args:
      workdir: the run directory (created if missing).

    Raises (from ``acquire``):
      WorkdirLockedError: another process holds it; the message names its pid, host
        and start time.
    """

    def __init__(self, workdir: str):
        self.path = Workdir(workdir).train_lock
        self._fd: Optional[int] = None

    def acquire(self) -> "WorkdirLock":
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            since = holder.get("since")
            raise WorkdirLockedError(
                f"workdir {os.path.dirname(self.path)!r} is in use: process "
                f"{holder.get('pid', '?')} on host {holder.get('host', '?')!r} is "
                f"training there{' since ' + str(since) if since else ''} (it holds "
                f"{self.path}). Wait for it, stop it, or use another --workdir.") from None
        previous = _holder(fd)
        if previous.get("pid") is not None:
            here = previous.get("host") == socket.gethostname()
            state = ("no longer running" if here and _alive(previous["pid"]) is False
                     else "its lock released")
            logging.warning("taking over the stale lock of process %s on host %r (%s)",
                            previous.get("pid"), previous.get("host"), state)
        record = json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                             "since": time.strftime("%Y-%m-%d %H:%M:%S %Z")})
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, record.encode())
        os.fsync(fd)
        self._fd = fd
        return self

    def release(self) -> None:
        """Releases the lock; the file stays, emptied (removing it would race with a
        process that opened it to wait)."""
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, 0)
        except OSError:
            pass
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> "WorkdirLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def holder(workdir: str) -> Optional[Dict[str, object]]:
    """The process training in ``workdir`` (``{"pid", "host", "since"}``) as its lock
    file records it, or ``None`` if none is: the file is absent or empty (released),
    or it names a process of this host that is no longer running. Reads only: never
    takes the lock, so it cannot make a starting run fail."""
    path = Workdir(workdir).train_lock
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        record = _holder(fd)
    finally:
        os.close(fd)
    if record.get("pid") is None:
        return None
    if record.get("host") == socket.gethostname() and _alive(record["pid"]) is False:
        return None
    return record
