"""A fixed meta-learning problem run under any tf.distribute strategy (shared by the
distribution tests and their worker processes)."""

import json
import os
import socket
import subprocess
import sys
from typing import List, Sequence, Tuple

import keras
import numpy as np
import tensorflow as tf

import metalearn
from metalearn import execution
from metalearn.adapters import GradientDescent
from metalearn.outer import ClipDirections
from metalearn.tasks import Episode
from metalearn.training import distribute
from metalearn.training import step as step_builder
from tests import forked

META_BATCH = 4
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_ports(count: int) -> List[int]:
    """``count`` loopback ports free at the time of asking, for fake clusters."""
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("localhost", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def launch_workers(args: Sequence[str], workers: int = 2) -> List[subprocess.Popen]:
    """Starts one ``python ARGS`` process per worker of a loopback cluster, each with its
    TF_CONFIG, as TensorFlow's guide does."""
    cluster = {"worker": [f"localhost:{port}" for port in free_ports(workers)]}
    processes = []
    for index in range(workers):
        env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2",
                   TF_CONFIG=json.dumps({"cluster": cluster,
                                         "task": {"type": "worker", "index": index}}))
        processes.append(forked.Popen([sys.executable, *args], cwd=ROOT, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      start_new_session=True))
    return processes


def wait_for(processes: Sequence[subprocess.Popen], timeout: float = 240) -> None:
    """Waits for every worker; asserts each exited 0 (its output's tail otherwise)."""
    outputs = []
    for process in processes:
        out, _ = process.communicate(timeout=timeout)
        outputs.append(out.decode(errors="replace"))
    for process, out in zip(processes, outputs):
        assert process.returncode == 0, out[-3000:]


def episodes() -> Episode:
    keys = tf.random.experimental.stateless_split([7, 7], 2)
    labels = tf.tile(tf.range(3)[None], [META_BATCH, 2])
    inputs = lambda k: tf.random.stateless_normal([META_BATCH, 6, 4], k, dtype=tf.float64)
    return Episode(inputs(keys[0]), labels, inputs(keys[1]), labels)


def loss(y, logits):
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        tf.cast(y, tf.int32), logits))


def build(strategy: tf.distribute.Strategy, clipnorm=None):
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential([  # BatchNorm in the inner loop, small enough to trace fast
            keras.Input((4,), dtype="float64"),
            keras.layers.Dense(8, dtype="float64", name="dense"),
            keras.layers.BatchNormalization(dtype="float64", name="bn"),
            keras.layers.ReLU(dtype="float64"),
            keras.layers.Dense(3, dtype="float64", name="head")])
        learner = metalearn.Learner(model, GradientDescent(steps=2, learning_rate=0.3),
                                    loss=loss)
        rule = metalearn.MetaGradient(keras.optimizers.Adam(0.01))
        if clipnorm is not None:
            rule = ClipDirections(rule, clipnorm)
        rule.build(learner)
    return learner, rule


def run(strategy: tf.distribute.Strategy, steps: int = 2, clipnorm=None
        ) -> Tuple[List[np.ndarray], List[np.ndarray]]:
    """The first step's all-reduced meta-gradient and the weights after ``steps``."""
    learner, rule = build(strategy, clipnorm)
    batch = distribute.split_episodes(strategy, episodes())
    formulation = execution.Auto()

    @tf.function
    def gradient(per_replica):
        grads = strategy.run(lambda e: rule.directions(learner, e, formulation)[0],
                             args=(per_replica,))
        return [strategy.reduce(tf.distribute.ReduceOp.MEAN, g, axis=None) for g in grads]

    first = [g.numpy() for g in gradient(batch)]
    step = step_builder.make_distributed_meta_step(strategy, learner, rule, formulation)
    for _ in range(steps):
        step(batch)
    return first, [v.numpy() for v in learner.meta_variables]
