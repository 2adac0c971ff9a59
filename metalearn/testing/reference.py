"""Gradient checks: a learner's meta-gradient by automatic differentiation, the
independent reference for it (central finite differences in float64), and the check that
compares the two (:func:`assert_meta_gradient_matches_finite_differences`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, List, Sequence, Tuple

import keras
import numpy as np
import tensorflow as tf

if TYPE_CHECKING:
    from metalearn.tasks import Episode


def finite_difference_gradient(fn: Callable[[Dict[str, tf.Tensor]], tf.Tensor],
                               weights: Dict[str, tf.Tensor], eps: float = 1e-5
                               ) -> Dict[str, np.ndarray]:
    """Central differences of scalar ``fn(weights)`` in every element of every weight."""
    fn = tf.function(fn)
    base = {k: tf.convert_to_tensor(v, tf.float64) for k, v in weights.items()}
    grads = {}
    for path, value in base.items():
        flat = value.numpy().ravel()
        grad = np.zeros_like(flat)
        for i in range(flat.size):
            shifted = []
            for sign in (1.0, -1.0):
                moved = flat.copy()
                moved[i] += sign * eps
                point = dict(base)
                point[path] = tf.constant(moved.reshape(value.shape))
                shifted.append(float(fn(point)))
            grad[i] = (shifted[0] - shifted[1]) / (2 * eps)
        grads[path] = grad.reshape(value.shape)
    return grads


def relative_error(a: Dict[str, np.ndarray], b: Dict[str, np.ndarray]) -> float:
    """``||a - b|| / ||b||`` over all entries of two gradient mappings with equal keys."""
    assert sorted(a) == sorted(b), (sorted(a), sorted(b))
    diff = np.sqrt(sum(np.sum((np.asarray(a[k]) - np.asarray(b[k])) ** 2) for k in b))
    norm = np.sqrt(sum(np.sum(np.asarray(b[k]) ** 2) for k in b))
    return float(diff / norm)


def finite_difference_variables(fn: Callable[[], tf.Tensor], variables, eps: float = 1e-5
                                ) -> Dict[str, np.ndarray]:
    """Central differences of scalar ``fn()`` in every element of every variable (by
    path), moving the variables in place and restoring them exactly afterwards."""
    fn = tf.function(fn)
    grads = {}
    for variable in variables:
        original = variable.numpy()
        flat = original.ravel()
        grad = np.zeros(flat.shape, np.float64)
        for i in range(flat.size):
            shifted = []
            for sign in (1.0, -1.0):
                moved = flat.copy()
                moved[i] += sign * eps
                variable.assign(moved.reshape(original.shape))
                shifted.append(float(fn()))
            grad[i] = (shifted[0] - shifted[1]) / (2 * eps)
        variable.assign(original)
        grads[variable.path] = grad.reshape(original.shape)
    return grads


def finite_difference_directions(fn: Callable[[], tf.Tensor], variables,
                                 directions: int = 3, seed: int = 0, eps: float = 1e-5
                                 ) -> Tuple[np.ndarray, np.ndarray]:
    """Central differences of scalar ``fn()`` along random unit directions of all
    ``variables`` at once: the check for models too large to move every element.

    A wrong gradient component changes ``gradient . v`` for almost every random ``v``,
    so ``directions`` derivatives check the whole gradient with ``2 * directions``
    evaluations, whatever the number of weights. The variables are moved in place and
    restored exactly afterwards.

    Returns:
      ``(derivatives [directions], v [directions, total weights])``: compare
      ``derivatives`` with ``v @ flat_gradient``, the gradients flattened in the order
      of ``variables`` (:func:`flat`).
    """
    fn = tf.function(fn)
    variables = list(variables)
    originals = [v.numpy() for v in variables]
    total = sum(o.size for o in originals)
    rng = np.random.default_rng(seed)
    vectors = rng.standard_normal((directions, total))
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    derivatives = np.zeros(directions)
    try:
        for d, vector in enumerate(vectors):
            shifted = []
            for sign in (1.0, -1.0):
                start = 0
                for variable, original in zip(variables, originals):
                    part = vector[start:start + original.size].reshape(original.shape)
                    variable.assign(original + sign * eps * part)
                    start += original.size
                shifted.append(float(fn()))
            derivatives[d] = (shifted[0] - shifted[1]) / (2 * eps)
    finally:
        for variable, original in zip(variables, originals):
            variable.assign(original)
    return derivatives, vectors


def flat(gradients: Sequence[Any]) -> np.ndarray:
    """Gradients (tensors or arrays, in the variables' order) as one float64 vector."""
    return np.concatenate([np.asarray(g, np.float64).ravel() for g in gradients])


def _by_path(learner, grads: Sequence[Any]) -> Dict[str, np.ndarray]:
    missing = [v.path for v, g in zip(learner.meta_variables, grads) if g is None]
    if missing:
        raise AssertionError(f"no meta-gradient reaches {missing}")
    return {v.path: g.numpy() for v, g in zip(learner.meta_variables, grads)}


def analytic_meta_gradient(learner, episodes: Episode, formulation: Any = None
                           ) -> Dict[str, np.ndarray]:
    """The meta-gradient of ``learner.meta_loss(episodes)`` by meta-variable path, the
    tasks run by ``formulation`` (:mod:`metalearn.execution`; ``None``: ``Auto()``)."""
    with tf.GradientTape() as tape:
        loss = learner.meta_loss(episodes, formulation=formulation)
    return _by_path(learner, tape.gradient(loss, learner.meta_variables))


def compiled_meta_gradient(learner, episodes: Episode, formulation: Any = None
                           ) -> Dict[str, np.ndarray]:
    """:func:`analytic_meta_gradient` inside one ``tf.function`` (where ``tf.map_fn`` is a
    graph loop, which ignores custom gradients: what a compiled meta-step sees)."""
    @tf.function
    def meta_gradient(episodes):
        with tf.GradientTape() as tape:
            loss = learner.meta_loss(episodes, formulation=formulation)
        return tape.gradient(loss, learner.meta_variables)
    return _by_path(learner, meta_gradient(episodes))


def assert_meta_gradient_matches_finite_differences(
        learner, episodes: Episode, tolerance: float = 1e-6, eps: float = 1e-5,
        formulation: Any = None) -> Dict[str, np.ndarray]:
    """Checks ``learner``'s meta-gradient on ``episodes`` against central finite
    differences of ``learner.meta_loss(episodes)`` in every element of every meta-variable
    (:func:`finite_difference_variables`): their :func:`relative_error` must be below
    ``tolerance``. Meant for float64 learners and episodes, where ``1e-6`` separates a
    right gradient (typically ``1e-9``) from a wrong one.

    Args:
      learner: a :class:`~metalearn.Learner` (any learner with ``meta_loss`` and
        ``meta_variables``).
      episodes: the batch of tasks.
      tolerance: the largest relative error accepted.
      eps: the finite differences' step.
      formulation: how the tasks run (:mod:`metalearn.execution`); ``None``: ``Auto()``.

    Returns:
      The analytic meta-gradient by variable path (:func:`analytic_meta_gradient`), for
      further checks (e.g. that a learned hyperparameter receives a gradient).

    Raises:
      AssertionError: the relative error is not below ``tolerance`` (the message names
        the variables that differ most), or no gradient reaches a meta-variable.
    """
    analytic = analytic_meta_gradient(learner, episodes, formulation)
    numeric = finite_difference_variables(lambda: learner.meta_loss(
                                              episodes, formulation=formulation),
                                          learner.meta_variables, eps=eps)
    error = relative_error(analytic, numeric)
    if not error < tolerance:
        worst = sorted(numeric, key=lambda k: -float(np.linalg.norm(analytic[k] - numeric[k])))
        shown = ", ".join(f"{k} ({relative_error({k: analytic[k]}, {k: numeric[k]}):.1e})"
                          for k in worst[:3])
        raise AssertionError(f"meta-gradient against finite differences: relative error "
                             f"{error:.2e}, not below {tolerance:g}; most off: {shown}")
    return analytic


def keras_optimizer_trajectory(learner, support_x: Any, support_y: Any, optimizer: Any,
                               steps: int) -> List[Dict[str, np.ndarray]]:
    """The weights after each of ``steps`` ``optimizer.apply_gradients`` calls on the
    learner's support loss, from the learner's initial weights held in fresh variables
    of their dtype: the reference an inner update that claims to equal a Keras
    optimizer (or a Keras optimizer that claims to equal an inner update) is compared
    with, step by step, against ``metalearn.learners.adapt_trajectory(learner, ...)``."""
    variables = {p: keras.Variable(w.numpy(), dtype=w.dtype.name)
                 for p, w in learner.initial_weights().items()}
    trajectory = []
    for _ in range(steps):
        with tf.GradientTape() as tape:
            weights = {p: tf.convert_to_tensor(v) for p, v in variables.items()}
            tape.watch(list(weights.values()))
            loss = learner.support_loss(weights, support_x, support_y)
        grads = tape.gradient(loss, list(weights.values()))
        optimizer.apply_gradients(zip(grads, variables.values()))
        trajectory.append({p: v.numpy() for p, v in variables.items()})
    return trajectory
