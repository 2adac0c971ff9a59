"""Functional gradient descent in the inner loop: MAML, first-order MAML, ANIL, and the
MAML++ pieces that live in the inner loop (derivative-order annealing, per-step weights
such as per-step BatchNorm)."""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

import gin
import keras
import numpy as np
import tensorflow as tf

from metalearn.adapters.base import Adapter, LossFn, select_paths
from metalearn.functional import Weights


def variable_name(path: str, suffix: str) -> str:
    """A Keras variable name for state belonging to weight ``path`` (no ``/`` allowed)."""
    return re.sub(r"[^A-Za-z0-9_]", "_", path) + "_" + suffix


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
      first_order_steps: MAML++'s derivative-order annealing: the meta-gradient is first
        order while the learner's :attr:`meta_step` is below this, second order from
        then on (switched with a ``tf.where`` on the counter: no retracing). ``0``
        (default) never anneals.
      per_step: regular expressions over variable paths of weights that get their own
        meta-learned copy for every inner step instead of being adapted (MAML++'s
        per-step BatchNorm weights: ``("bn",)`` or ``("gamma", "beta")``). The model
        runs with copy ``k`` whenever it runs with the weights after ``k`` inner steps
        (``k = 0 .. steps``; more steps at test time reuse the last copy). The copies
        start at the model's initial values; the model's own variables for these paths
        are then unused (see :meth:`generated_paths`).
      recompute: trade compute for memory: each inner step is a checkpoint whose
        intermediate activations are not kept for the meta-gradient but recomputed from
        the step's input weights in the backward pass (a ``tf.custom_gradient``; unlike
        ``tf.recompute_grad`` it allows the gradient tape inside the step). Same values
        and meta-gradients. TensorFlow ignores custom gradients inside ``tf.map_fn``, so
        the learner then runs the tasks unrolled (or batched). Cost and savings:
        benchmarks/README.md.
      batch_size: if set, each inner step uses a mini-batch of about this many support
        examples instead of all of them: step ``k`` takes every ``m``-th example from
        position ``k mod m``, with ``m = max(1, n // batch_size)`` for ``n`` support
        examples. Over ``m`` steps every example is used once, and on the samplers'
        class-major support sets each mini-batch holds every class equally (when the
        shots divide evenly). Reptile needs this: with full-batch steps on the same
        examples its update reduces to joint training (Nichol et al., 2018, sec. 5).
        Deterministic, so adaptation stays a pure function of the support set. Not
        available with ``task_batching="batched"``.
    """

    def __init__(self, steps: int = 1, learning_rate: float = 0.01,
                 first_order: bool = False, adapt: Optional[Sequence[str]] = None,
                 first_order_steps: int = 0, per_step: Optional[Sequence[str]] = None,
                 recompute: bool = False, batch_size: Optional[int] = None,
                 name: Optional[str] = None):
        super().__init__(name=name)
        if int(steps) < 0:
            raise ValueError(f"steps must be >= 0, got {steps}")
        if batch_size is not None and int(batch_size) < 1:
            raise ValueError(f"batch_size must be >= 1 (or None for the whole support "
                             f"set), got {batch_size}")
        if not float(learning_rate) > 0:
            raise ValueError(f"learning_rate must be > 0, got {learning_rate} (an inner "
                             "step of gradient descent; a learned rate's initial value)")
        if int(first_order_steps) < 0:
            raise ValueError(f"first_order_steps must be >= 0, got {first_order_steps}")
        self.steps = int(steps)
        self.learning_rate = float(learning_rate)
        self.first_order = bool(first_order)
        self.adapt_patterns = None if adapt is None else tuple(adapt)
        self.first_order_steps = int(first_order_steps)
        self.per_step_patterns = tuple(per_step or ())
        self.recompute = bool(recompute)
        self.batch_size = None if batch_size is None else int(batch_size)
        self._per_step: List[keras.Variable] = []
        self._per_step_paths: List[str] = []

    @property
    def needs_unrolled_tasks(self) -> bool:  # custom gradients are ignored in tf.map_fn
        return self.recompute

    @property
    def supports_task_axis(self) -> bool:  # elementwise steps: see Adapter.supports_task_axis
        return self.batch_size is None  # mini-batches index one task's examples

    # --- which weights ----------------------------------------------------------

    def per_step_paths(self, weights: Weights) -> List[str]:
        """Paths of the weights with one meta-learned copy per inner step."""
        if not self.per_step_patterns:
            return []
        return select_paths(weights, self.per_step_patterns, "per_step")

    def adapted_paths(self, weights: Weights) -> Sequence[str]:
        """Paths of the weights the inner loop changes (never the per-step ones)."""
        per_step = set(self.per_step_paths(weights))
        if self.adapt_patterns is None:
            return [p for p in weights if p not in per_step]
        return select_paths(weights, self.adapt_patterns, "adapt", exclude=per_step)

    def generated_paths(self, weights: Weights) -> Sequence[str]:
        return self.per_step_paths(weights)

    # --- meta-learned state -----------------------------------------------------

    def build(self, model: keras.Model, weights: Weights) -> None:
        paths = self.per_step_paths(weights)
        self._per_step_paths = list(paths)
        self._per_step = [
            keras.Variable(np.repeat(np.asarray(weights[p])[None], self.steps + 1, axis=0),
                           dtype=weights[p].dtype.name, trainable=True,
                           name=variable_name(p, "per_step"))
            for p in paths]  # each [steps + 1, *shape]
        super().build(model, weights)

    @property
    def meta_variables(self) -> List[keras.Variable]:
        return list(self._per_step)

    def step_size(self, step: int, path: str, dtype: tf.DType) -> tf.Tensor:
        """The inner learning rate of ``path`` at inner step ``step`` (override to learn it)."""
        return tf.constant(self.learning_rate, dtype)

    def with_step_weights(self, weights: Weights, step: int) -> Weights:
        """``weights`` with the per-step copies of inner step ``step`` put in."""
        if not self._per_step:
            return weights
        weights = dict(weights)
        index = min(step, self.steps)
        for path, copies in zip(self._per_step_paths, self._per_step):
            weights[path] = tf.convert_to_tensor(copies)[index]
        return weights

    def second_order_weight(self, dtype: tf.DType) -> Optional[tf.Tensor]:
        """1 where this meta-step's gradient is second order, 0 where first order;
        ``None`` when it is fixed (no annealing)."""
        if self.first_order or self.first_order_steps == 0:
            return None
        if self.meta_step is None:
            raise RuntimeError("first_order_steps needs the learner's meta-step counter: "
                               "use this adapter inside a metalearn.Learner")
        return tf.cast(self.meta_step >= self.first_order_steps, dtype)

    # --- the inner loop ---------------------------------------------------------

    def adapt_trajectory(self, weights: Weights, support_x: Any, support_y: Any,
                         loss_fn: LossFn, steps: Optional[int] = None) -> List[Weights]:
        steps = self.steps if steps is None else int(steps)
        if steps < 0:
            raise ValueError(f"steps must be >= 0, got {steps}")
        paths = self.adapted_paths(weights)
        weights = self.with_step_weights(dict(weights), 0)
        trajectory = [weights]
        inner_step = self._recomputed if self.recompute else self.inner_step
        for step in range(steps):
            x, y = self.inner_batch(support_x, support_y, step)
            weights = inner_step(weights, paths, step, x, y, loss_fn)
            trajectory.append(weights)
        return trajectory

    def inner_batch(self, support_x: Any, support_y: Any, step: int) -> Tuple[Any, Any]:
        """The support examples inner step ``step`` uses (see ``batch_size``)."""
        if self.batch_size is None:
            return support_x, support_y
        n = tf.shape(tf.nest.flatten(support_y)[0])[0]
        stride = tf.maximum(n // self.batch_size, 1)
        index = tf.range(step % stride, n, stride)
        take = lambda t: tf.gather(t, index)
        return tf.nest.map_structure(take, support_x), tf.nest.map_structure(take, support_y)

    def inner_step(self, weights: Weights, paths: Sequence[str], step: int,
                   support_x: Any, support_y: Any, loss_fn: LossFn) -> Weights:
        """One gradient step on ``paths`` (inner step number ``step``, from 0)."""
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            tape.watch([weights[p] for p in paths])
            loss = loss_fn(weights, support_x, support_y)
        grads = tape.gradient(loss, [weights[p] for p in paths],
                              unconnected_gradients=tf.UnconnectedGradients.ZERO)
        weights = dict(weights)
        for path, grad in zip(paths, grads):
            grad = self._order(grad)
            value = weights[path]
            weights[path] = value - self.step_size(step, path, value.dtype) * grad
        return self.with_step_weights(weights, step + 1)

    def _recomputed(self, weights: Weights, paths: Sequence[str], step: int,
                    support_x: Any, support_y: Any, loss_fn: LossFn) -> Weights:
        """:meth:`inner_step` as a recompute checkpoint (see ``recompute``)."""
        keys = list(weights)
        run = lambda values: self.inner_step(dict(zip(keys, values)), paths, step,
                                             support_x, support_y, loss_fn)

        @tf.custom_gradient
        def checkpointed(*values):
            result = run(values)

            def grad(*output_grads, variables=None):
                variables = list(variables or [])
                # Inputs that depend on the incoming gradients: the recomputation can
                # only start in the backward pass, and graph optimisation cannot merge
                # it with the forward ops (which would keep their activations alive).
                with tf.control_dependencies(output_grads):
                    inputs = [tf.identity(v) for v in values]
                with tf.GradientTape() as tape:
                    tape.watch(inputs)
                    again = run(inputs)
                grads = tape.gradient([again[k] for k in keys], inputs + variables,
                                      output_gradients=list(output_grads))
                return grads[:len(values)], grads[len(values):]
            return [result[k] for k in keys], grad

        return dict(zip(keys, checkpointed(*[weights[k] for k in keys])))

    def _order(self, grad: tf.Tensor) -> tf.Tensor:
        if self.first_order:
            return tf.stop_gradient(grad)
        second = self.second_order_weight(grad.dtype)
        if second is None:
            return grad
        constant = tf.stop_gradient(grad)  # same value; derivative scaled by 0 or 1
        return constant + second * (grad - constant)

    def adapt(self, weights: Weights, support_x: Any, support_y: Any, loss_fn: LossFn,
              steps: Optional[int] = None) -> Weights:
        return self.adapt_trajectory(weights, support_x, support_y, loss_fn, steps)[-1]
