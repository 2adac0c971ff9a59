"""Bad distribution settings (``make_strategy``, ``TF_CONFIG``): devices, strategies,
the cluster and its peers, a meta-batch that does not divide among replicas. Cases of
docs/errors.md (tests/bad_input.py)."""

import json
import os
import socket

import tensorflow as tf

from metalearn.runs.cluster import ClusterTimeoutError
from metalearn.training import distribute
from tests.bad_input import Case, check, parametrize
from tests.distributed_case import free_ports

TITLE = "Distribution"


def with_environment(name, value, run):
    def wrapped(tmp_path) -> None:
        saved = os.environ.get(name)
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
        try:
            run()
        finally:
            if saved is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = saved
    return wrapped


def _two_workers(index=0):
    ports = free_ports(2)
    return json.dumps({"cluster": {"worker": [f"localhost:{p}" for p in ports]},
                       "task": {"type": "worker", "index": index}})


def multi_worker(tf_config, **kwargs):
    return with_environment("TF_CONFIG", tf_config, lambda: distribute.make_strategy(
        "multi_worker", **kwargs))


def port_taken(tmp_path) -> None:
    config = _two_workers()
    port = int(json.loads(config)["cluster"]["worker"][0].rsplit(":", 1)[1])
    with socket.create_server(("", port)):
        multi_worker(config, peer_timeout=1.0)(tmp_path)


CASES = [
    Case("mirrored devices that do not exist", "`make_strategy.devices = ['/cpu:0', "
         "'/cpu:9']`", ValueError, "make_strategy.devices: ['/cpu:9'] not among the "
         "visible devices", lambda p: distribute.make_strategy(
             "mirrored", devices=["/cpu:0", "/cpu:9"]), None,
         "the devices, and the visible ones"),
    Case("mirrored GPUs on a CPU-only machine", "`make_strategy.devices = ['/gpu:0', "
         "'/gpu:1']` without GPUs", ValueError, "['/gpu:0', '/gpu:1'] not among the visible "
         "devices", lambda p: distribute.make_strategy(
             "mirrored", devices=["/gpu:0", "/gpu:1"]), None,
         "the devices, and the visible ones"),
    Case("no mirrored devices", "`make_strategy.devices = []`", ValueError,
         "make_strategy.devices is empty", lambda p: distribute.make_strategy(
             "mirrored", devices=[]), None, "the argument"),
    Case("unknown strategy", "`--strategy=tpu`", ValueError, "strategy must be one of "
         "('default', 'mirrored', 'multi_worker'), got 'tpu'",
         lambda p: distribute.make_strategy("tpu"), None, "the choices"),
    Case("unknown all-reduce", "`make_strategy.cross_device_ops = 'ring'`", ValueError,
         "cross_device_ops must be one of", lambda p: distribute.make_strategy(
             "mirrored", cross_device_ops="ring"), None, "the choices"),
    Case("multi_worker without TF_CONFIG", "`--strategy=multi_worker`, no `TF_CONFIG`",
         ValueError, "strategy 'multi_worker' needs the TF_CONFIG environment variable",
         with_environment("TF_CONFIG", None,
                          lambda: distribute.make_strategy("multi_worker")),
         None, "the variable"),
    Case("TF_CONFIG that is not JSON", "`TF_CONFIG='{cluster: ...'`", ValueError,
         "TF_CONFIG is not valid JSON", with_environment(
             "TF_CONFIG", "{cluster: ", lambda: distribute.make_strategy("multi_worker")),
         None, "the variable's text"),
    Case("meta-batch that does not divide among replicas", "`Experiment.meta_batch_size = "
         "5` on 2 replicas", ValueError, "meta_batch_size=5 does not divide among 2 "
         "replicas", lambda p: distribute.tasks_per_replica(
             5, tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])), None, "the multiple"),
    Case("multi_worker peer that never starts", "`TF_CONFIG` of 2 workers, worker 1 never "
         "started", ClusterTimeoutError, "worker 1 at localhost:",
         multi_worker(_two_workers(), peer_timeout=1.0), lambda p: "never started",
         "the task and its address, the limit's binding"),
    Case("multi_worker task not in the cluster", "`TF_CONFIG` task `worker 3` of a "
         "1-worker cluster", ValueError, "is not in its cluster, which holds worker 0..0",
         multi_worker('{"cluster": {"worker": ["localhost:1"]}, "task": {"type": '
                      '"worker", "index": 3}}'), None, "the task and the cluster"),
    Case("multi_worker without a task", "`TF_CONFIG` with a cluster and no task",
         ValueError, "TF_CONFIG has no 'task'", multi_worker(
             '{"cluster": {"worker": ["localhost:1"]}}'), None, "the variable's text"),
    Case("multi_worker port in use", "`TF_CONFIG` gives this task a port another process "
         "holds", OSError, "which cannot be opened on this machine", port_taken, None,
         "the task and port"),
    Case("zero peer wait", "`make_strategy.peer_timeout = 0`", ValueError,
         "make_strategy.peer_timeout must be a number of seconds > 0, got 0",
         multi_worker(_two_workers(), peer_timeout=0), None, "the argument"),
]


@parametrize(CASES)
def test_bad_input_raises_the_documented_error(case, tmp_path):
    check(case, tmp_path)
