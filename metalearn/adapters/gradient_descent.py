"""Functional gradient descent in the inner loop: MAML, first-order MAML, ANIL."""

from __future__ import annotations

import re
from typing import Any, Optional, Sequence

import gin
import tensorflow as tf

from metalearn.adapters.base import Adapter, LossFn
from metalearn.functional import Weights


@gin.configurable
class GradientDescent(Adapter):
    """``steps`` plain gradient steps on the support loss, differentiable end to end.

    Second order (the default) backpropagates through every inner step, Hessian terms
    included; ``first_order=True`` treats each inner gradient as a constant (FOMAML).

    Args:
      steps: inner steps during meta-training.
      learning_rate: inner step size (alpha).
      first_order: drop second-order terms from the meta-gradient.
      adapt: regular expressions over variable paths (``re.search``); only matching
        weights are adapted in the inner loop (e.g. ``("head",)`` for ANIL). ``None``
        adapts every trainable weight.
    """

    def __init__(self, steps: int = 1, learning_rate: float = 0.01,
                 first_order: bool = False, adapt: Optional[Sequence[str]] = None,
                 name: Optional[str] = None):
        super().__init__(name=name)
        if int(steps) < 0:
            raise ValueError(f"steps must be >= 0, got {steps}")
        self.steps = int(steps)
        self.learning_rate = float(learning_rate)
        self.first_order = bool(first_order)
        self.adapt_patterns = None if adapt is None else tuple(adapt)

    def adapted_paths(self, weights: Weights) -> Sequence[str]:
        """Paths of the weights the inner loop changes."""
        if self.adapt_patterns is None:
            return list(weights)
        paths = [p for p in weights if any(re.search(r, p) for r in self.adapt_patterns)]
        if not paths:
            raise ValueError(f"adapt={self.adapt_patterns!r} matches none of the weights "
                             f"{list(weights)}")
        return paths

    def step_size(self, step: int, path: str, dtype: tf.DType) -> tf.Tensor:
        """The inner learning rate of ``path`` at inner step ``step`` (override to learn it)."""
        return tf.constant(self.learning_rate, dtype)

    def adapt(self, weights: Weights, support_x: Any, support_y: Any, loss_fn: LossFn,
              steps: Optional[int] = None) -> Weights:
        steps = self.steps if steps is None else int(steps)
        paths = self.adapted_paths(weights)
        weights = dict(weights)
        for step in range(steps):
            with tf.GradientTape(watch_accessed_variables=False) as tape:
                tape.watch([weights[p] for p in paths])
                loss = loss_fn(weights, support_x, support_y)
            grads = tape.gradient(loss, [weights[p] for p in paths],
                                  unconnected_gradients=tf.UnconnectedGradients.ZERO)
            for path, grad in zip(paths, grads):
                if self.first_order:
                    grad = tf.stop_gradient(grad)
                value = weights[path]
                weights[path] = value - self.step_size(step, path, value.dtype) * grad
        return weights
