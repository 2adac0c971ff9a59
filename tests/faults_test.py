"""Numerical faults: a NaN injected at a chosen step is caught at that step, with the
last good checkpoint kept (``on_non_finite='raise'``), or skipped and counted
(``Loop(on_non_finite='skip')``), on one device and across replicas."""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import metalearn
from metalearn import execution, functional
from metalearn.adapters import GradientDescent
from metalearn.models import mlp
from metalearn.tasks import Episode, Sinusoid
from metalearn.outer import NON_FINITE, SkipNonFinite
from metalearn.training import Experiment, Loop, distribute, train
from metalearn.training import step as step_builder
from metalearn.runs.workdir import Workdir
from metalearn.training.checkpoint import checkpoint_for
from tests import distributed_case


class FaultyLearner(metalearn.Learner):
    """A learner whose ``fault_step``-th meta-step (1-based) goes wrong: its query loss
    is NaN (``fault="loss"``), or the loss stays finite but the meta-gradient of the
    output bias is NaN (``fault="gradient"``: ``d/db sqrt((b - stop_gradient(b))^2)``
    at 0)."""

    def __init__(self, model, fault_step, fault="loss", **kwargs):
        super().__init__(model, **kwargs)
        self.fault_step, self.fault = fault_step, fault

    def query_metrics(self, query_y, predictions):
        results = dict(super().query_metrics(query_y, predictions))
        now = tf.equal(self.meta_step, self.fault_step - 1)
        if self.fault == "loss":
            bad = tf.where(now, tf.constant(np.nan, functional.metric_dtype(self.model)), 0.0)
        else:
            bias = self.model.layers[-1].bias
            zero = tf.sqrt(tf.reduce_sum(tf.square(bias - tf.stop_gradient(bias))))
            bad = tf.where(now, tf.cast(zero, functional.metric_dtype(self.model)), 0.0)
        results["loss"] = results["loss"] + bad
        return results


def _experiment(fault_step=None, fault="loss", **loop):
    keras.utils.set_random_seed(0)
    model = mlp(hidden=(8,))
    adapter = GradientDescent(steps=1, learning_rate=0.01)
    loss = keras.losses.MeanSquaredError()
    learner = FaultyLearner(model, fault_step, fault, adapter=adapter, loss=loss) \
        if fault_step else metalearn.Learner(model, adapter=adapter, loss=loss)
    settings = dict(num_steps=12, log_every=4, checkpoint_every=3)
    settings.update(loop)
    return Experiment(learner, Sinusoid(shots=5, queries=5), meta_batch_size=4,
                      loop=Loop(**settings))


def _weights(experiment):
    return [v.numpy() for v in experiment.learner.meta_variables]


def test_nan_loss_stops_at_its_step_and_the_last_checkpoint_loads(tmp_path):
    experiment = _experiment(fault_step=8)
    with pytest.raises(FloatingPointError, match=r"non-finite \(NaN or infinite\) "
                       r"meta-loss at step 8; its update was not applied and the latest "
                       r"checkpoint, .*ckpt-6, is from before it \(rerunning resumes"):
        train(experiment, str(tmp_path))
    # in memory: the state after step 7 (step 8's update not applied)
    assert int(experiment.outer_rule.optimizer.iterations.numpy()) == 7
    assert all(np.isfinite(w).all() for w in _weights(experiment))
    latest = tf.train.latest_checkpoint(Workdir(tmp_path).checkpoints)
    assert latest.endswith("ckpt-6")
    fresh = _experiment()
    checkpoint_for(fresh, fresh.learner.meta_step).restore(
        latest).assert_existing_objects_matched()
    assert int(fresh.learner.meta_step.numpy()) == 6 < 8
    assert int(fresh.outer_rule.optimizer.iterations.numpy()) == 6
    assert all(np.isfinite(w).all() for w in _weights(fresh))


def test_nan_gradient_with_a_finite_loss_names_the_variable(tmp_path):
    experiment = _experiment(fault_step=2, fault="gradient")
    bias = experiment.learner.model.layers[-1].bias.path
    others = [v.path for v in experiment.learner.meta_variables if v.path != bias]
    with pytest.raises(FloatingPointError) as error:
        train(experiment, str(tmp_path))
    message = str(error.value)
    assert f"non-finite (NaN or infinite) meta-gradient of {bias} at step 2" in message
    assert "meta-loss" not in message and not any(p in message for p in others)
    assert "there is no checkpoint yet" in message


def _reference(skipped_step, num_steps):
    """The same run by hand: every step's update, except ``skipped_step``'s."""
    experiment = _experiment()
    strategy = tf.distribute.get_strategy()
    step = step_builder.make_distributed_meta_step(strategy, experiment.learner,
                                                   experiment.outer_rule,
                                                   experiment.formulation)
    stream = distribute.episode_stream(strategy, experiment.sampler, 4, num_steps=num_steps)
    for number, batch in enumerate(stream, start=1):
        if number == skipped_step:
            experiment.learner.meta_step.assign_add(1)
        else:
            step(batch)
    return experiment


