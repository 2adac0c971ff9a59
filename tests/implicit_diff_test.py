"""The implicit-differentiation primitive against closed-form gradients."""

import numpy as np
import pytest
import tensorflow as tf

from metalearn.adapters.implicit_diff import ConjugateGradient, Neumann, implicit_solution


def _ridge(seed=0, n=6, d=3, mu=0.5):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, d)), rng.normal(size=n), rng.normal(size=d), mu


@pytest.mark.parametrize("solver", [ConjugateGradient(steps=3), Neumann(steps=600, alpha=0.08)],
                         ids=["cg", "neumann"])
def test_ridge_regression_gradient_equals_the_closed_form(solver):
    """x*(theta) = argmin ||A x - theta||^2 + mu ||x||^2, L = c . x*: dL/dtheta =
    A (A^T A + mu I)^-1 c. The solution comes from numpy (no graph to differentiate)."""
    a, theta_value, c, mu = _ridge()
    system = a.T @ a + mu * np.eye(3)
    x_star = np.linalg.solve(system, a.T @ theta_value)
    matrix = tf.constant(a)
    theta = tf.constant(theta_value)

    def optimality(x, th):  # gradient of the objective / 2
        return [tf.linalg.matvec(matrix, tf.linalg.matvec(matrix, x[0]) - th[0],
                                 transpose_a=True) + mu * x[0]]

    with tf.GradientTape() as tape:
        tape.watch(theta)
        x = implicit_solution(optimality, [tf.constant(x_star)], [theta], solver)[0]
        loss = tf.reduce_sum(tf.constant(c) * x)
    np.testing.assert_allclose(x, x_star, rtol=1e-12)
    expected = a @ np.linalg.solve(system, c)
    np.testing.assert_allclose(tape.gradient(loss, theta), expected, rtol=1e-8)


def test_a_non_symmetric_condition_with_neumann():
    """F(x, theta) = M x - theta with M not symmetric: dL/dtheta = M^-T c."""
    m = np.array([[2.0, 0.5], [-0.3, 1.5]])
    theta = tf.constant([1.0, -2.0], tf.float64)
    c = np.array([0.7, 1.1])
    x_star = np.linalg.solve(m, theta.numpy())
    with tf.GradientTape() as tape:
        tape.watch(theta)
        x = implicit_solution(lambda x, th: [tf.linalg.matvec(tf.constant(m), x[0]) - th[0]],
                              [tf.constant(x_star)], [theta], Neumann(steps=300, alpha=0.3))[0]
        loss = tf.reduce_sum(tf.constant(c) * x)
    np.testing.assert_allclose(tape.gradient(loss, theta), np.linalg.solve(m.T, c),
                               rtol=1e-10)


def test_solver_arguments_are_checked():
    with pytest.raises(ValueError, match="cg_steps must be >= 1, got 0"):
        ConjugateGradient(0)
    with pytest.raises(ValueError, match="damping must be >= 0, got -1"):
        ConjugateGradient(3, damping=-1)
    with pytest.raises(ValueError, match="Neumann alpha must be > 0, got 0"):
        Neumann(alpha=0)
