"""The one formula for batch moments, exact to every derivative order.

Keras' TensorFlow backend computes BatchNorm's batch variance with ``tf.nn.moments``,
which stops the gradient through the mean inside the variance: harmless for first
derivatives, but it drops a term of the second derivative, so second-order MAML through
BatchNorm is silently wrong (about 5% off on a small network). :func:`batch_moments`
computes the same values with exact derivatives. :func:`exact_moments` routes Keras'
own ``moments`` through it (scoped to the calling thread), and the batched layer rules
(:mod:`metalearn.functional.batched`) call it directly.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator, Optional, Sequence, Tuple

import tensorflow as tf

from metalearn import _compat

__all__ = ["batch_moments", "exact_moments"]


def batch_moments(x: tf.Tensor, axes: Sequence[int], keepdims: bool = False
                  ) -> Tuple[tf.Tensor, tf.Tensor]:
    """Mean and (biased) variance of ``x`` over ``axes``, in ``x``'s dtype, computed in
    float32 for float16/bfloat16 inputs (as Keras does). No ``stop_gradient`` on the mean
    inside the variance (unlike ``tf.nn.moments``): same values, exact Hessian."""
    x = tf.convert_to_tensor(x)
    original_dtype = x.dtype
    if original_dtype in (tf.float16, tf.bfloat16):
        x = tf.cast(x, tf.float32)
    axes = list(axes)
    mean = tf.reduce_mean(x, axis=axes, keepdims=True)
    variance = tf.reduce_mean(tf.square(x - mean), axis=axes, keepdims=True)
    if not keepdims:
        mean = tf.squeeze(mean, axis=axes)
        variance = tf.squeeze(variance, axis=axes)
    return tf.cast(mean, original_dtype), tf.cast(variance, original_dtype)


_state = threading.local()


def _exact_moments_enabled() -> bool:
    return getattr(_state, "depth", 0) > 0


@contextlib.contextmanager
def exact_moments() -> Iterator[None]:
    """Within this context (on this thread), Keras batch moments are exact to all orders."""
    _install_moments_dispatch()
    _state.depth = getattr(_state, "depth", 0) + 1
    try:
        yield
    finally:
        _state.depth -= 1


_install_lock = threading.Lock()
_keras_moments: Optional[Any] = None


def _moments(x, axes, keepdims=False, synchronized=False):
    """Dispatches to :func:`batch_moments` inside :func:`exact_moments`, else to Keras'."""
    if synchronized or not _exact_moments_enabled():
        return _keras_moments(x, axes, keepdims=keepdims, synchronized=synchronized)
    return batch_moments(x, axes, keepdims=keepdims)


def _install_moments_dispatch() -> None:
    """Routes Keras' TensorFlow-backend ``moments`` through :func:`_moments`, once."""
    global _keras_moments
    if _keras_moments is not None:
        return
    with _install_lock:
        if _keras_moments is not None:
            return
        tf_backend_nn = _compat.keras_tf_backend_nn()
        _keras_moments = tf_backend_nn.moments
        tf_backend_nn.moments = _moments