def test_skip_mode_skips_exactly_the_bad_step(tmp_path):
    experiment = _experiment(fault_step=7, on_non_finite="skip")
    metrics = train(experiment, str(tmp_path))
    assert metrics["step"] == 12 and metrics["skipped_steps"] == 1
    assert np.isfinite(metrics["loss"])
    assert int(experiment.outer_rule.optimizer.iterations.numpy()) == 11
    skipped = _reference(skipped_step=7, num_steps=12)
    for a, b in zip(_weights(experiment), _weights(skipped)):
        np.testing.assert_array_equal(a, b)
    applied = _reference(skipped_step=None, num_steps=12)  # the test can tell them apart
    assert not all(np.array_equal(a, b)
                   for a, b in zip(_weights(experiment), _weights(applied)))
    events = tf.compat.v1.train.summary_iterator  # the count is in the summaries
    tags = {value.tag for path in (tmp_path / "train").iterdir()
            for event in events(str(path)) for value in event.summary.value}
    assert "skipped_steps" in tags


def test_bad_option_is_rejected():
    with pytest.raises(ValueError, match="Loop.on_non_finite must be one of .*'ignore'"):
        _experiment(on_non_finite="ignore")


@pytest.mark.parametrize("replicas", [1, 2])
def test_a_nan_on_one_replica_skips_the_update_on_every_replica(replicas):
    # reduce_to_one_device: default collectives of several MirroredStrategy objects in
    # one process share instance keys (as in tests/training/distribute_test.py)
    strategy = distribute.make_strategy("mirrored", [f"/cpu:{i}" for i in range(replicas)],
                                        cross_device_ops="reduce_to_one_device") \
        if replicas > 1 else tf.distribute.get_strategy()
    learner, rule = distributed_case.build(strategy)
    clean = distributed_case.episodes()
    query_x = clean.query_x.numpy()
    query_x[0] = np.nan  # task 0, replica 0's
    poisoned = Episode(clean.support_x, clean.support_y, query_x, clean.query_y)
    step = step_builder.make_distributed_meta_step(strategy, learner, rule,
                                                   skip_non_finite=True)
    before = [v.numpy() for v in learner.meta_variables]
    flags = step(distribute.split_episodes(strategy, poisoned))[NON_FINITE]
    assert flags.numpy()[0] == 1  # one replica's loss (all reduced, the same everywhere)
    assert int(rule.optimizer.iterations.numpy()) == 0
    assert int(learner.meta_step.numpy()) == 1
    for variable, old in zip(learner.meta_variables, before):
        for local in strategy.experimental_local_results(variable):
            np.testing.assert_array_equal(local.numpy(), old)
    flags = step(distribute.split_episodes(strategy, clean))[NON_FINITE]
    assert not flags.numpy().any() and int(rule.optimizer.iterations.numpy()) == 1
    assert not np.array_equal(learner.meta_variables[0].numpy(), before[0])


def test_serial_reptile_keeps_the_updates_before_the_bad_task():
    keras.utils.set_random_seed(0)
    model = mlp(hidden=(8,))
    learner = metalearn.Learner(model, adapter=GradientDescent(steps=2, learning_rate=0.01),
                                loss=keras.losses.MeanSquaredError())
    unrolled = execution.Unrolled()
    reptile = metalearn.SerialReptile(keras.optimizers.SGD(0.5))
    reptile.build(learner)
    guarded = SkipNonFinite(reptile)
    batch = Sinusoid(shots=5, queries=5).sample(tf.constant([1, 2], tf.int64), 3)
    query_y = batch.query_y.numpy()
    query_y[1] = np.nan  # task 1 of 3
    poisoned = Episode(batch.support_x, batch.support_y, batch.query_x, query_y)
    start = [v.numpy() for v in learner.meta_variables]
    flags = tf.function(lambda e: guarded.step(learner, e, unrolled))(poisoned)[NON_FINITE]
    assert flags.numpy()[0] == 1
    after_bad = [v.numpy() for v in learner.meta_variables]
    for variable, value in zip(learner.meta_variables, start):
        variable.assign(value)
    first_only = tf.nest.map_structure(lambda t: t[:1], batch)
    tf.function(lambda e: reptile.step(learner, e, unrolled))(first_only)  # task 0 alone
    for a, b in zip(after_bad, [v.numpy() for v in learner.meta_variables]):
        np.testing.assert_array_equal(a, b)
    assert not all(np.array_equal(a, b) for a, b in zip(after_bad, start))
