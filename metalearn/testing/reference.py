"""Independent references for gradient checks: central finite differences in float64."""

from typing import Callable, Dict

import numpy as np
import tensorflow as tf


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
