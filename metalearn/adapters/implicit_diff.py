"""Implicit differentiation as a primitive: gradients through the solution of an
optimality condition, by a linear solve (conjugate gradient or a Neumann series).

Given ``F(x, theta) = 0`` at a solution ``x*`` that any solver found, the implicit
function theorem gives ``dx*/dtheta = -(dF/dx)^-1 dF/dtheta``, so for an upstream
gradient ``v = dL/dx*`` the gradient reaching ``theta`` is ``-(dF/dtheta)^T u`` with
``(dF/dx)^T u = v``. :func:`implicit_solution` returns ``x*`` (as a value; the solver's
iterations are not differentiated) wrapped in a ``tf.custom_gradient`` that does exactly
that, with Jacobian-vector products from nested tapes. Nothing of the solver's
trajectory is kept: memory is independent of its number of iterations.

iMAML (:class:`~metalearn.adapters.ImplicitGradientDescent`) is this primitive with
``F(phi, theta) = grad L_support(phi) + lambda (phi - theta)``; closed-form heads that
need a solver fit the same shape.
"""

from __future__ import annotations

from typing import Callable, List, Sequence

import gin
import tensorflow as tf

Tensors = List[tf.Tensor]
Condition = Callable[[Tensors, Tensors], Tensors]
"""``F(x, theta)``: residuals with ``x``'s structure (a list of tensors)."""


def dot(a: Sequence[tf.Tensor], b: Sequence[tf.Tensor]) -> tf.Tensor:
    """The inner product of two lists of tensors."""
    return tf.add_n([tf.reduce_sum(x * y) for x, y in zip(a, b)])


@gin.configurable
class ConjugateGradient:
    """``steps`` iterations of conjugate gradient for ``A u = b`` from ``u = 0``, for
    symmetric ``A`` (positive definite for convergence); ``damping`` adds ``damping *
    u`` to ``A u``."""

    def __init__(self, steps: int = 5, damping: float = 0.0):
        if int(steps) < 1:
            raise ValueError(f"cg_steps must be >= 1, got {steps}")
        if float(damping) < 0:
            raise ValueError(f"damping must be >= 0, got {damping}")
        self.steps, self.damping = int(steps), float(damping)

    def __call__(self, apply_a: Callable[[Tensors], Tensors], b: Tensors) -> Tensors:
        if self.damping:
            plain = apply_a
            apply_a = lambda u: [au + self.damping * ui for au, ui in zip(plain(u), u)]
        x = [tf.zeros_like(t) for t in b]
        r, p = list(b), list(b)
        rs = dot(r, r)
        for _ in range(self.steps):
            ap = apply_a(p)
            alpha = tf.math.divide_no_nan(rs, dot(p, ap))
            x = [xi + alpha * pi for xi, pi in zip(x, p)]
            r = [ri - alpha * api for ri, api in zip(r, ap)]
            rs_new = dot(r, r)
            beta = tf.math.divide_no_nan(rs_new, rs)
            p = [ri + beta * pi for ri, pi in zip(r, p)]
            rs = rs_new
        return x


@gin.configurable
class Neumann:
    """A truncated Neumann series for ``A u = b``: ``u = alpha sum_k (I - alpha A)^k b``
    over ``steps`` terms; converges when the eigenvalues of ``alpha A`` lie in (0, 2).
    Needs no symmetry."""

    def __init__(self, steps: int = 10, alpha: float = 0.1):
        if int(steps) < 1:
            raise ValueError(f"Neumann steps must be >= 1, got {steps}")
        if not float(alpha) > 0:
            raise ValueError(f"Neumann alpha must be > 0, got {alpha}")
        self.steps, self.alpha = int(steps), float(alpha)

    def __call__(self, apply_a: Callable[[Tensors], Tensors], b: Tensors) -> Tensors:
        term = list(b)
        total = list(b)
        for _ in range(self.steps - 1):
            term = [t - self.alpha * at for t, at in zip(term, apply_a(term))]
            total = [s + t for s, t in zip(total, term)]
        return [self.alpha * s for s in total]


LinearSolver = Callable[[Callable[[Tensors], Tensors], Tensors], Tensors]


def implicit_solution(condition: Condition, solution: Sequence[tf.Tensor],
                      theta: Sequence[tf.Tensor], linear_solver: LinearSolver) -> Tensors:
    """``solution`` (a root of ``condition(x, theta)``), differentiable in ``theta`` by
    the implicit function theorem.

    Args:
      condition: ``F(x, theta)``, residuals with ``x``'s structure.
      solution: ``x*`` found by any solver; its own graph is not differentiated.
      theta: the parameters ``x*`` depends on (tensors gradients should reach).
      linear_solver: solves ``A u = b`` given ``apply_a``, here ``A = (dF/dx)^T``
        applied by a vector-Jacobian product (``ConjugateGradient`` for a symmetric
        ``dF/dx``, e.g. a Hessian plus a proximal term; ``Neumann`` for any).

    Returns:
      ``x*`` as new tensors whose gradient to ``theta`` is the implicit one.
    """
    theta = list(theta)

    @tf.custom_gradient
    def solved(*thetas):
        x = [tf.identity(tf.stop_gradient(s)) for s in solution]

        def grad(*upstream, variables=None):
            upstream = [tf.zeros_like(xi) if u is None else u for u, xi in zip(upstream, x)]
            fixed = [tf.stop_gradient(t) for t in thetas]

            def transpose_jacobian_x(u):  # (dF/dx)^T u, by a vector-Jacobian product
                with tf.GradientTape(watch_accessed_variables=False) as tape:
                    tape.watch(x)
                    residual = condition(x, fixed)
                return tape.gradient(residual, x, output_gradients=u,
                                     unconnected_gradients=tf.UnconnectedGradients.ZERO)

            u = linear_solver(transpose_jacobian_x, upstream)
            with tf.GradientTape(watch_accessed_variables=False) as tape:
                tape.watch(fixed)
                residual = condition(x, fixed)
            theta_grads = tape.gradient(residual, fixed, output_gradients=u,
                                        unconnected_gradients=tf.UnconnectedGradients.ZERO)
            return [-g for g in theta_grads], [None] * len(variables or ())

        return x, grad

    return solved(*theta)
