"""Waiting for the other tasks of a multi-worker cluster, before TensorFlow does.

``tf.distribute.MultiWorkerMirroredStrategy()`` blocks inside TensorFlow's C++ runtime
until every task of ``TF_CONFIG``'s cluster has connected: with a peer that never
starts it waits with no log line, and TensorFlow's preemption notifier takes
``SIGTERM``, so neither a scheduler nor ``timeout`` can stop it. :func:`wait_for_peers`
runs first, in Python: it listens on this task's own port (so that peers waiting in
turn see it up), logs which tasks it waits for, and returns once every other
coordinated task (``chief`` and ``worker``) accepts a connection at its address; after
``timeout`` seconds it raises :class:`ClusterTimeoutError` naming the tasks that never
started, and ``SIGTERM`` or ``SIGINT`` during the wait raise
:class:`ClusterWaitInterrupted` (``python -m metalearn.train`` exits with 143 or 130).

Every task that waits keeps its port open until it has seen all the others, then hands
the port to TensorFlow's server, so tasks that start at different times all get through.
This module imports no TensorFlow.
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import threading
import time
from typing import Dict, Iterator, List, Mapping, Tuple

from absl import logging

COORDINATED_JOBS = ("chief", "worker")
"""The jobs whose tasks take part in the collectives (and in TensorFlow's wait)."""


class ClusterTimeoutError(TimeoutError):
    """Some tasks of the cluster did not start within the wait's limit."""


class ClusterWaitInterrupted(Exception):
    """``SIGTERM`` or ``SIGINT`` arrived while waiting for the cluster.

    Attributes:
      signal_number: the signal.
    """

    def __init__(self, signal_number: int, waiting_for: str):
        self.signal_number = signal_number
        super().__init__(f"stopped by {signal.Signals(signal_number).name} while waiting "
                         f"for {waiting_for} (nothing was trained or saved)")


def _address(text: str) -> Tuple[str, int]:
    host, _, port = str(text).rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"TF_CONFIG: cluster address {text!r} is not 'host:port'")
    return host.strip("[]"), int(port)


def cluster_tasks(tf_config: Mapping) -> Tuple[Tuple[str, int], Dict[Tuple[str, int], str]]:
    """This task, ``(type, index)``, and every coordinated task's address by
    ``(type, index)``, from a parsed ``TF_CONFIG``.

    Raises:
      ValueError: ``TF_CONFIG`` lacks its cluster or task, or names a task that its
        cluster does not hold; the message shows what it holds.
    """
    cluster, task = tf_config.get("cluster"), tf_config.get("task")
    if not isinstance(cluster, Mapping) or not cluster:
        raise ValueError(f"TF_CONFIG has no 'cluster' of jobs: {json.dumps(tf_config)[:300]}")
    if not isinstance(task, Mapping) or "type" not in task or "index" not in task:
        raise ValueError("TF_CONFIG has no 'task' {'type': ..., 'index': ...} saying which "
                         f"task this process is: {json.dumps(tf_config)[:300]}")
    me = (str(task["type"]), task["index"])
    jobs = {job: list(addresses) for job, addresses in cluster.items()}
    if me[0] not in jobs or not isinstance(me[1], int) or not 0 <= me[1] < len(jobs[me[0]]):
        raise ValueError(f"TF_CONFIG task {{'type': {me[0]!r}, 'index': {me[1]!r}}} is not in "
                         f"its cluster, which holds " + ", ".join(
                             f"{job} 0..{len(a) - 1}" for job, a in jobs.items()))
    tasks = {(job, index): address for job, addresses in jobs.items()
             if job in COORDINATED_JOBS for index, address in enumerate(addresses)}
    for address in tasks.values():
        _address(address)
    return me, tasks


@contextlib.contextmanager
def _signals_stop(waiting_for) -> Iterator[None]:
    """``SIGTERM``/``SIGINT`` raise :class:`ClusterWaitInterrupted` (main thread)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(number, frame):
        raise ClusterWaitInterrupted(number, waiting_for())

    previous = {n: signal.signal(n, stop) for n in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def _listen(port: int, me: str) -> socket.socket:
    try:
        return socket.create_server(("", port), backlog=64)
    except OSError as error:
        raise OSError(f"TF_CONFIG gives this task ({me}) port {port}, which cannot be "
                      f"opened on this machine ({error}): another process holds it, or the "
                      "address is not this machine's") from error


def _up(address: str) -> bool:
    try:
        with socket.create_connection(_address(address), timeout=1.0):
            return True
    except OSError:
        return False


def wait_for_peers(tf_config: Mapping, timeout: float = 600.0, poll: float = 0.2,
                   log_every: float = 30.0) -> None:
    """Returns once every other coordinated task of ``tf_config``'s cluster accepts a
    connection at its address, keeping this task's port open meanwhile.

    Args:
      tf_config: the parsed ``TF_CONFIG``.
      timeout: seconds to wait before giving up (``make_strategy.peer_timeout``).
      poll: seconds between tries.
      log_every: seconds between the "still waiting" log lines.

    Raises:
      ClusterTimeoutError: a task did not start in time; the message names each.
      ClusterWaitInterrupted: ``SIGTERM`` or ``SIGINT`` during the wait.
      ValueError, OSError: ``TF_CONFIG`` is malformed, or this task's port is taken.
    """
    me, tasks = cluster_tasks(tf_config)
    name = lambda task: f"{task[0]} {task[1]} at {tasks[task]}"
    if me not in tasks:  # an evaluator: not part of the collectives
        return
    pending: List[Tuple[str, int]] = [t for t in sorted(tasks) if t != me]
    if not pending:
        return
    listener = _listen(_address(tasks[me])[1], f"{me[0]} {me[1]}")
    start = last_log = time.monotonic()
    shown = lambda: ", ".join(name(t) for t in pending)
    logging.info("multi_worker: %s %d waits for %d other task(s) of the cluster to start: "
                 "%s (gives up after %.0f s: make_strategy.peer_timeout)", me[0], me[1],
                 len(pending), shown(), timeout)
    try:
        with _signals_stop(lambda: shown()):
            while True:
                pending = [t for t in pending if not _up(tasks[t])]
                if not pending:
                    break
                waited = time.monotonic() - start
                if waited >= timeout:
                    raise ClusterTimeoutError(
                        f"multi_worker: after {waited:.0f} s, {shown()} never started (no "
                        "process accepts connections there). Start every task of "
                        "TF_CONFIG's cluster, check the addresses, or raise "
                        "make_strategy.peer_timeout")
                if time.monotonic() - last_log >= log_every:
                    last_log = time.monotonic()
                    logging.info("multi_worker: still waiting after %.0f s of %.0f for %s",
                                 waited, timeout, shown())
                time.sleep(poll)
    finally:
        listener.close()  # TensorFlow's server takes the port next
    logging.info("multi_worker: every task of the cluster is up after %.1f s",
                 time.monotonic() - start)
