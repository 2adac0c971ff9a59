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

from typing import Callable, Dict, List, Optional, Sequence, Tuple

import gin
import tensorflow as tf

from metalearn.ranges import COUNT, NON_NEGATIVE, POSITIVE, check_range

Tensors = List[tf.Tensor]
Condition = Callable[[Tensors, Tensors], Tensors]
"""``F(x, theta)``: residuals with ``x``'s structure (a list of tensors)."""


def dot(a: Sequence[tf.Tensor], b: Sequence[tf.Tensor]) -> tf.Tensor:
    """The inner product of two lists of tensors."""
    return tf.add_n([tf.reduce_sum(x * y) for x, y in zip(a, b)])


SolverInfo = Dict[str, tf.Tensor]
"""A linear solve's diagnostics: scalars by name (see each solver's :meth:`solve`)."""


def _norm(a: Sequence[tf.Tensor]) -> tf.Tensor:
    return tf.sqrt(dot(a, a))


@gin.configurable
class ConjugateGradient:
    """Conjugate gradient for ``A u = b`` from ``u = 0``, for symmetric ``A`` (positive
    definite for convergence); ``damping`` adds ``damping * u`` to ``A u``.

    Runs at most ``steps`` iterations; with ``tolerance`` set, the iterations after the
    relative residual ``||b - A u|| / ||b||`` falls below it change nothing (the graph
    keeps its ``steps`` iterations, so XLA sees a fixed shape).

    :meth:`solve` also returns what the solve met (:data:`DIAGNOSTICS`): the relative
    residual, the iterations used, whether ``p^T A p > 0`` held for every search
    direction ``p`` (``A`` positive definite on the Krylov space CG explored; when it
    does not hold, CG's step is not a minimisation and its answer can point anywhere),
    and the smallest curvature ``p^T A p / p^T p`` seen.
    """

    DIAGNOSTICS = ("residual", "iterations", "positive_definite", "min_curvature")

    def __init__(self, steps: int = 5, damping: float = 0.0,
                 tolerance: Optional[float] = None):
        self.steps = check_range("ConjugateGradient", "steps", steps, COUNT)
        self.damping = check_range("ConjugateGradient", "damping", damping, NON_NEGATIVE)
        self.tolerance = None if tolerance is None else \
            check_range("ConjugateGradient", "tolerance", tolerance, POSITIVE)  # None: all steps

    def __call__(self, apply_a: Callable[[Tensors], Tensors], b: Tensors) -> Tensors:
        return self.solve(apply_a, b)[0]

    def solve(self, apply_a: Callable[[Tensors], Tensors], b: Tensors
              ) -> Tuple[Tensors, SolverInfo]:
        """``u`` with ``A u ~ b``, and the solve's diagnostics (scalars in ``b``'s
        dtype): ``residual`` (``||b - A u|| / ||b||`` by CG's recurrence), ``iterations``
        (those that changed ``u``), ``positive_definite`` (1 if ``p^T A p > 0`` at every
        one of them, else 0), ``min_curvature`` (the smallest ``p^T A p / p^T p``;
        0 when no iteration ran, as for ``b = 0``)."""
        if self.damping:
            plain = apply_a
            apply_a = lambda u: [au + self.damping * ui for au, ui in zip(plain(u), u)]
        dtype = b[0].dtype
        x = [tf.zeros_like(t) for t in b]
        r, p = list(b), list(b)
        rs = dot(r, r)
        b_norm = tf.sqrt(rs)
        iterations = tf.zeros([], dtype)
        positive = tf.ones([], dtype)
        curvature = tf.constant(float("inf"), dtype)
        for _ in range(self.steps):
            active = rs > 0
            if self.tolerance is not None:
                active &= tf.sqrt(rs) > self.tolerance * b_norm
            ap = apply_a(p)
            pap = dot(p, ap)
            pp = dot(p, p)
            seen = tf.where(active, tf.math.divide_no_nan(pap, pp), curvature)
            curvature = tf.minimum(curvature, seen)
            positive = tf.where(active & (pap <= 0), tf.zeros_like(positive), positive)
            iterations += tf.cast(active, dtype)
            alpha = tf.where(active, tf.math.divide_no_nan(rs, pap), tf.zeros_like(rs))
            x = [xi + alpha * pi for xi, pi in zip(x, p)]
            r = [ri - alpha * api for ri, api in zip(r, ap)]
            rs_new = dot(r, r)
            beta = tf.math.divide_no_nan(rs_new, rs)
            p = [ri + beta * pi for ri, pi in zip(r, p)]
            rs = rs_new
        info = {"residual": tf.math.divide_no_nan(tf.sqrt(rs), b_norm),
                "iterations": iterations, "positive_definite": positive,
                "min_curvature": tf.where(iterations > 0, curvature,
                                          tf.zeros_like(curvature))}
        return x, info


