"""Python processes forked from a server that has already imported TensorFlow and Keras.

A test that starts ``python -m metalearn.train ...`` pays TensorFlow's import (about
4-5 CPU-seconds on the CI machine) before the first line of the run; the crash-and-
resume tests start some twenty such processes. :class:`Popen` and :func:`run` take the
arguments of ``subprocess.Popen`` and ``subprocess.run`` for ``python -m MODULE ...``,
``python -c CODE ...`` and ``python SCRIPT ...``, and fork the process from a server
(this file run as a script, one per test worker and per set of the environment
variables read at import) that imported TensorFlow and Keras and nothing of metalearn.
The child gets the command's ``argv``, environment, working folder, standard streams,
``sys.path`` (working folder or script folder, then ``PYTHONPATH``) and session, and
ends through the interpreter's own exit (``atexit`` handlers, flushed streams), as a
fresh process would: it is a real process, with its own pid, signals, resource limits
and exit status, which the tests kill, limit and wait for as any other.

What differs from a fresh interpreter, and so what tests of those things must start
real processes with ``subprocess`` (they do: the import and start-up tests, the docs'
front door run as pasted): what is imported before the program starts, the import's
time, interpreter options (``-X ...``: not forked, started with ``subprocess``), and
Python's hash seed (shared by the children of one server).
"""

import io
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List, Optional, Sequence, Tuple

# Read by TensorFlow or Keras when they are imported: a child whose environment gives
# other values than its server's would not be what a fresh process is, so each set of
# values gets its own server.
IMPORT_TIME_ENV = ("TF_CPP_MIN_LOG_LEVEL", "TF_CPP_MAX_VLOG_LEVEL", "TF_ENABLE_ONEDNN_OPTS",
                   "KERAS_BACKEND", "KERAS_HOME", "PYTHONHASHSEED")
PIPE, STDOUT, DEVNULL = subprocess.PIPE, subprocess.STDOUT, subprocess.DEVNULL


# --- the client (in the test process) ------------------------------------------------

class _Server:
    def __init__(self, env: Dict[str, str]):
        self.folder = tempfile.mkdtemp(prefix="forked_")
        self.address = os.path.join(self.folder, "socket")
        self.process = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), self.address, str(os.getpid())],
            env=env, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
        ready = self.process.stdout.readline()  # after its imports
        if ready.strip() != b"ready":
            raise RuntimeError(f"the fork server did not start: {ready!r}")

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


_SERVERS: Dict[Tuple, _Server] = {}
_LOCK = threading.Lock()


def _server(env: Dict[str, str]) -> _Server:
    key = tuple(env.get(name) for name in IMPORT_TIME_ENV)
    with _LOCK:
        if key not in _SERVERS:
            _SERVERS[key] = _Server(env)
        return _SERVERS[key]


def close_servers() -> None:
    """Ends every fork server this process started (tests/conftest.py, at the end)."""
    with _LOCK:
        while _SERVERS:
            _SERVERS.popitem()[1].close()


def _program(args: Sequence[str]) -> Optional[Tuple[str, str, List[str]]]:
    """``(kind, what, argv)`` for ``python -m/-c/SCRIPT ...``; None for anything else
    (another program, interpreter options)."""
    if not args or args[0] != sys.executable or len(args) < 2:
        return None
    if args[1] in ("-m", "-c") and len(args) > 2:
        argv = [args[1] if args[1] == "-c" else args[2], *args[3:]]
        return args[1], args[2], argv
    if args[1].startswith("-"):
        return None
    return "script", args[1], list(args[1:])


