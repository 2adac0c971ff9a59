"""Implicit MAML (Rajeswaran et al., 2019): meta-gradients from the implicit function
theorem, with memory independent of the number of inner steps.

The inner problem is proximally regularised towards the initial weights ``theta``::

    phi*(theta) = argmin_phi  L_support(phi) + lambda / 2 * ||phi - theta||^2

At the optimum ``d phi* / d theta = (I + H / lambda)^-1`` with ``H`` the Hessian of
``L_support`` at ``phi*``, so the meta-gradient of a query loss ``L_query(phi*)`` is
``(I + H / lambda)^-1 grad L_query(phi*)``: a linear solve, done with a few steps of
conjugate gradient on Hessian-vector products. Nothing of the inner loop's trajectory is
kept for the backward pass.

Design: the forward pass is an ordinary inner loop built from the pieces, a
:class:`~metalearn.adapters.GradientDescent` whose update starts with the proximal term
(:class:`~metalearn.adapters.updates.Proximal`, then any update transform: plain steps,
an inner optimizer, a mask) and whose steps run in a ``tf.while_loop``
(:class:`~metalearn.adapters.wrappers.WhileLoop`: constant graph size and memory in the
number of steps), on ``tf.stop_gradient(theta)``; the point reached goes through the
implicit-differentiation primitive
(:func:`metalearn.pieces.implicit_diff.implicit_solution`) with the optimality condition
``F(phi, theta) = grad L_support(phi) + lambda (phi - theta)``, whose backward pass solves
``(H + lambda I) u = grad L_query(phi)`` by conjugate gradient and returns ``lambda u``. To every caller it is
just another :class:`~metalearn.adapters.Adapter`: the learner, the meta-optimizer and
the training loop are unchanged, except that the learner runs a batch's tasks unrolled
(TensorFlow 2.21 silently ignores a ``tf.custom_gradient`` inside ``tf.map_fn``'s loop,
giving the plain gradient; ``tests/adapters/implicit_test.py`` checks the batched path).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import gin
import keras
import tensorflow as tf

from metalearn.adapters.base import Adapter
from metalearn.adapters.gradient_descent import GradientDescent
from metalearn.adapters.updates import (Chain, ClipByGlobalNorm, Proximal, Update,
                                        update_or_rate)
from metalearn.adapters.wrappers import StepWrapper, WhileLoop
from metalearn.functional import Weights
from metalearn.pieces import (COUNT, POSITIVE, STEPS, Capabilities, LossFn, SplitLoss,
                              check_range)
from metalearn.pieces.implicit_diff import (ConjugateGradient, LinearSolver, Neumann,
                                            diagnostic_names, dot, implicit_solution)


def conjugate_gradient(apply_a, b: List[tf.Tensor], steps: int) -> List[tf.Tensor]:
    """``steps`` iterations of conjugate gradient for ``A x = b`` from ``x = 0``
    (:class:`~metalearn.pieces.implicit_diff.ConjugateGradient`)."""
    return ConjugateGradient(steps)(apply_a, b)


def gauss_newton_product(loss_fn: SplitLoss, weights: Weights, x: Any, y: Any,
                         vector: Weights) -> Weights:
    """``J^T H_out J v``: the Gauss-Newton matrix of ``loss_fn`` at ``weights`` times
    ``vector``, with ``J`` the Jacobian of the model's outputs in the weights and
    ``H_out`` the Hessian of the loss in the outputs. ``vector`` may hold some of the
    paths of ``weights`` (the adapted ones): ``J`` is then the Jacobian in those alone,
    the others held at their values, and the product has ``vector``'s paths.

    Positive semi-definite wherever the loss is convex in the outputs (cross-entropy on
    logits, squared error), whatever the network; equal to the Hessian of the loss when
    the outputs are linear in the weights, or at a point where the loss's gradient in
    the outputs is zero. ``J v`` comes from forward-mode differentiation, ``H_out`` from
    a Hessian-vector product on the outputs alone, ``J^T`` from one backward pass.
    """
    paths = list(vector)
    values = [weights[p] for p in paths]
    zero = tf.UnconnectedGradients.ZERO
    with tf.GradientTape(watch_accessed_variables=False) as tape:
        tape.watch(values)
        with tf.autodiff.ForwardAccumulator(values, [vector[p] for p in paths]) as acc:
            outputs = loss_fn.outputs({**weights, **dict(zip(paths, values))}, x, y)
    flat = tf.nest.flatten(outputs)
    jv = [acc.jvp(o, unconnected_gradients=zero) for o in flat]
    fixed = [tf.stop_gradient(o) for o in flat]
    with tf.GradientTape(watch_accessed_variables=False) as outer:
        outer.watch(fixed)
        with tf.GradientTape(watch_accessed_variables=False) as inner:
            inner.watch(fixed)
            loss = loss_fn.loss(y, tf.nest.pack_sequence_as(outputs, fixed))
        along = dot(inner.gradient(loss, fixed, unconnected_gradients=zero), jv)
    h_jv = outer.gradient(along, fixed, unconnected_gradients=zero)
    product = tape.gradient(flat, values, output_gradients=h_jv, unconnected_gradients=zero)
    return dict(zip(paths, product))


CURVATURES = ("hessian", "gauss_newton")


class _Handles:
    """Plain holder of the gradient-metric handles: neither ``tf.Module`` nor the
    checkpoint looks inside it, so they are never saved or meta-trained."""

    def __init__(self, variables: Dict[str, tf.Variable]):
        self.variables = variables


INNER_METRICS = ("inner_support_loss", "inner_distance", "inner_optimality")



@gin.configurable
class ImplicitGradientDescent(Adapter):
    """iMAML's inner loop: gradient descent on the proximally regularised support loss,
    meta-gradient by the implicit function theorem and conjugate gradient.

    The inner solve is an ordinary :class:`~metalearn.adapters.GradientDescent`
    (:attr:`inner`) whose update is ``[Proximal(regularization), ClipByGlobalNorm
    (clip_norm) if set, update]`` and whose steps run in a
    :class:`~metalearn.adapters.wrappers.WhileLoop`, so any update transform composes
    with it: an inner optimizer (``update=InnerAdam(0.01)``), a mask
    (``update=[Mask(("head",)), GradientStep(0.1)]``: only the matching weights are
    adapted, the others take their implicit gradient through the mixed second
    derivatives of the support loss), mini-batches (``wrappers=[MiniBatches(n)]``).

    The meta-gradient is exact when the inner loop reaches the regularised optimum and
    conjugate gradient has converged (``cg_steps`` >= number of adapted weights for an
    exact solve; the paper uses 5). It depends only on the point reached, not on the
    path, so the inner update may not meta-learn anything (no :class:`Learned`
    hyperparameter, no per-step weights: :meth:`build` refuses them).

    What it reports (:meth:`adapt_and_measure`, per task, in training and evaluation):
    ``inner_support_loss`` (the support loss at ``phi``, the proximal term aside),
    ``inner_distance`` (``||phi - theta||``) and ``inner_optimality``
    (``||F(phi)|| / ||F(theta)||`` with ``F(phi) = grad L_support(phi) + lambda (phi -
    theta)``: 0 at the optimum the implicit gradient assumes, 1 where the loop did not
    move), all over the adapted weights. In training also the linear solve's
    diagnostics, as ``cg_residual``, ``cg_iterations``, ``cg_positive_definite`` (the
    fraction of tasks whose system was positive definite along the CG path) and
    ``cg_min_curvature`` (``neumann_...`` for a
    :class:`~metalearn.pieces.implicit_diff.Neumann` solver), through
    :attr:`~metalearn.pieces.Piece.gradient_metrics`.

    Args:
      steps: inner steps on ``L_support(phi) + lambda/2 ||phi - theta||^2``.
      learning_rate: the inner step size of the default update,
        ``GradientStep(learning_rate)`` (0.01 when not given). Give either this or
        ``update``.
      regularization: ``lambda``, the strength of the proximal term (> 0).
      cg_steps: conjugate-gradient iterations in the backward pass.
      clip_norm: if set, each inner update direction (support gradient plus proximal
        term) is clipped to this global norm before ``update`` sees it. The
        meta-gradient does not depend on the inner trajectory, only on the point
        reached, so any convergent solver is valid; clipping keeps plain gradient
        descent from diverging when meta-training sharpens the support loss beyond
        ``2 / learning_rate`` (seen on sinusoid regression). Off by default.
      linear_solver: the solver of ``(H + lambda I) u = grad L_query``; defaults to
        ``ConjugateGradient(cg_steps)`` (give one to set its ``damping`` or
        ``tolerance``, or a ``Neumann`` series).
      curvature: what stands for ``H`` in that system. ``"hessian"`` (default): the
        Hessian of the support loss at ``phi``, exact at the proximal optimum, but
        ``H + lambda I`` is indefinite wherever ``phi`` is not a minimum (a saddle, or
        an inner loop stopped early on a non-convex net), and conjugate gradient then
        steps along negative curvature. ``"gauss_newton"``: ``J^T H_out J``
        (:func:`gauss_newton_product`), positive semi-definite for a loss convex in the
        model's outputs, so ``G + lambda I`` is positive definite and CG converges;
        equal to ``H`` for outputs linear in the weights and at a zero-residual fit, an
        approximation elsewhere. It needs the loss in two halves
        (:class:`~metalearn.pieces.SplitLoss`, which :class:`~metalearn.Learner`
        gives unless ``support_loss`` is overridden).
      update: the inner update transform (or a list of them, chained) that follows the
        proximal term: an inner optimizer, a mask; default ``GradientStep(learning_rate)``.
      wrappers: step wrappers of the inner solve; a
        :class:`~metalearn.adapters.wrappers.WhileLoop` is added unless one of them runs
        the steps.
    """

    def __init__(self, steps: int = 10, learning_rate: Optional[float] = None,
                 regularization: float = 1.0, cg_steps: int = 5,
                 clip_norm: Optional[float] = None,
                 linear_solver: Optional[LinearSolver] = None, curvature: str = "hessian",
                 update: Union[Update, Sequence[Update], None] = None,
                 wrappers: Sequence[StepWrapper] = (), name: Optional[str] = None):
        super().__init__(name=name)
        owner = "ImplicitGradientDescent"
        steps = check_range(owner, "steps", steps, STEPS)
        if learning_rate is not None:
            check_range(owner, "learning_rate", learning_rate, POSITIVE)
        cg_steps = check_range(owner, "cg_steps", cg_steps, COUNT)
        if clip_norm is not None:  # None: no clipping
            clip_norm = check_range(owner, "clip_norm", clip_norm, POSITIVE)
        check_range(owner, "regularization", regularization, POSITIVE)
        if linear_solver is not None and not callable(linear_solver):
            raise TypeError(f"linear_solver must be callable(apply_a, b), e.g. "
                            f"ConjugateGradient(5, damping=1.0), got {linear_solver!r}")
        if curvature not in CURVATURES:
            raise ValueError(f"curvature must be one of {CURVATURES}, got {curvature!r}")
        # Every argument of the pieces built here explicit: a base file's gin bindings of
        # GradientDescent, GradientStep, WhileLoop, ... are not this solve's.
        update = update_or_rate("ImplicitGradientDescent", learning_rate, update)
        self.proximal = Proximal(regularization, name=None)
        chain = [self.proximal]
        if clip_norm is not None:
            chain.append(ClipByGlobalNorm(clip_norm, name=None))
        wrappers = list(wrappers)
        if not any(isinstance(w, StepWrapper) and w.runs_steps for w in wrappers):
            wrappers.append(WhileLoop(parallel_iterations=1, name=None))
        self.inner = GradientDescent(steps, learning_rate=None, first_order=False,
                                     update=Chain(*chain, update, name=None),
                                     wrappers=wrappers, name=None)
        self.curvature = curvature
        self.steps = int(steps)
        self.cg_steps = int(cg_steps)
        self.clip_norm = None if clip_norm is None else float(clip_norm)
        self._solver = linear_solver
        self._handles = _Handles({})

    @property
    def regularization(self) -> float:
        """``lambda``, the strength of the proximal term (settable)."""
        return self.proximal.regularization

    @regularization.setter
    def regularization(self, value: float) -> None:
        self.proximal.regularization = check_range("ImplicitGradientDescent",
                                                   "regularization", value, POSITIVE)

    @property
    def learning_rate(self) -> Optional[float]:
        """The rate of a plain ``GradientStep`` inner update (``None`` for another)."""
        return self.inner.learning_rate

    @property
    def linear_solver(self) -> LinearSolver:
        """The solver of the backward pass's system."""
        return self._solver if self._solver is not None else ConjugateGradient(self.cg_steps)

    def _diagnostic_names(self) -> List[str]:
        prefix = "neumann" if isinstance(self.linear_solver, Neumann) else "cg"
        return [f"{prefix}_{n}" for n in diagnostic_names(self.linear_solver)]

    def build(self, model: keras.Model, weights: Weights) -> None:
        self.inner.build(model, weights)
        learned = self.inner.meta_variables
        if learned:
            raise ValueError(
                f"ImplicitGradientDescent's inner solve cannot meta-learn "
                f"{[v.name for v in learned]}: the implicit meta-gradient depends only on "
                f"the point the solve reaches, so no gradient would reach them (use fixed "
                f"hyperparameters, no Learned(...) or PerStepWeights, in update= and "
                f"wrappers=)")
        dtype = next(iter(weights.values())).dtype if weights else tf.float32
        dtype = dtype if dtype == tf.float64 else tf.float32
        self._handles = _Handles({name: tf.Variable(tf.zeros([], dtype), name=name)
                                  for name in self._diagnostic_names()})
        super().build(model, weights)

    def own_gradient_metrics(self) -> Dict[str, tf.Variable]:
        return dict(self._handles.variables)

    @property
    def metric_names(self) -> Tuple[str, ...]:
        return INNER_METRICS

    def own_capabilities(self) -> Capabilities:
        # tf.custom_gradient is ignored inside tf.map_fn; conjugate gradient takes dot
        # products over one task's whole weight vector.
        return Capabilities(custom_gradient=True, task_axis=False)

    def adapt(self, weights: Weights, support_x: Any, support_y: Any, loss_fn: LossFn,
              steps: Optional[int] = None) -> Weights:
        return self._adapt(weights, support_x, support_y, loss_fn, steps, measure=False)[0]

    def adapt_and_measure(self, weights: Weights, support_x: Any, support_y: Any,
                          loss_fn: LossFn, steps: Optional[int] = None
                          ) -> Tuple[Weights, Dict[str, tf.Tensor]]:
        return self._adapt(weights, support_x, support_y, loss_fn, steps, measure=True)

    def _adapt(self, weights, support_x, support_y, loss_fn, steps, measure):
        steps = self.steps if steps is None else \
            check_range("ImplicitGradientDescent", "steps", steps, STEPS)
        if self.curvature == "gauss_newton" and not isinstance(loss_fn, SplitLoss):
            raise ValueError(
                f"ImplicitGradientDescent(curvature='gauss_newton') needs the support loss "
                f"as model outputs and a loss of them (metalearn.pieces.SplitLoss), got "
                f"{loss_fn!r}: a Learner gives one unless its subclass overrides "
                f"support_loss (override task_loss and forward instead), or use "
                f"curvature='hessian'")
        every = list(weights)  # theta: every weight, the adapted ones and the rest
        paths = self.inner.adapted_paths(weights)
        index = {p: i for i, p in enumerate(every)}
        lam = self.regularization

        def at(x, th):  # the weights th with the adapted ones at x
            full = dict(zip(every, th))
            full.update(zip(paths, x))
            return full

        def support_gradient(x, th, with_loss=False):
            with tf.GradientTape(watch_accessed_variables=False) as tape:
                tape.watch(x)
                loss = loss_fn(at(x, th), support_x, support_y)
            grads = tape.gradient(loss, x, unconnected_gradients=tf.UnconnectedGradients.ZERO)
            return (loss, grads) if with_loss else grads

        def optimality(x, th):  # F(phi, theta) = grad L_support(phi) + lambda (phi - theta)
            return [g + lam * (xi - th[index[p]])
                    for g, xi, p in zip(support_gradient(x, th), x, paths)]

        theta = [tf.stop_gradient(weights[p]) for p in every]
        solved = self.inner.adapt(dict(zip(every, theta)), support_x, support_y, loss_fn,
                                  steps=steps)
        phi = [tf.convert_to_tensor(solved[p]) for p in paths]

        transpose_jacobian = None
        if self.curvature == "gauss_newton":
            def transpose_jacobian(x, th, u):  # (G + lambda I) u, G symmetric
                product = gauss_newton_product(loss_fn, at(x, th), support_x, support_y,
                                               dict(zip(paths, u)))
                return [product[p] + lam * ui for p, ui in zip(paths, u)]

        handles = list(self._handles.variables.values()) if measure else []
        adapted = implicit_solution(optimality, phi, [weights[p] for p in every],
                                    self.linear_solver, report=handles,
                                    transpose_jacobian=transpose_jacobian)
        adapted = {**weights, **dict(zip(paths, adapted))}
        if not measure:
            return adapted, {}
        start_theta = [theta[index[p]] for p in paths]
        loss, grads = support_gradient(phi, theta, with_loss=True)
        residual = tf.linalg.global_norm(
            [g + lam * (x - t) for g, x, t in zip(grads, phi, start_theta)])
        # F(theta) = grad L_support(theta): phi = theta before the first step
        start = residual if steps == 0 else tf.linalg.global_norm(
            support_gradient(start_theta, theta))
        metrics = {"inner_support_loss": loss,
                   "inner_distance": tf.linalg.global_norm(
                       [x - t for x, t in zip(phi, start_theta)]),
                   "inner_optimality": tf.math.divide_no_nan(residual, start)}
        return adapted, {k: tf.stop_gradient(tf.cast(v, loss.dtype)) for k, v in metrics.items()}
