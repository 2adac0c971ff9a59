"""--strategy=multi_worker when a peer never starts: the wait is logged, limited by
make_strategy.peer_timeout, and SIGTERM stops it (issue 18). Fake TF_CONFIGs on
loopback; each case ends in seconds."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from tests import distributed_case
from metalearn.repository import ROOT
from tests import forked



def _cluster():
    from metalearn.runs import cluster  # here: the subprocess case runs on any version
    return cluster


def _config(index=0, workers=2):
    addresses = [f"localhost:{port}" for port in distributed_case.free_ports(workers)]
    return {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}}


def test_a_peer_that_never_starts_times_out_naming_it(monkeypatch, caplog):
    import logging
    from metalearn.training import distribute
    caplog.set_level(logging.INFO)
    config = _config()
    monkeypatch.setenv("TF_CONFIG", json.dumps(config))
    peer = config["cluster"]["worker"][1]
    start = time.monotonic()
    with pytest.raises(_cluster().ClusterTimeoutError,
                       match=rf"after \d+ s, worker 1 at {peer} never started .*"
                       r"make_strategy.peer_timeout"):
        distribute.make_strategy("multi_worker", peer_timeout=1.0)
    assert time.monotonic() - start < 20
    assert any(f"waits for 1 other task(s) of the cluster to start: worker 1 at {peer}"
               in r.getMessage() for r in caplog.records)


def test_peers_that_start_at_different_times_all_get_through():
    config = _config(workers=3)
    errors, servers, done = [], [], threading.Event()

    def task(index, delay):
        time.sleep(delay)
        try:
            _cluster().wait_for_peers(dict(config, task={"type": "worker", "index": index}),
                                      timeout=10, poll=0.05)
        except Exception as error:  # noqa: BLE001
            errors.append(error)
            return
        port = int(config["cluster"]["worker"][index].rsplit(":", 1)[1])
        servers.append(socket.create_server(("", port)))  # as TensorFlow's server does
        done.wait(15)

    threads = [threading.Thread(target=task, args=(i, 0.3 * i)) for i in range(3)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 20
    while len(servers) + len(errors) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    done.set()
    for thread in threads:
        thread.join(20)
    for server in servers:
        server.close()
    assert not errors and len(servers) == 3


def test_sigterm_stops_the_wait(monkeypatch):
    config, cluster = _config(), _cluster()
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    try:
        with pytest.raises(cluster.ClusterWaitInterrupted, match="stopped by SIGTERM while "
                           "waiting for worker 1 at"):
            cluster.wait_for_peers(config, timeout=60)
    finally:
        timer.cancel()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL or callable(
        signal.getsignal(signal.SIGTERM))


def test_train_logs_the_wait_and_exits_on_sigterm(tmp_path):
    """The entry point as a scheduler runs it: a peer that never starts, then SIGTERM."""
    config = _config()
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2",
               TF_CONFIG=json.dumps(config))
    process = forked.Popen(
        [sys.executable, "-m", "metalearn.train", "--strategy=multi_worker",
         "--gin_file=sinusoid/maml.gin", f"--workdir={tmp_path / 'run'}"],
        cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True, start_new_session=True)
    seen = []
    reader = threading.Thread(target=lambda: seen.extend(process.stderr), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 240  # the imports, on loaded machines
        waiting = lambda: [l for l in seen if "other task(s) of the cluster to start" in l]
        while not waiting() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert waiting(), "no line says what it waits for:\n" + "".join(seen[-20:])
        assert f"worker 1 at {config['cluster']['worker'][1]}" in waiting()[0]
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
        reader.join(10)
        assert process.returncode == 143, "".join(seen[-20:])
        assert "stopped by SIGTERM while waiting for worker 1" in "".join(seen)
        assert not (tmp_path / "run").exists()
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@pytest.mark.parametrize("config, excerpt", [
    ({"cluster": {"worker": ["localhost:1"]}, "task": {"type": "worker", "index": 3}},
     r"task \{'type': 'worker', 'index': 3\} is not in its cluster, which holds worker 0..0"),
    ({"cluster": {"worker": ["localhost:1"]}}, "has no 'task'"),
    ({"task": {"type": "worker", "index": 0}}, "has no 'cluster'"),
    ({"cluster": {"worker": ["localhost"]}, "task": {"type": "worker", "index": 0}},
     "'localhost' is not 'host:port'"),
])
def test_malformed_tf_config_is_named(config, excerpt):
    with pytest.raises(ValueError, match=excerpt):
        _cluster().wait_for_peers(config, timeout=1)


def test_a_port_taken_by_another_process_is_named():
    config = _config()
    port = int(config["cluster"]["worker"][0].rsplit(":", 1)[1])
    with socket.create_server(("", port)):
        with pytest.raises(OSError, match=rf"gives this task \(worker 0\) port {port}, "
                           "which cannot be opened"):
            _cluster().wait_for_peers(config, timeout=1)