class Popen:
    """``subprocess.Popen`` for a Python command, forked from a fork server (module
    docstring); any other command is started by ``subprocess.Popen`` itself. Supports
    ``cwd``, ``env``, ``stdin``/``stdout``/``stderr`` (``PIPE``, ``STDOUT``,
    ``DEVNULL``, a file or descriptor, None), ``text`` and ``start_new_session``."""

    def __new__(cls, args, **kwargs):
        if _program(list(args)) is None:
            return subprocess.Popen(args, **kwargs)
        return super().__new__(cls)

    def __init__(self, args, cwd=None, env=None, stdin=None, stdout=None, stderr=None,
                 text=False, start_new_session=False):
        self.args = list(args)
        kind, what, argv = _program(self.args)
        env = dict(os.environ if env is None else env)
        ends, self._close_after, self.stdin, self.stdout, self.stderr = [], [], None, None, None
        for number, given in enumerate((stdin, stdout, stderr)):
            ends.append(self._end(number, given, text, ends))
        server = _server(env)
        self._status = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._status.connect(server.address)
        request = dict(kind=kind, what=what, argv=argv, env=env,
                       cwd=os.path.abspath(cwd or os.getcwd()),
                       new_session=bool(start_new_session))
        socket.send_fds(self._status, [json.dumps(request).encode() + b"\n"], ends)
        for fd in self._close_after:
            os.close(fd)
        self._lines = self._status.makefile("rb")
        self.pid = int(json.loads(self._lines.readline())["pid"])
        self.returncode: Optional[int] = None

    def _end(self, number, given, text, ends):
        """The descriptor the child gets as its stream ``number``; keeps this side's."""
        if given is None:
            return number
        if given == subprocess.DEVNULL:
            fd = os.open(os.devnull, os.O_RDWR)
            self._close_after.append(fd)
            return fd
        if given == subprocess.STDOUT:
            return ends[1]
        if given == subprocess.PIPE:
            read, write = os.pipe()
            mine, theirs = (write, read) if number == 0 else (read, write)
            self._close_after.append(theirs)
            stream = os.fdopen(mine, "wb" if number == 0 else "rb")
            if text:
                stream = io.TextIOWrapper(stream, write_through=number == 0)
            setattr(self, ("stdin", "stdout", "stderr")[number], stream)
            return theirs
        return given if isinstance(given, int) else given.fileno()

    def poll(self) -> Optional[int]:
        if self.returncode is None:
            ready, _, _ = select.select([self._status], [], [], 0)
            if ready:
                self._read_status()
        return self.returncode

    def _read_status(self):
        line = self._lines.readline()
        if not line:  # the server went away
            raise RuntimeError(f"the fork server ended before process {self.pid}")
        self.returncode = int(json.loads(line)["returncode"])
        self._lines.close()
        self._status.close()

    def wait(self, timeout: Optional[float] = None) -> int:
        if self.returncode is None:
            ready, _, _ = select.select([self._status], [], [], timeout)
            if not ready:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self._read_status()
        return self.returncode

    def communicate(self, input=None, timeout: Optional[float] = None):
        """As ``subprocess.Popen.communicate``: writes ``input``, reads the piped
        streams to their end, waits; ``TimeoutExpired`` leaves the process running."""
        deadline = None if timeout is None else time.monotonic() + timeout
        left = lambda: None if deadline is None else max(0.0, deadline - time.monotonic())
        if not hasattr(self, "_readers"):
            self._outputs: Dict[str, list] = {}
            self._readers = []
            for name in ("stdout", "stderr"):
                stream = getattr(self, name)
                if stream is not None:
                    chunks = self._outputs.setdefault(name, [])
                    reader = threading.Thread(target=lambda s=stream, c=chunks:
                                              c.append(s.read()), daemon=True)
                    reader.start()
                    self._readers.append(reader)
            if self.stdin is not None:
                if input:
                    self.stdin.write(input)
                self.stdin.close()
        for reader in self._readers:
            reader.join(left())
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(left())
        found = []
        for name in ("stdout", "stderr"):
            if name in self._outputs:
                found.append(self._outputs[name][0] if self._outputs[name] else "")
                getattr(self, name).close()
            else:
                found.append(None)
        return tuple(found)

    def send_signal(self, number: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, number)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for stream in (self.stdin, self.stdout, self.stderr):
            if stream is not None and not stream.closed:
                stream.close()
        self.wait()


def run(args, *, capture_output=False, check=False, timeout=None, input=None,
        stdout=None, stderr=None, **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run`` through :class:`Popen`."""
    if capture_output:
        stdout = stderr = PIPE
    process = Popen(args, stdin=PIPE if input is not None else None, stdout=stdout,
                    stderr=stderr, **kwargs)
    try:
        out, err = process.communicate(input, timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise
    if check and process.returncode:
        raise subprocess.CalledProcessError(process.returncode, args, out, err)
    return subprocess.CompletedProcess(args, process.returncode, out, err)


# --- the server (this file run as a script) ----------------------------------------

def _pythonpath(env) -> List[str]:
    """The entries ``PYTHONPATH`` puts after ``sys.path[0]``."""
    return [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]


def _serve(address: str, parent: int):
    """Forks a child per request; returns the request in the child, never in itself."""
    os.chdir("/")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(64)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    waiting: Dict[int, socket.socket] = {}
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    while True:
        if os.getppid() != parent:  # the test process is gone: so are its children
            os._exit(0)
        try:
            ready, _, _ = select.select([listener, wake_read], [], [], 1.0)
        except InterruptedError:
            ready = []
        if wake_read in ready:
            os.read(wake_read, 512)
        while waiting:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            connection = waiting.pop(pid)
            code = os.waitstatus_to_exitcode(status)
            try:
                connection.sendall(json.dumps({"returncode": code}).encode() + b"\n")
            except OSError:
                pass
            connection.close()
        if listener not in ready:
            continue
        connection, _ = listener.accept()
        message, fds, _, _ = socket.recv_fds(connection, 1 << 20, 3)
        while not message.endswith(b"\n"):
            more = connection.recv(1 << 20)
            if not more:
                break
            message += more
        request = json.loads(message)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: leaves the server's state behind, runs the request
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            for held in (listener, connection, *waiting.values()):
                held.close()
            os.close(wake_read)
            os.close(wake_write)
            for number, fd in enumerate(fds):
                os.dup2(fd, number)
            for fd in set(fds):
                if fd > 2:
                    os.close(fd)
            return request
        for fd in fds:
            os.close(fd)
        connection.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        waiting[pid] = connection


def _start(request) -> None:
    """Becomes the requested program, as ``python`` would start it."""
    import random
    import runpy
    if request["new_session"]:
        os.setsid()
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    random.seed()  # a fresh process draws its own
    first = {"-m": request["cwd"], "-c": "",
             "script": os.path.dirname(os.path.abspath(request["what"]))}[request["kind"]]
    sys.path[:] = [first, *_pythonpath(request["env"]), *_BASE_PATH]
    sys.argv[:] = request["argv"]
    if request["kind"] == "-m":
        runpy.run_module(request["what"], run_name="__main__", alter_sys=True)
    elif request["kind"] == "script":
        runpy.run_path(request["what"], run_name="__main__")
    else:
        import types
        main = types.ModuleType("__main__")
        sys.modules["__main__"] = main
        exec(compile(request["what"], "<string>", "exec"), main.__dict__)


if __name__ == "__main__":
    # sys.path as a fresh interpreter's, less its first entry and PYTHONPATH's
    _BASE_PATH = sys.path[1 + len(_pythonpath(os.environ)):]
    sys.path[:] = _BASE_PATH
    import keras  # noqa: F401  (TensorFlow with it)
    import tensorflow  # noqa: F401
    _start(_serve(sys.argv[1], int(sys.argv[2])))
