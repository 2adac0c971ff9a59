"""The implicit-differentiation primitive against closed-form gradients."""

import numpy as np
import pytest
import tensorflow as tf

from metalearn.pieces.implicit_diff import ConjugateGradient, Neumann, implicit_solution


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
    with pytest.raises(ValueError, match="ConjugateGradient.steps must be a whole number >= 1, got 0"):
        ConjugateGradient(0)
    with pytest.raises(ValueError, match="ConjugateGradient.damping must be >= 0, got -1"):
        ConjugateGradient(3, damping=-1)
    with pytest.raises(ValueError, match="Neumann.alpha must be > 0, got 0"):
        Neumann(alpha=0)
    with pytest.raises(ValueError, match="ConjugateGradient.tolerance must be > 0, got 0"):
        ConjugateGradient(3, tolerance=0)


def _matvec(matrix):
    return lambda v: [tf.linalg.matvec(tf.constant(matrix), v[0])]


def test_conjugate_gradient_reports_a_positive_definite_solve():
    rng = np.random.default_rng(1)
    m = rng.normal(size=(6, 6))
    a, b = m @ m.T + np.eye(6), rng.normal(size=6)
    u, info = ConjugateGradient(steps=20, tolerance=1e-9).solve(_matvec(a), [tf.constant(b)])
    np.testing.assert_allclose(u[0], np.linalg.solve(a, b), rtol=1e-7)
    assert float(info["positive_definite"]) == 1.0
    assert float(info["residual"]) < 1e-9
    assert float(info["iterations"]) <= 7  # exact in 6 steps; the rest change nothing
    np.testing.assert_allclose(np.linalg.norm(b - a @ u[0].numpy()) / np.linalg.norm(b),
                               info["residual"], atol=1e-9)
    assert float(info["min_curvature"]) >= np.linalg.eigvalsh(a).min() - 1e-12


def test_conjugate_gradient_reports_an_indefinite_system():
    # Eigenvalues 3, 1, -2: b has a component along the negative one, so some search
    # direction meets p^T A p < 0; CG's answer is then no minimiser of anything.
    q = np.linalg.qr(np.random.default_rng(2).normal(size=(3, 3)))[0]
    a = q @ np.diag([3.0, 1.0, -2.0]) @ q.T
    b = q @ np.array([1.0, 1.0, 1.0])
    _, info = ConjugateGradient(steps=3).solve(_matvec(a), [tf.constant(b)])
    assert float(info["positive_definite"]) == 0.0
    assert float(info["min_curvature"]) < 0
    # Damping past the negative eigenvalue makes it positive definite again.
    _, damped = ConjugateGradient(steps=3, damping=2.5).solve(_matvec(a), [tf.constant(b)])
    assert float(damped["positive_definite"]) == 1.0 and float(damped["residual"]) < 1e-10


def test_neumann_reports_its_residual_and_divergence():
    a = np.diag([1.0, 2.0])
    b = np.array([1.0, 1.0])
    u, info = Neumann(steps=5, alpha=0.25).solve(_matvec(a), [tf.constant(b)])
    np.testing.assert_allclose(info["residual"],
                               np.linalg.norm(b - a @ u[0].numpy()) / np.linalg.norm(b))
    assert float(info["growth"]) < 1 and float(info["iterations"]) == 5
    _, diverging = Neumann(steps=5, alpha=1.5).solve(_matvec(a), [tf.constant(b)])
    assert float(diverging["growth"]) > 1  # |1 - 1.5 * 2| = 2: the series grows


def test_implicit_solution_reports_the_solve_as_gradients():
    """report's gradients are the backward solve's diagnostics."""
    m = np.array([[2.0, 0.5], [0.5, 1.0]])
    theta = tf.constant([1.0, -2.0], tf.float64)
    solver = ConjugateGradient(steps=2)
    handles = [tf.Variable(0.0, dtype=tf.float64) for _ in solver.DIAGNOSTICS]
    with tf.GradientTape() as tape:
        tape.watch(theta)
        x = implicit_solution(lambda x, th: [tf.linalg.matvec(tf.constant(m), x[0]) - th[0]],
                              [tf.constant(np.linalg.solve(m, theta.numpy()))], [theta],
                              solver, report=handles)[0]
        loss = tf.reduce_sum(tf.constant([0.7, 1.1], tf.float64) * x)
    grads = tape.gradient(loss, [theta] + handles)
    np.testing.assert_allclose(grads[0], np.linalg.solve(m.T, [0.7, 1.1]), rtol=1e-12)
    reported = dict(zip(solver.DIAGNOSTICS, [float(g) for g in grads[1:]]))
    _, info = solver.solve(_matvec(m.T), [tf.constant([0.7, 1.1], tf.float64)])
    assert reported == pytest.approx({k: float(v) for k, v in info.items()}, rel=1e-9)
    assert reported["positive_definite"] == 1.0 and reported["iterations"] == 2.0
    with pytest.raises(ValueError, match="one tensor per diagnostic"):
        implicit_solution(lambda x, th: x, [theta], [theta], solver, report=handles[:1])
