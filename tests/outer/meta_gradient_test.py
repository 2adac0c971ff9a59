"""MetaGradient: the outer update equals the Keras optimizer applied to the meta-gradient;
ClipDirections bounds it."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import metalearn
from metalearn import execution, models
from metalearn.outer import ClipDirections, MetaGradient
from metalearn.adapters import GradientDescent
from metalearn.testing import regression_episodes, mse


def _learner(seed=0):
    keras.utils.set_random_seed(seed)
    model = models.mlp((2,), hidden=(4,), outputs=1, dtype="float64")
    return metalearn.Learner(model, GradientDescent(steps=1, learning_rate=0.1), loss=mse)


def test_sgd_step_equals_manual_update():
    learner = _learner()
    episodes = regression_episodes()
    with tf.GradientTape() as tape:
        loss = learner.meta_loss(episodes)
    grads = [g.numpy() for g in tape.gradient(loss, learner.meta_variables)]
    before = [v.numpy() for v in learner.meta_variables]
    rule = MetaGradient(keras.optimizers.SGD(learning_rate=0.5))
    metrics = rule.step(learner, episodes, execution.Auto())
    np.testing.assert_allclose(tf.reduce_mean(metrics["loss"]), loss)
    for w, g, v in zip(before, grads, learner.meta_variables):
        np.testing.assert_allclose(v.numpy(), w - 0.5 * g, rtol=1e-12)


def test_clipnorm_bounds_the_update():
    learner = _learner()
    before = [v.numpy() for v in learner.meta_variables]
    rule = ClipDirections(MetaGradient(keras.optimizers.SGD(learning_rate=1.0)), 1e-3)
    rule.step(learner, regression_episodes(), execution.Auto())
    change = np.sqrt(sum(np.sum((v.numpy() - w) ** 2)
                         for v, w in zip(learner.meta_variables, before)))
    np.testing.assert_allclose(change, 1e-3, rtol=1e-6)


def test_meta_step_lowers_the_meta_loss():
    learner = _learner()
    episodes = regression_episodes()
    rule = metalearn.MetaGradient(keras.optimizers.Adam(learning_rate=0.01))
    step = metalearn.training.make_meta_step(learner, rule)
    first = float(step(episodes)["loss"])
    for _ in range(20):
        last = float(step(episodes)["loss"])
    assert last < first


def test_disconnected_meta_variable_is_reported():
    class Detached(metalearn.Learner):
        def predict(self, weights, x):  # ignores the adapted weights entirely
            return tf.zeros_like(x[..., :1])

    learner = Detached(models.mlp((2,), hidden=(3,), dtype="float64"), GradientDescent(),
                       loss=mse)
    with pytest.raises(ValueError, match="no meta-gradient reaches"):
        MetaGradient().directions(learner, regression_episodes(), execution.Auto())


def test_bad_clipnorm():
    with pytest.raises(ValueError, match="max_norm must be > 0, got -1"):
        ClipDirections(MetaGradient(), -1)
    # the old spellings (metalearn 0.2) name the new ones
    with pytest.raises(TypeError, match="clipnorm=.*moved.*ClipDirections"):
        MetaGradient(clipnorm=1.0)
    with pytest.raises(TypeError, match="MetaOptimizer is MetaGradient"):
        metalearn.MetaOptimizer(keras.optimizers.SGD(0.1))
