"""Keeps TensorFlow's GPU probe out of the entry points' output on machines without one.

Importing TensorFlow 2.21 on a machine without CUDA prints, before TensorFlow's own
logging starts, ``Could not find cuda drivers on your machine, GPU will not be used``
(twice, each after a line about ``absl::InitializeLog()``), and its first look for
devices logs ``E0000 ... failed call to cuInit``. ``TF_CPP_MIN_LOG_LEVEL`` does not
remove the first (it is printed before the level is read) and removes the second only
at level 3, which hides every C++ error TensorFlow logs. So when a command line of
metalearn (``python -m metalearn.<entry point>``) starts, ``import metalearn`` imports
TensorFlow and lists its GPUs with the process's standard error captured, and writes
back every captured line except those of :data:`PROBE_NOISE`: the probe's lines go,
anything else TensorFlow says then stays. A script that imports metalearn itself is
left as it is (the probe would fix which GPUs it sees before the script could choose).
Nothing here imports TensorFlow at module level.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from typing import Iterable, List, Optional, Sequence

PROBE_NOISE = re.compile(
    r"All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|cudart_stub\.cc:\d+\] Could not find cuda drivers on your machine"
    r"|cuda_platform\.cc:\d+\] failed call to cuInit"
    r"|cuda_executor\.cc:\d+\] .*(?:kernel driver does not appear to be running|"
    r"could not find a device)"
    r"|cuda_diagnostics\.cc:\d+\]")
"""The lines TensorFlow prints when it looks for a GPU that is not there (and nothing
else: a line that does not match is written back)."""


def without_probe_noise(lines: Iterable[str]) -> List[str]:
    """``lines`` less those of :data:`PROBE_NOISE`."""
    return [line for line in lines if not PROBE_NOISE.search(line)]


def is_entry_point(argv: Optional[Sequence[str]] = None) -> bool:
    """Whether this process is ``python -m metalearn.<something>`` (``argv``: the
    interpreter's own command line, ``sys.orig_argv``)."""
    argv = list(getattr(sys, "orig_argv", []) if argv is None else argv)
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg == "-m":
            return i + 1 < len(argv) and argv[i + 1].startswith("metalearn.")
        if arg.startswith("-m"):  # -mmetalearn.train
            return arg[2:].startswith("metalearn.")
        if arg.startswith("-c") or not arg.startswith("-"):  # a command, a script
            return False
        i += 2 if arg in _OPTIONS_WITH_A_VALUE else 1
    return False


_OPTIONS_WITH_A_VALUE = ("-X", "-W", "--check-hash-based-pycs")


def import_tensorflow_quietly() -> None:
    """Imports TensorFlow and lists its GPUs (the probe) with file descriptor 2
    captured, then writes the captured lines back less :data:`PROBE_NOISE`. A no-op
    when TensorFlow is imported already; a plain import where standard error cannot
    be captured."""
    if "tensorflow" in sys.modules:
        return
    try:
        sys.stderr.flush()
        capture = tempfile.TemporaryFile()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):
        import tensorflow  # noqa: F401
        return
    try:
        os.dup2(capture.fileno(), 2)
        import tensorflow as tf
        tf.config.list_physical_devices("GPU")  # cuInit, inside the capture
    finally:  # also when the import fails: what it printed is written back
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        capture.seek(0)
        text = capture.read().decode("utf-8", "replace")
        capture.close()
        kept = "".join(without_probe_noise(text.splitlines(keepends=True)))
        if kept:
            sys.stderr.write(kept)
            sys.stderr.flush()
