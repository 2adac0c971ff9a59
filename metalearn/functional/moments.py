"""The one formula for batch moments, exact to every derivative order.

Keras' TensorFlow backend computes BatchNorm's batch variance with ``tf.nn.moments``,
which stops the gradient through the mean inside the variance: harmless for first
derivatives, but it drops a term of the second derivative, so second-order MAML through
BatchNorm is silently wrong (about 5% off on a small network). :func:`batch_moments`
computes the same values with exact derivatives. :func:`exact_moments` routes Keras'
own ``moments`` through it (scoped to the calling thread), and the batched layer rules
(:mod:`metalearn.functional.batched`) call it directly.

Padded episodes (:class:`metalearn.tasks.episode.MaskedLabels`): within
:func:`example_mask`, moments over the example axis are computed over the real examples
only, so BatchNorm normalises a padded batch exactly as it would the episode alone.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator, Optional, Sequence, Tuple

import tensorflow as tf

from metalearn import _compat

__all__ = ["batch_moments", "example_mask", "exact_moments"]


def batch_moments(x: tf.Tensor, axes: Sequence[int], keepdims: bool = False,
                  mask: Optional[tf.Tensor] = None) -> Tuple[tf.Tensor, tf.Tensor]:
    """Mean and (biased) variance of ``x`` over ``axes``, in ``x``'s dtype, computed in
    float32 for float16/bfloat16 inputs (as Keras does). No ``stop_gradient`` on the mean
    inside the variance (unlike ``tf.nn.moments``): same values, exact Hessian.

    ``mask``: ``[d0]`` or ``[d0, d1]`` bool over the leading axes of ``x`` (examples, or
    tasks and examples); the moments are then over the ``True`` entries only. It applies
    when ``axes`` reduce its last axis (the examples) and none before it; otherwise
    (per-example moments, e.g. LayerNorm) it is ignored."""
    x = tf.convert_to_tensor(x)
    original_dtype = x.dtype
    if original_dtype in (tf.float16, tf.bfloat16):
        x = tf.cast(x, tf.float32)
    axes = [a % x.shape.rank for a in axes]
    rank = None if mask is None else mask.shape.rank
    if rank is not None and rank - 1 in axes and not any(a < rank - 1 for a in axes):
        weights = tf.reshape(tf.cast(mask, x.dtype),
                             tf.concat([tf.shape(mask), [1] * (x.shape.rank - rank)], 0))
        count = tf.reduce_sum(tf.broadcast_to(weights, tf.shape(x)), axis=axes,
                              keepdims=True)
        mean = tf.reduce_sum(weights * x, axis=axes, keepdims=True) / count
        variance = tf.reduce_sum(weights * tf.square(x - mean), axis=axes,
                                 keepdims=True) / count
    else:
        mean = tf.reduce_mean(x, axis=axes, keepdims=True)
        variance = tf.reduce_mean(tf.square(x - mean), axis=axes, keepdims=True)
    if not keepdims:
        mean = tf.squeeze(mean, axis=axes)
        variance = tf.squeeze(variance, axis=axes)
    return tf.cast(mean, original_dtype), tf.cast(variance, original_dtype)


_state = threading.local()


@contextlib.contextmanager
def example_mask(mask: Optional[tf.Tensor]) -> Iterator[None]:
    """Within this context (on this thread), batch moments over the example axis
    (BatchNorm in training mode, through :func:`metalearn.functional.call` or the batched
    rules) use only the examples where ``mask`` (``[examples]``, or ``[tasks, examples]``
    for the batched formulation) is ``True``. ``None``: every example (no change)."""
    previous = getattr(_state, "mask", None)
    _state.mask = None if mask is None else tf.convert_to_tensor(mask)
    try:
        yield
    finally:
        _state.mask = previous


def current_example_mask() -> Optional[tf.Tensor]:
    """The mask set by the innermost :func:`example_mask` on this thread, or ``None``."""
    return getattr(_state, "mask", None)


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
    return batch_moments(x, axes, keepdims=keepdims, mask=current_example_mask())


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
