"""tf.distribute outer steps: mirrored on logical CPUs, multi-worker on loopback."""

import functools
import json
import os
import signal
import time

import numpy as np
import pytest
import tensorflow as tf

from metalearn.tasks import Sinusoid
from metalearn.training import distribute
from tests import distributed_case
from metalearn.repository import ROOT

SINUSOID = os.path.join(ROOT, "experiments", "sinusoid", "maml.gin")


def _mirrored(replicas):
    # TensorFlow's default CPU all-reduce (collectives) cannot mix groups of 2 and 4
    # devices in one process; one-device reduction can, and is exact the same way.
    return distribute.make_strategy("mirrored", [f"/cpu:{i}" for i in range(replicas)],
                                    cross_device_ops="reduce_to_one_device")


def _assert_close(a, b, tolerance=1e-6):
    for x, y in zip(a, b):
        np.testing.assert_allclose(x, y, rtol=tolerance, atol=1e-12)


@functools.lru_cache(maxsize=None)
def _single_device(clipnorm):
    """The problem on the default strategy, once per process and clipnorm."""
    return distributed_case.run(tf.distribute.get_strategy(), clipnorm=clipnorm)


# four replicas once; the clipped direction (the whole batch's norm) on two
@pytest.mark.parametrize("replicas, clipnorm", [(2, None), (4, None), (2, 0.05)])
def test_mirrored_equals_single_device(replicas, clipnorm):
    single = _single_device(clipnorm)
    mirrored = distributed_case.run(_mirrored(replicas), clipnorm=clipnorm)
    _assert_close(mirrored[0], single[0])  # meta-gradient of the whole meta-batch
    _assert_close(mirrored[1], single[1])  # weights after two Adam steps


def test_meta_batch_must_divide_among_replicas():
    with pytest.raises(ValueError, match="meta_batch_size=5 does not divide among 4"):
        distribute.tasks_per_replica(5, _mirrored(4))


def test_unknown_strategy_is_named():
    with pytest.raises(ValueError, match="got 'tpu_pod'"):
        distribute.make_strategy("tpu_pod")


def test_replicas_get_disjoint_reproducible_streams():
    stream_strategy = _mirrored(2)
    stream = distribute.episode_stream(stream_strategy, Sinusoid(), 8, seed=3)
    first = [t.support_x.numpy() for t in
             stream_strategy.experimental_local_results(next(iter(stream)))]
    again = [t.support_x.numpy() for t in
             stream_strategy.experimental_local_results(next(iter(stream)))]
    assert [x.shape for x in first] == [(4, 10, 1), (4, 10, 1)]
    assert not np.allclose(first[0], first[1])
    for x, y in zip(first, again):
        np.testing.assert_array_equal(x, y)


# --- MultiWorkerMirroredStrategy: worker processes on loopback ports ------------------

def test_multi_worker_equals_single_device(tmp_path):
    out = str(tmp_path / "chief.npz")
    distributed_case.wait_for(distributed_case.launch_workers(["-m", "tests.distributed_worker", out]))
    saved = np.load(out)
    arrays = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    gradients, weights = _single_device(None)
    _assert_close(arrays[:len(gradients)], gradients)
    _assert_close(arrays[len(gradients):], weights)


def _train_params(steps):
    return [f"Loop.num_steps={steps}", "Loop.checkpoint_every=20", "Loop.log_every=20",
            "Experiment.meta_batch_size=4", "mlp.hidden=(8,)"]


def _train_args(workdir, steps):
    return ["-m", "metalearn.train", "--strategy=multi_worker", f"--gin_file={SINUSOID}",
            f"--workdir={workdir}", *[f"--gin_param={p}" for p in _train_params(steps)]]


def test_multi_worker_job_killed_and_restarted_resumes(tmp_path):
    from metalearn.training import build_experiment, parse_config, restore, train
    steps = 120
    whole, broken = str(tmp_path / "whole"), str(tmp_path / "broken")
    # The uninterrupted run, here on 2 replicas mirrored in this process rather than by
    # a second 2-worker job: each replica draws the episodes of the worker of its index
    # (distribute.episode_stream: the union over replicas is a function of the seed
    # alone) and the outer steps are the same (the tests above), so the job resumed must
    # end where an uninterrupted 2-replica run does (an uninterrupted 2-worker job ended
    # bit-identical to it when compared).
    strategy = _mirrored(2)
    parse_config([SINUSOID], _train_params(steps))
    train(build_experiment(strategy), whole, strategy)

    processes = distributed_case.launch_workers(_train_args(broken, steps))
    deadline = time.time() + 240
    while not tf.train.latest_checkpoint(os.path.join(broken, "checkpoints")):
        assert time.time() < deadline and all(p.poll() is None for p in processes)
        time.sleep(0.02)
    for process in processes:  # the whole job dies at once
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    killed_at = tf.train.latest_checkpoint(os.path.join(broken, "checkpoints"))
    assert not os.path.exists(os.path.join(broken, "metrics.json")), "finished too soon"
    distributed_case.wait_for(distributed_case.launch_workers(_train_args(broken, steps)))  # restarted: resumes

    with open(os.path.join(broken, "metrics.json")) as f:
        assert json.load(f)["step"] == steps, killed_at
    expected = [v.numpy() for v in restore(whole).learner.meta_variables]
    resumed = [v.numpy() for v in restore(broken).learner.meta_variables]
    _assert_close(resumed, expected)
