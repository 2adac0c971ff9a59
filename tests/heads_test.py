"""Closed-form heads: ridge regression (R2-D2) against its closed form and finite
differences; logistic regression by Newton steps (LR-D2) against its optimality condition
and finite differences."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import metalearn
from metalearn import models
from metalearn.heads import LogisticHead, RidgeHead
from metalearn.heads.logistic import logistic_dual
from metalearn.testing import (DIM, WAYS, LearnerContract, analytic_meta_gradient,
                               finite_difference_variables, relative_error,
                               synthetic_classification)


@pytest.mark.parametrize("n,d", [(6, 10), (12, 4)])  # Woodbury (n <= d) and primal
def test_ridge_solution_equals_the_closed_form(n, d):
    rng = np.random.default_rng(0)
    embeddings = tf.constant(rng.normal(size=(n, d)))
    labels = tf.constant(np.arange(n) % 3)
    head = RidgeHead(regularization=0.5)
    head.build(tf.float64)
    w = head.fit(embeddings, labels, 3).numpy()
    e, y = embeddings.numpy(), np.eye(3)[labels.numpy()]
    expected = np.linalg.solve(e.T @ e + 0.5 * np.eye(d), e.T @ y)  # the primal form
    np.testing.assert_allclose(w, expected, rtol=1e-10, atol=1e-12)
    logits = head.logits(w, embeddings).numpy()
    np.testing.assert_allclose(logits, e @ expected, rtol=1e-10, atol=1e-12)


def _embedding(dtype="float64"):
    keras.utils.set_random_seed(0)
    return models.mlp((DIM,), hidden=(), outputs=5, activation="tanh", dtype=dtype,
                      name="embedding")


def test_r2d2_meta_gradient_equals_finite_differences():
    learner = metalearn.EmbeddingLearner(_embedding(), head=RidgeHead(0.7, scale=2.0),
                                         ways=WAYS)
    head_variables = learner.head.own_meta_variables()
    assert len(head_variables) == 3 and all(any(h is v for v in learner.meta_variables)
                                            for h in head_variables)
    episodes = synthetic_classification(0, tasks=2, dtype=tf.float64)
    analytic = analytic_meta_gradient(learner, episodes)
    numeric = finite_difference_variables(lambda: learner.meta_loss(episodes),
                                          learner.meta_variables)
    assert relative_error(analytic, numeric) < 1e-6
    for variable in head_variables:  # lambda, scale and bias are all learned
        assert abs(analytic[variable.path]) > 0, variable.path


def test_a_fixed_ridge_head_learns_nothing_itself():
    learner = metalearn.EmbeddingLearner(_embedding(), head=RidgeHead(learn=False),
                                         ways=WAYS)
    assert [v.path for v in learner.meta_variables] == [
        v.path for v in learner.model.trainable_variables]
    with pytest.raises(ValueError, match="regularization .* must be > 0, got 0"):
        RidgeHead(regularization=0)


class TestR2D2(LearnerContract):
    covers = (RidgeHead,)

    def make_learner(self):
        keras.utils.set_random_seed(0)
        model = models.mlp((DIM,), hidden=(16,), outputs=8, activation="relu",
                           name="embedding")
        return metalearn.EmbeddingLearner(model, head=RidgeHead(1.0, scale=5.0), ways=WAYS,
                                          metrics={"accuracy": "accuracy"})

    def chance_metrics(self, learner, episodes):
        """Without a task's support set the head has nothing to fit: shuffled support
        labels say nothing about the queries."""
        from metalearn.testing import uninformative_support
        return learner.meta_metrics(uninformative_support(episodes))


@pytest.mark.parametrize("n,d", [(6, 10), (12, 4)])
def test_logistic_newton_solution_is_stationary(n, d):
    """Batched over 3 tasks, checked in numpy: W = X^T A zeroes the gradient of the
    regularised cross-entropy, X^T (softmax(X W) - Y) + lambda W."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, n, d))
    y = np.eye(3)[np.arange(n) % 3][None].repeat(3, 0)
    gram = tf.constant(x @ np.swapaxes(x, 1, 2))
    a = tf.function(lambda: logistic_dual(gram, tf.constant(y), tf.constant(0.5, tf.float64),
                                          steps=12))().numpy()
    w = np.swapaxes(x, 1, 2) @ a
    z = x @ w
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    gradient = np.swapaxes(x, 1, 2) @ (p - y) + 0.5 * w
    assert np.abs(gradient).max() < 1e-10


def test_lr_d2_meta_gradient_equals_finite_differences():
    learner = metalearn.EmbeddingLearner(_embedding(), head=LogisticHead(0.7, scale=2.0),
                                         ways=WAYS)
    assert learner.capabilities.custom_gradient  # unrolled tasks: map_fn drops it
    episodes = synthetic_classification(0, tasks=2, dtype=tf.float64)
    analytic = analytic_meta_gradient(learner, episodes)
    numeric = finite_difference_variables(lambda: learner.meta_loss(episodes),
                                          learner.meta_variables)
    assert relative_error(analytic, numeric) < 1e-6
    for variable in learner.head.own_meta_variables():  # lambda through the implicit path
        assert abs(analytic[variable.path]) > 0, variable.path
    with pytest.raises(ValueError, match="LogisticHead steps must be >= 1, got 0"):
        LogisticHead(steps=0)


class TestLRD2(LearnerContract):
    covers = (LogisticHead,)

    def make_learner(self):
        keras.utils.set_random_seed(0)
        model = models.mlp((DIM,), hidden=(16,), outputs=8, activation="relu",
                           name="embedding")
        return metalearn.EmbeddingLearner(model, head=LogisticHead(1.0, scale=2.0), ways=WAYS,
                                          metrics={"accuracy": "accuracy"})

    chance_metrics = TestR2D2.chance_metrics
