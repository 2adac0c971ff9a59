"""The MetaOptNet SVM head: its dual solution against the KKT conditions and the primal
(padded to more examples and classes too), its meta-gradient (implicit, through the
face's stationarity) against finite differences, and the learner contract."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import metalearn
from metalearn import models
from metalearn.heads import SVMHead
from metalearn.heads.svm import crammer_singer_dual, svm_kernel
from metalearn.testing import (DIM, WAYS, LearnerContract,
                               assert_meta_gradient_matches_finite_differences,
                               synthetic_classification, uninformative_support)

KKT_TOLERANCE = 1e-9  # float64, on the scale of the unit margins


def _problems(tasks, n, d, ways, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(tasks, n, d))
    y = np.eye(ways)[np.arange(n) % ways][None].repeat(tasks, 0)
    return x, y


def assert_kkt(x, y, alpha, c, ridge):
    """The KKT conditions of the dual for embeddings ``x`` ``[tasks, n, d]``, one-hot ``y``
    and the solution ``alpha``, checked in numpy: primal feasibility (beta = C Y - alpha
    on the scaled simplex), stationarity with one multiplier per example (the gradient
    is equal on the active classes and not smaller on the others), and, for the plain
    dual (ridge 0), a zero duality gap against the primal SVM with W = X^T alpha."""
    kernel = x @ np.swapaxes(x, 1, 2) + ridge * np.eye(x.shape[1])
    beta = c * y - alpha
    assert beta.min() >= -KKT_TOLERANCE
    np.testing.assert_allclose(beta.sum(-1), c, atol=KKT_TOLERANCE)
    gradient = y - kernel @ alpha  # of the dual objective in beta
    active = beta > KKT_TOLERANCE
    multiplier = (gradient * active).sum(-1, keepdims=True) / active.sum(-1, keepdims=True)
    assert np.abs((gradient - multiplier) * active).max() < KKT_TOLERANCE
    assert ((gradient - multiplier) * ~active).min() > -KKT_TOLERANCE
    if ridge == 0:
        w = np.swapaxes(x, 1, 2) @ alpha                                  # [tasks, d, ways]
        scores = x @ w                                                    # [tasks, n, ways]
        slack = np.max(1 - y + scores - (scores * y).sum(-1, keepdims=True), -1)
        primal = 0.5 * (w ** 2).sum((1, 2)) + c * slack.sum(-1)
        dual = (alpha * y).sum((1, 2)) - 0.5 * (w ** 2).sum((1, 2))
        np.testing.assert_allclose(primal, dual, rtol=KKT_TOLERANCE, atol=KKT_TOLERANCE)


SIZES = [(6, 10, 3, 0.5, 0.0), (5, 8, 5, 0.1, 0.0), (12, 4, 3, 1.0, 0.1)]


@pytest.mark.parametrize("n,d,ways,c,ridge", SIZES)
def test_the_dual_solution_satisfies_the_kkt_conditions(n, d, ways, c, ridge):
    """Batched over 4 tasks: :func:`assert_kkt`."""
    x, y = _problems(4, n, d, ways)
    kernel = svm_kernel(tf.constant(x), ridge)
    alpha = tf.function(lambda: crammer_singer_dual(kernel, tf.constant(y), c, steps=100))()
    assert_kkt(x, y, alpha.numpy(), c, ridge)


@pytest.mark.parametrize("n,d,ways,c,ridge", SIZES)
def test_a_padded_problem_is_solved_at_its_real_size(n, d, ways, c, ridge):
    """The problems padded with 3 examples (their embeddings zeroed, as SVMHead zeroes a
    padded episode's, their targets zero) and 2 absent classes, only the real examples'
    present classes ``allowed``: the real rows and classes of the solution satisfy the
    real-size problem's KKT conditions (:func:`assert_kkt`), and the padded rows and the
    absent classes are exactly zero."""
    x, y = _problems(4, n, d, ways)
    padded_x = np.concatenate([x, np.zeros((4, 3, d))], 1)
    padded_y = np.pad(y, [(0, 0), (0, 3), (0, 2)])
    allowed = (np.arange(n + 3) < n)[:, None] & (np.arange(ways + 2) < ways)[None, :]
    kernel = svm_kernel(tf.constant(padded_x), ridge)
    alpha = tf.function(lambda: crammer_singer_dual(
        kernel, tf.constant(padded_y), c, steps=100,
        allowed=tf.constant(allowed[None].repeat(4, 0))))().numpy()
    assert_kkt(x, y, alpha[:, :n, :ways], c, ridge)
    np.testing.assert_array_equal(alpha[:, n:], 0)
    np.testing.assert_array_equal(alpha[:, :, ways:], 0)


def test_the_batched_solve_equals_each_task_alone():
    x, y = _problems(3, 6, 10, 3, seed=1)
    kernel = svm_kernel(tf.constant(x), 0.0)
    batched = crammer_singer_dual(kernel, tf.constant(y), 0.5, steps=60)
    for i in range(3):
        alone = crammer_singer_dual(kernel[i], tf.constant(y[i]), 0.5, steps=60)
        np.testing.assert_allclose(batched[i], alone, rtol=1e-9, atol=1e-12)


def _embedding(dtype="float64"):
    keras.utils.set_random_seed(0)
    return models.mlp((DIM,), hidden=(), outputs=5, activation="tanh", dtype=dtype,
                      name="embedding")


@pytest.mark.parametrize("c", [0.3, 5.0])  # some classes active, and margins all met
def test_metaoptnet_meta_gradient_equals_finite_differences(c):
    """Embedding weights and the scale -> query loss over 2 tasks (2-shot, so the
    support set has 6 examples and the solution lies on a face of the simplices)."""
    learner = metalearn.EmbeddingLearner(_embedding(), head=SVMHead(c, scale=2.0, steps=50),
                                         ways=WAYS)
    assert learner.pieces.capabilities.custom_gradient  # unrolled tasks: map_fn drops it
    episodes = synthetic_classification(0, tasks=2, dtype=tf.float64)
    analytic = assert_meta_gradient_matches_finite_differences(learner, episodes)
    assert abs(analytic[learner.head.own_meta_variables()[0].path]) > 0


def test_svm_head_arguments_are_checked():
    with pytest.raises(ValueError, match=r"SVMHead.c must be > 0, got 0"):
        SVMHead(c=0)
    with pytest.raises(ValueError, match="SVMHead.steps must be a whole number >= 1, got 0"):
        SVMHead(steps=0)
    with pytest.raises(ValueError, match="SVMHead.ridge must be >= 0, got -1"):
        SVMHead(ridge=-1)


class TestMetaOptNet(LearnerContract):
    covers = (SVMHead,)

    def make_learner(self):
        keras.utils.set_random_seed(0)
        model = models.mlp((DIM,), hidden=(16,), outputs=8, activation="relu",
                           name="embedding")
        return metalearn.EmbeddingLearner(model, head=SVMHead(1.0, scale=2.0, steps=20),
                                          ways=WAYS, metrics={"accuracy": "accuracy"})

    def chance_metrics(self, learner, episodes):
        """Shuffled support labels say nothing about the queries."""
        return learner.meta_metrics(uninformative_support(episodes))