@gin.configurable
class Neumann:
    """A truncated Neumann series for ``A u = b``: ``u = alpha sum_k (I - alpha A)^k b``
    over ``steps`` terms; converges when the eigenvalues of ``alpha A`` lie in (0, 2).
    Needs no symmetry.

    :meth:`solve` also returns the relative residual (``b - A u`` is the series' next
    term, ``(I - alpha A)^steps b``: one more product with ``A``) and ``growth``, the
    ratio of the norm of that term to the one before it: above 1 the series diverges
    along ``b`` (``alpha`` too large, or ``A`` not positive definite there).
    """

    DIAGNOSTICS = ("residual", "iterations", "growth")

    def __init__(self, steps: int = 10, alpha: float = 0.1):
        self.steps = check_range("Neumann", "steps", steps, COUNT)
        self.alpha = check_range("Neumann", "alpha", alpha, POSITIVE)

    def __call__(self, apply_a: Callable[[Tensors], Tensors], b: Tensors) -> Tensors:
        return self.solve(apply_a, b)[0]

    def _next(self, apply_a, term: Tensors) -> Tensors:
        return [t - self.alpha * at for t, at in zip(term, apply_a(term))]

    def solve(self, apply_a: Callable[[Tensors], Tensors], b: Tensors
              ) -> Tuple[Tensors, SolverInfo]:
        """``u`` and the diagnostics ``residual`` (``||b - A u|| / ||b||``),
        ``iterations`` (``steps``) and ``growth`` (see the class)."""
        term = list(b)
        total = list(b)
        for _ in range(self.steps - 1):
            term = self._next(apply_a, term)
            total = [s + t for s, t in zip(total, term)]
        residual = self._next(apply_a, term)  # b - A u
        last = _norm(residual)
        info = {"residual": tf.math.divide_no_nan(last, _norm(b)),
                "iterations": tf.constant(float(self.steps), b[0].dtype),
                "growth": tf.math.divide_no_nan(last, _norm(term))}
        return [self.alpha * s for s in total], info


LinearSolver = Callable[[Callable[[Tensors], Tensors], Tensors], Tensors]
"""A linear solver: ``solver(apply_a, b) -> x`` with ``apply_a(x)`` the product ``A x``
(:class:`ConjugateGradient`, :class:`Neumann`, or any callable of that signature; one with
a ``solve`` method also reports its diagnostics)."""


def _solve(linear_solver: LinearSolver, apply_a, b: Tensors) -> Tuple[Tensors, SolverInfo]:
    """``linear_solver``'s answer and diagnostics (none for a plain callable)."""
    if hasattr(linear_solver, "solve"):
        return linear_solver.solve(apply_a, b)
    return linear_solver(apply_a, b), {}


def diagnostic_names(linear_solver: LinearSolver) -> Tuple[str, ...]:
    """The names of what ``linear_solver`` reports (its ``DIAGNOSTICS``; none for a plain
    callable), in the order :func:`implicit_solution`'s ``report`` takes them."""
    return tuple(getattr(linear_solver, "DIAGNOSTICS", ()))


def implicit_solution(condition: Condition, solution: Sequence[tf.Tensor],
                      theta: Sequence[tf.Tensor], linear_solver: LinearSolver,
                      report: Sequence[tf.Tensor] = (),
                      transpose_jacobian: Optional[
                          Callable[[Tensors, Tensors, Tensors], Tensors]] = None
                      ) -> Tensors:
    """``solution`` (a root of ``condition(x, theta)``), differentiable in ``theta`` by
    the implicit function theorem.

    Args:
      condition: ``F(x, theta)``, residuals with ``x``'s structure.
      solution: ``x*`` found by any solver; its own graph is not differentiated.
      theta: the parameters ``x*`` depends on (tensors gradients should reach).
      linear_solver: solves ``A u = b`` given ``apply_a``, here ``A = (dF/dx)^T``
        applied by a vector-Jacobian product (``ConjugateGradient`` for a symmetric
        ``dF/dx``, e.g. a Hessian plus a proximal term; ``Neumann`` for any).
      report: scalar tensors, one per name of :func:`diagnostic_names` (or none): the
        linear solve's diagnostics come back as their gradients. The solve runs in the
        backward pass, so this is how its figures leave it: differentiating the loss
        with respect to ``report[i]`` gives diagnostic ``i`` of that solve (the sum over
        solves, where several read the same tensor). Their values are not used.
      transpose_jacobian: ``transpose_jacobian(x, theta, u)``, a replacement for the
        vector-Jacobian product ``(dF/dx)^T u`` in the linear system, e.g. a
        positive-definite curvature (Gauss-Newton) where ``dF/dx`` need not be one. The
        gradient is then the implicit one of that system: exact where the two agree,
        an approximation elsewhere. ``dF/dtheta`` still comes from ``condition``.

    Returns:
      ``x*`` as new tensors whose gradient to ``theta`` is the implicit one.
    """
    theta = list(theta)
    report = list(report)
    names = diagnostic_names(linear_solver)
    if report and len(report) != len(names):
        raise ValueError(f"report needs one tensor per diagnostic of "
                         f"{type(linear_solver).__name__} {names}, got {len(report)}")
    count = len(theta)

    @tf.custom_gradient
    def solved(*inputs):
        thetas, handles = inputs[:count], inputs[count:]
        x = [tf.identity(tf.stop_gradient(s)) for s in solution]

        def grad(*upstream, variables=None):
            upstream = [tf.zeros_like(xi) if u is None else u for u, xi in zip(upstream, x)]
            fixed = [tf.stop_gradient(t) for t in thetas]

            def transpose_jacobian_x(u):  # (dF/dx)^T u, by a vector-Jacobian product
                if transpose_jacobian is not None:
                    return transpose_jacobian(x, fixed, u)
                with tf.GradientTape(watch_accessed_variables=False) as tape:
                    tape.watch(x)
                    residual = condition(x, fixed)
                return tape.gradient(residual, x, output_gradients=u,
                                     unconnected_gradients=tf.UnconnectedGradients.ZERO)

            u, info = _solve(linear_solver, transpose_jacobian_x, upstream)
            with tf.GradientTape(watch_accessed_variables=False) as tape:
                tape.watch(fixed)
                residual = condition(x, fixed)
            theta_grads = tape.gradient(residual, fixed, output_gradients=u,
                                        unconnected_gradients=tf.UnconnectedGradients.ZERO)
            reported = [tf.cast(info[n], h.dtype) for n, h in zip(names, handles)]
            return [-g for g in theta_grads] + reported, [None] * len(variables or ())

        return x, grad

    return solved(*theta, *report)
