"""The closed-form heads on a bad support set: a support label outside the task's classes
is an error (eagerly and compiled; under XLA a non-finite state), non-finite embeddings
give a skipped step and non-finite predictions rather than a raw TensorFlow error, and
the SVM head on identical support rows (a singular face system) is finite."""

from __future__ import annotations

import math

import numpy as np
import pytest
import tensorflow as tf
import keras

import metalearn
from metalearn import heads, models


# --- heads: labels outside the task's classes, non-finite embeddings ------------


HEADS = {
    "ridge": lambda: heads.RidgeHead(),
    "svm": lambda: heads.SVMHead(steps=5),
    "logistic": lambda: heads.LogisticHead(steps=2),
    "logistic_regression": lambda: heads.LogisticRegressionHead(iterations=2),
    "prototypes": lambda: heads.PrototypeHead(),
    "linear_probe": lambda: heads.LinearProbeHead(steps=2),
}


def _embedding_learner(head, linear=False):
    """A 3-way learner; ``linear``: a linear embedding, through which a NaN input stays
    NaN (a ReLU may turn it into 0)."""
    from metalearn.testing import DIM, WAYS
    from metalearn.testing.contract import contract_model
    keras.utils.set_random_seed(0)
    model = models.mlp((DIM,), hidden=(), outputs=4) if linear else contract_model(ways=4)
    return metalearn.learners.EmbeddingLearner(model, head(), ways=WAYS)


@pytest.mark.parametrize("name", sorted(HEADS))
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "tf.function"])
def test_a_support_label_outside_the_task_classes_is_an_error(name, compiled):
    """A 3-way task whose support set holds label 7 (or -1): every head refuses it,
    naming the label and the number of classes, eagerly and inside a tf.function."""
    from metalearn.testing import synthetic_classification
    learner = _embedding_learner(HEADS[name])
    episode = synthetic_classification(0, tasks=1)
    bad = tf.tensor_scatter_nd_update(episode.support_y[0], [[1]], [7])
    adapt = tf.function(lambda x, y: learner.adapt(x, y)) if compiled else learner.adapt
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError)) as info:
        adapt(episode.support_x[0], bad)
    message = str(info.value)
    assert "outside the 3 classes of the task" in message, message
    assert "7" in message, message
    negative = tf.tensor_scatter_nd_update(episode.support_y[0], [[0]], [-1])
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError), match="-1"):
        adapt(episode.support_x[0], negative)


@pytest.mark.parametrize("name", ["ridge", "prototypes"])
def test_under_xla_a_label_outside_the_classes_gives_a_non_finite_state(name):
    """XLA drops assertions: there the label check makes the fit non-finite (a step the
    non-finite policy stops or skips), never a silently dropped example."""
    head = HEADS[name]()
    head.build(tf.float32)

    def fit(embeddings, labels):
        return head.fit(embeddings, labels, 3)

    state = tf.function(fit, jit_compile=True)(tf.ones([3, 2]), tf.constant([0, 1, 7]))
    assert not np.isfinite(state.numpy()).all()
    state = tf.function(fit, jit_compile=True)(tf.ones([3, 2]), tf.constant([0, 1, 2]))
    assert np.isfinite(state.numpy()).all()


@pytest.mark.parametrize("name", ["svm", "logistic", "logistic_regression", "ridge"])
def test_non_finite_embeddings_in_a_head_are_a_skipped_step(name):
    """A NaN in one support example: the head gives a non-finite state (no raw
    "eigen decomposition" / "not invertible" error), so SkipNonFinite skips the step
    (no variable moves, NON_FINITE flags it) and the next, finite step is applied."""
    from metalearn.outer.guards import NON_FINITE
    from metalearn.testing import synthetic_classification
    from metalearn.training.step import make_meta_step
    learner = _embedding_learner(HEADS[name], linear=True)
    rule = metalearn.outer.SkipNonFinite(metalearn.outer.MetaGradient(
        keras.optimizers.SGD(0.01)))
    rule.build(learner)
    step = make_meta_step(learner, rule, "unrolled")
    episodes = synthetic_classification(0, tasks=2)
    x = episodes.support_x.numpy()
    x[0, 1, :] = np.nan
    poisoned = episodes._replace(support_x=tf.constant(x))
    before = [v.numpy().copy() for v in learner.meta_variables]
    flags = step(poisoned)[NON_FINITE].numpy()
    assert flags.any()
    for b, v in zip(before, learner.meta_variables):
        np.testing.assert_array_equal(b, v.numpy())
    metrics = step(episodes)
    assert not metrics[NON_FINITE].numpy().any()
    assert any(not np.array_equal(b, v.numpy()) for b, v in zip(before, learner.meta_variables))


@pytest.mark.parametrize("name", ["svm", "logistic", "logistic_regression", "ridge"])
def test_non_finite_embeddings_give_non_finite_predictions_not_a_raw_error(name):
    """Eagerly (``adapt``, ``meta_loss``, as evaluation runs them): no raw TensorFlow
    "eigen decomposition" / "matrix is not invertible" error, a non-finite loss instead,
    which the non-finite policy names and skips."""
    from metalearn.testing import synthetic_classification
    learner = _embedding_learner(HEADS[name], linear=True)
    episodes = synthetic_classification(0, tasks=2)
    x = episodes.support_x.numpy()
    x[0, 1, :] = np.inf
    poisoned = episodes._replace(support_x=tf.constant(x))
    losses = learner.meta_metrics(poisoned)["loss"].numpy()
    assert not np.isfinite(losses[0]) and np.isfinite(losses[1]), losses


# --- the SVM head on identical support rows ---------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_svm_head_on_identical_support_rows_is_finite(dtype):
    """Six identical support embeddings, two per class: no class can be told from
    another, so the logits are equal and the loss is ln 3; its gradient is finite."""
    head = heads.SVMHead()
    labels = tf.constant([0, 0, 1, 1, 2, 2])
    embeddings = tf.ones([6, 4], dtype)
    with tf.GradientTape() as tape:
        tape.watch(embeddings)
        logits = head.logits(head.fit_finite(embeddings, labels, 3), embeddings)
        loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
            labels, logits, from_logits=True))
    gradient = tape.gradient(loss, embeddings)
    np.testing.assert_allclose(float(loss), math.log(3), rtol=1e-5)
    assert np.all(np.isfinite(gradient.numpy()))
