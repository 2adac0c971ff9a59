"""Implicit MAML (Rajeswaran et al., 2019): meta-gradients from the implicit function
theorem, with memory independent of the number of inner steps.

The inner problem is proximally regularised towards the initial weights ``theta``::

    phi*(theta) = argmin_phi  L_support(phi) + lambda / 2 * ||phi - theta||^2

At the optimum ``d phi* / d theta = (I + H / lambda)^-1`` with ``H`` the Hessian of
``L_support`` at ``phi*``, so the meta-gradient of a query loss ``L_query(phi*)`` is
``(I + H / lambda)^-1 grad L_query(phi*)``: a linear solve, done with a few steps of
conjugate gradient on Hessian-vector products. Nothing of the inner loop's trajectory is
kept for the backward pass.

Design: the forward pass runs the inner loop as a ``tf.while_loop`` on
``tf.stop_gradient(theta)`` (constant graph size and memory in the number of steps); the
point reached goes through the implicit-differentiation primitive
(:func:`metalearn.adapters.implicit_diff.implicit_solution`) with the optimality condition
``F(phi, theta) = grad L_support(phi) + lambda (phi - theta)``, whose backward pass solves
``(H + lambda I) u = grad L_query(phi)`` by conjugate gradient and returns ``lambda u``. To every caller it is
just another :class:`~metalearn.adapters.Adapter`: the learner, the meta-optimizer and
the training loop are unchanged, except that the learner runs a batch's tasks unrolled
(TensorFlow 2.21 silently ignores a ``tf.custom_gradient`` inside ``tf.map_fn``'s loop,
giving the plain gradient; ``tests/implicit_test.py`` checks the batched path).
"""

from __future__ import annotations

from typing import Any, List, Optional

import gin
import tensorflow as tf

from metalearn.adapters.base import Adapter, Capabilities, LossFn
from metalearn.adapters.implicit_diff import ConjugateGradient, implicit_solution
from metalearn.functional import Weights


def conjugate_gradient(apply_a, b: List[tf.Tensor], steps: int) -> List[tf.Tensor]:
    """``steps`` iterations of conjugate gradient for ``A x = b`` from ``x = 0``
    (:class:`~metalearn.adapters.implicit_diff.ConjugateGradient`)."""
    return ConjugateGradient(steps)(apply_a, b)


@gin.configurable
class ImplicitGradientDescent(Adapter):
    """iMAML's inner loop: gradient descent on the proximally regularised support loss,
    meta-gradient by the implicit function theorem and conjugate gradient.

    The meta-gradient is exact when the inner loop reaches the regularised optimum and
    conjugate gradient has converged (``cg_steps`` >= number of weights for an exact
    solve; the paper uses 5). Every trainable weight is adapted (the implicit gradient
    with respect to non-adapted weights would need mixed second derivatives).

    Args:
      steps: inner gradient steps on ``L_support(phi) + lambda/2 ||phi - theta||^2``.
      learning_rate: inner step size.
      regularization: ``lambda``, the strength of the proximal term (> 0).
      cg_steps: conjugate-gradient iterations in the backward pass.
      clip_norm: if set, each inner update direction (support gradient plus proximal
        term) is clipped to this global norm. The meta-gradient does not depend on the
        inner trajectory, only on the point reached, so any convergent solver is valid;
        clipping keeps plain gradient descent from diverging when meta-training sharpens
        the support loss beyond ``2 / learning_rate`` (seen on sinusoid regression). Off
        by default.
    """

    def __init__(self, steps: int = 10, learning_rate: float = 0.01,
                 regularization: float = 1.0, cg_steps: int = 5,
                 clip_norm: Optional[float] = None, name: Optional[str] = None):
        super().__init__(name=name)
        if int(steps) < 0:
            raise ValueError(f"steps must be >= 0, got {steps}")
        if not float(learning_rate) > 0:
            raise ValueError(f"learning_rate must be > 0, got {learning_rate}")
        if not float(regularization) > 0:
            raise ValueError(f"regularization (lambda) must be > 0, got {regularization}")
        if int(cg_steps) < 1:
            raise ValueError(f"cg_steps must be >= 1, got {cg_steps}")
        if clip_norm is not None and not float(clip_norm) > 0:
            raise ValueError(f"clip_norm must be > 0 (or None for no clipping), got {clip_norm}")
        self.steps = int(steps)
        self.learning_rate = float(learning_rate)
        self.regularization = float(regularization)
        self.cg_steps = int(cg_steps)
        self.clip_norm = None if clip_norm is None else float(clip_norm)

    def own_capabilities(self) -> Capabilities:
        # tf.custom_gradient is ignored inside tf.map_fn; the inner solve and conjugate
        # gradient take dot products over one task's whole weight vector.
        return Capabilities(custom_gradient=True, task_axis=False)

    def adapt(self, weights: Weights, support_x: Any, support_y: Any, loss_fn: LossFn,
              steps: Optional[int] = None) -> Weights:
        steps = self.steps if steps is None else int(steps)
        if steps < 0:
            raise ValueError(f"steps must be >= 0, got {steps}")
        paths = list(weights)
        lam, lr = self.regularization, self.learning_rate

        def support_loss(values):
            return loss_fn(dict(zip(paths, values)), support_x, support_y)

        def support_gradient(values):
            with tf.GradientTape(watch_accessed_variables=False) as tape:
                tape.watch(values)
                loss = support_loss(values)
            return tape.gradient(loss, values,
                                 unconnected_gradients=tf.UnconnectedGradients.ZERO)

        theta = [tf.stop_gradient(weights[p]) for p in paths]

        def body(step, *phi):
            phi = list(phi)
            grads = support_gradient(phi)
            updates = [g + lam * (p - t) for p, g, t in zip(phi, grads, theta)]
            if self.clip_norm is not None:
                updates, _ = tf.clip_by_global_norm(updates, self.clip_norm)
            return [step + 1] + [p - lr * u for p, u in zip(phi, updates)]

        phi = tf.while_loop(lambda step, *_: step < steps, body, [tf.constant(0)] + theta,
                            parallel_iterations=1)[1:]

        def optimality(x, th):  # F(phi, theta) = grad L_support(phi) + lambda (phi - theta)
            return [g + lam * (xi - ti) for g, xi, ti in zip(support_gradient(x), x, th)]

        adapted = implicit_solution(optimality, phi, [weights[p] for p in paths],
                                    ConjugateGradient(self.cg_steps))
        return dict(zip(paths, adapted))
