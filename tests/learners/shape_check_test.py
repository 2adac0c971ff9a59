"""The Learner checks the shapes of targets, predictions and per-example losses once,
at trace time, wherever its loss is computed (``learner.adapt`` called directly, a
compiled meta-step), with an error naming the shapes (issue 18)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import metalearn
from metalearn.adapters import GradientDescent
from metalearn.learners import learner as learner_module
from metalearn.models import mlp
from metalearn.tasks import Episode


def _learner(loss=None, outputs=1, **kwargs):
    keras.utils.set_random_seed(0)
    return metalearn.Learner(mlp(hidden=(4,), outputs=outputs),
                             adapter=GradientDescent(1, 0.01),
                             loss=loss or keras.losses.MeanSquaredError(), **kwargs)


def _episodes(tasks=2, support=5, query=10, targets=1):
    x = lambda n: tf.random.stateless_normal([tasks, n, 1], [1, 2])
    y = lambda n: tf.random.stateless_normal([tasks, n, targets], [3, 4])
    return Episode(x(support), y(support), x(query), y(query))


def test_adapt_rejects_regression_targets_of_another_shape():
    learner = _learner()
    x = tf.zeros([10, 1])
    with pytest.raises(ValueError, match=r"targets of shape \[10, 7\] do not fit "
                       r"predictions of shape \[10, 1\]"):
        learner.adapt(x, tf.zeros([10, 7]))
    learner.adapt(x, tf.zeros([10, 1]))  # fits
    learner.adapt(x, tf.zeros([10]))  # trailing size-1 axes aside


def test_support_inputs_and_targets_of_different_lengths_are_named():
    with pytest.raises(ValueError, match=r"targets of shape \[4, 1\] do not fit "
                       r"predictions of shape \[5, 1\]"):
        _learner().adapt(tf.zeros([5, 1]), tf.zeros([4, 1]))


def _broadcasting(y, p):  # [N] - [N, 1] -> [N, N]
    return tf.square(tf.squeeze(y, -1) - p)


def _first_five(y, p):
    return tf.square(y - p)[:5, 0]


@pytest.mark.parametrize("loss, shape", [(_broadcasting, r"\[5, 5\] for 5"),
                                         (_first_five, r"\[5\] for 10")])
def test_a_loss_of_the_wrong_shape_fails_the_compiled_meta_loss(loss, shape):
    learner = _learner(loss)  # 5 support examples, 10 query examples
    with pytest.raises(ValueError, match=rf"loss {loss.__name__} gives values of shape "
                       rf"{shape} examples"):
        tf.function(learner.meta_loss)(_episodes())


def test_a_metric_of_the_wrong_shape_is_named():
    learner = _learner(metrics={"wide": _broadcasting})
    with pytest.raises(ValueError, match=r"metric 'wide' _broadcasting gives values of "
                       r"shape \[10, 10\]"):
        learner.meta_metrics(_episodes())


def test_the_check_runs_when_tracing_not_at_every_step(monkeypatch):
    calls = []
    check = learner_module.check_loss_shapes
    monkeypatch.setattr(learner_module, "check_loss_shapes",
                        lambda *args: calls.append(1) or check(*args))
    learner = _learner()
    step = tf.function(learner.meta_loss)
    episodes = _episodes()
    step(episodes)
    traced = len(calls)
    assert traced > 0
    for _ in range(3):
        step(episodes)
    assert len(calls) == traced


def test_classification_labels_fit_logits_or_are_named():
    keras.utils.set_random_seed(0)
    learner = metalearn.Learner(
        mlp(hidden=(4,), outputs=3), adapter=GradientDescent(1, 0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = tf.zeros([6, 1])
    labels = tf.constant([0, 1, 2, 0, 1, 2])
    learner.adapt(x, labels)
    learner.adapt(x, labels[:, None])
    with pytest.raises(ValueError, match=r"targets of shape \[6, 2\] do not fit "
                       r"predictions of shape \[6, 3\]"):
        learner.adapt(x, tf.zeros([6, 2], tf.int32))


def test_meta_loss_names_support_and_query_of_different_task_counts():
    episodes = _episodes()
    episodes = episodes._replace(query_x=tf.zeros([3, 10, 1]), query_y=tf.zeros([3, 10, 1]))
    with pytest.raises(ValueError, match=r"different numbers of tasks \(leading axis\): "
                       r"support_x 2"):
        _learner().meta_loss(episodes)


def test_loss_and_metrics_are_public_and_the_old_names_still_work():
    learner = _learner(metrics={"mae": "mae"})
    assert isinstance(learner.loss, keras.losses.MeanSquaredError)
    assert list(learner.metrics) == ["mae"]
    assert learner._loss is learner.loss and learner._metrics is learner.metrics

    class OldStyle(metalearn.Learner):  # a subclass written against the private names
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._loss = keras.losses.MeanAbsoluteError()
            self._metrics = {"mse": keras.losses.get("mse")}

    keras.utils.set_random_seed(0)
    old = OldStyle(mlp(hidden=(4,)), adapter=GradientDescent(1, 0.01), loss="mse")
    assert isinstance(old.loss, keras.losses.MeanAbsoluteError)
    assert old.metric_names == ["loss", "mse"]
    values = old.query_metrics(tf.ones([4, 1]), tf.zeros([4, 1]))
    np.testing.assert_allclose(values["loss"], 1.0)


def test_a_built_model_without_trainable_weights_is_named():
    model = mlp(hidden=(4,))
    model.trainable = False
    with pytest.raises(ValueError, match=r"is built but has no trainable weights"):
        metalearn.Learner(model, loss="mse")
