"""Reptile: the update equals its formula on a hand-computed linear-regression case."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import metalearn
from metalearn import execution, models
from metalearn.adapters import GradientDescent, MetaSGD
from metalearn.testing import LearnerContract, classification_learner
from metalearn.testing import regression_episodes, mse

ALPHA, EPSILON, STEPS = 0.1, 0.5, 2


def _linear_learner():
    keras.utils.set_random_seed(3)
    model = models.mlp((2,), hidden=(), outputs=1, dtype="float64")
    return metalearn.Learner(model, GradientDescent(steps=STEPS, learning_rate=ALPHA),
                             loss=mse)


def _adapt_by_hand(w, b, x, y):
    """``STEPS`` gradient steps on mean((x w + b - y)^2), written out."""
    for _ in range(STEPS):
        residual = x @ w + b - y  # [n, 1]
        w, b = (w - ALPHA * 2 * x.T @ residual / len(x),
                b - ALPHA * 2 * residual.mean(0))
    return w, b


def _run(learner, serial, formulation="map_fn"):
    rule = metalearn.SerialReptile if serial else metalearn.Reptile
    reptile = rule(keras.optimizers.SGD(learning_rate=EPSILON))
    step = metalearn.training.make_meta_step(learner, reptile,
                                             execution.formulation(formulation))
    step(regression_episodes(tasks=3))
    return [v.numpy() for v in learner.meta_variables]


@pytest.mark.parametrize("formulation", ["map_fn", "unrolled"])
def test_batched_update_equals_formula(formulation):
    learner = _linear_learner()
    w, b = (v.numpy() for v in learner.meta_variables)
    episodes = regression_episodes(tasks=3)
    adapted = [_adapt_by_hand(w, b, episodes.support_x[i].numpy(),
                              episodes.support_y[i].numpy()) for i in range(3)]
    expected_w = w + EPSILON * (np.mean([a[0] for a in adapted], 0) - w)
    expected_b = b + EPSILON * (np.mean([a[1] for a in adapted], 0) - b)
    new_w, new_b = _run(learner, serial=False, formulation=formulation)
    np.testing.assert_allclose(new_w, expected_w, rtol=1e-12)
    np.testing.assert_allclose(new_b, expected_b, rtol=1e-12)


def test_serial_update_equals_formula():
    learner = _linear_learner()
    w, b = (v.numpy() for v in learner.meta_variables)
    episodes = regression_episodes(tasks=3)
    for i in range(3):  # each task adapts from where the previous update left theta
        phi_w, phi_b = _adapt_by_hand(w, b, episodes.support_x[i].numpy(),
                                      episodes.support_y[i].numpy())
        w, b = w + EPSILON * (phi_w - w), b + EPSILON * (phi_b - b)
    new_w, new_b = _run(learner, serial=True)
    np.testing.assert_allclose(new_w, w, rtol=1e-12)
    np.testing.assert_allclose(new_b, b, rtol=1e-12)


def test_serial_and_batched_differ_and_metrics_are_per_task():
    batched, serial = _run(_linear_learner(), False), _run(_linear_learner(), True)
    assert not np.allclose(batched[0], serial[0])
    learner = _linear_learner()
    reptile = metalearn.SerialReptile()
    metrics = reptile.step(learner, regression_episodes(tasks=3), execution.MapFn())
    assert metalearn.outer.NON_FINITE not in metrics  # unguarded: no flags
    assert metrics["loss"].shape == (3,)


def test_reptile_refuses_adapter_state_it_cannot_train():
    learner = metalearn.Learner(models.mlp((2,), hidden=(3,), dtype="float64"),
                                MetaSGD(), loss=mse)
    with pytest.raises(ValueError, match="Reptile moves the model's initial weights only"):
        metalearn.Reptile().directions(learner, regression_episodes(), execution.MapFn())
    with pytest.raises(ValueError, match="inner_steps must be a whole number >= 1, got 0"):
        metalearn.Reptile(inner_steps=0)


class TestReptile(LearnerContract):
    covers = (metalearn.Reptile,)

    def make_learner(self):
        return classification_learner(GradientDescent(steps=3, learning_rate=0.1))

    def make_outer_rule(self):
        return metalearn.Reptile(keras.optimizers.SGD(learning_rate=0.5))


class TestSerialReptile(TestReptile):
    covers = (metalearn.SerialReptile,)

    def make_outer_rule(self):
        return metalearn.SerialReptile(keras.optimizers.SGD(learning_rate=0.3))
