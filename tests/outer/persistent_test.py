"""Truncated unrolls and PES on a small unroll whose full gradient is computable: truncated
backpropagation equals the full unroll (and finite differences) when the truncation
covers the horizon and is biased when it does not; PES is unbiased for the full-unroll
gradient (fixed seeds, a tolerance stated from the estimator's standard error) where
truncated ES is not; a resumed run continues its particles exactly; bad input named."""

import numpy as np
import pytest
import tensorflow as tf

from metalearn.outer.persistent import (check_truncation, particles, pes_segment,
                                        truncated_gradient, unroll)

A = tf.constant([[1.0, 0.3], [0.3, 0.5]], tf.float64)
B = tf.constant([1.0, -2.0], tf.float64)
C = tf.constant([0.5, 0.5], tf.float64)
X0 = tf.constant([2.0, 1.0], tf.float64)
THETA = [tf.constant(0.3, tf.float64), tf.constant([0.2, -0.1], tf.float64)]
HORIZON, TRUNCATION = 8, 2


def step(x, theta, t):
    """Gradient descent on ``0.5 x'Ax - (b + offset)'x`` with a meta-learned rate and
    offset; the loss is the distance to a target after the step."""
    rate, offset = theta
    x = x - rate * (tf.linalg.matvec(A, x) - B - offset)
    return x, 0.5 * tf.reduce_sum(tf.square(x - C))


def total_loss(theta):
    return unroll(step, X0, theta, 0, HORIZON)[1]


def flat(tensors):
    return np.concatenate([np.ravel(t) for t in tensors])


def full_gradient():
    return flat(truncated_gradient(step, X0, THETA, 0, HORIZON)[0])


def segments(estimator, seed, population, sigma=1e-3, pes=True):
    """The sum over the horizon's segments of ``estimator``'s estimates."""
    carried, total = particles(X0, THETA, population), None
    for segment in range(HORIZON // TRUNCATION):
        estimate, carried, _ = estimator(step, carried, THETA, segment * TRUNCATION,
                                         TRUNCATION, sigma, tf.constant([seed, segment]),
                                         pes=pes)
        total = flat(estimate) if total is None else total + flat(estimate)
    return total


def test_truncation_covering_the_horizon_is_the_full_unroll():
    theta = [t.numpy() for t in THETA]
    found = full_gradient()
    expected, h = [], 1e-6
    for k, value in enumerate(theta):
        for index in np.ndindex(value.shape or ()):
            up = [np.array(t, copy=True) for t in theta]
            down = [np.array(t, copy=True) for t in theta]
            up[k][index] += h
            down[k][index] -= h
            expected.append((total_loss([tf.constant(u) for u in up]).numpy()
                             - total_loss([tf.constant(d) for d in down]).numpy()) / (2 * h))
    np.testing.assert_allclose(found, expected, rtol=1e-7)
    # shorter segments, each backpropagated alone: biased (the carried state a constant)
    state, truncated = X0, 0.0
    for start in range(0, HORIZON, TRUNCATION):
        gradient, state, _ = truncated_gradient(step, state, THETA, start, TRUNCATION)
        truncated = truncated + flat(gradient)
    assert np.linalg.norm(truncated - found) > 0.1 * np.linalg.norm(found)


pes_function = tf.function(pes_segment, reduce_retracing=True)


def test_pes_is_unbiased_and_truncated_es_is_not():
    """20 independent runs (seeds) of 256 antithetic pairs over the horizon's 4 segments:
    PES's mean is within 4 standard errors of the full-unroll gradient (plus 1e-3 of
    its norm for the O(sigma^2) smoothing); truncated ES's is more than 8 away in some
    coordinate."""
    exact = full_gradient()
    for pes, unbiased in ((True, True), (False, False)):
        runs = np.array([segments(pes_function, seed, 256, pes=pes) for seed in range(20)])
        mean, error = runs.mean(0), runs.std(0, ddof=1) / np.sqrt(len(runs))
        deviation = np.abs(mean - exact)
        if unbiased:
            assert np.all(deviation <= 4 * error + 1e-3 * np.linalg.norm(exact)), \
                (mean, exact, error)
        else:
            assert np.any(deviation > 8 * error), (mean, exact, error)


def test_a_resumed_run_continues_its_particles_exactly():
    whole = segments(pes_segment, seed=3, population=4)
    carried, total = particles(X0, THETA, 4), 0.0
    for segment in range(HORIZON // TRUNCATION):
        if segment == 2:  # "checkpointed" and restored: plain arrays
            carried = type(carried)(*tf.nest.map_structure(
                lambda t: tf.constant(t.numpy()), tuple(carried)))
        estimate, carried, _ = pes_segment(step, carried, THETA, segment * TRUNCATION,
                                           TRUNCATION, 1e-3, tf.constant([3, segment]))
        total = total + flat(estimate)
    np.testing.assert_array_equal(total, whole)


def test_bad_input_is_named():
    with pytest.raises(ValueError, match=r"truncation \(10 steps\) is longer than the "
                                         r"horizon \(8 steps\)"):
        check_truncation(10, 8)
    with pytest.raises(ValueError, match=r"truncation \(3 steps\) must divide the horizon"):
        check_truncation(3, 8)
    with pytest.raises(ValueError, match="truncation must be a whole number >= 1, got 0"):
        check_truncation(0, 8)
    with pytest.raises(ValueError, match=r"population \(antithetic pairs\) must be a whole "
                                         r"number >= 1, got 0"):
        particles(X0, THETA, 0)
    with pytest.raises(ValueError, match=r"pes_segment.sigma \(the noise scale\) must be > 0, "
                                         r"got 0.0"):
        pes_segment(step, particles(X0, THETA, 1), THETA, 0, 2, 0.0, tf.constant([0, 0]))
