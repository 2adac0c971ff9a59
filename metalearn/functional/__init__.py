"""Functional view of an unmodified Keras 3 model: weights as tensors, forward with given weights.

This module is the one seam between metalearn and Keras internals. Everything above it
sees a model's weights as a ``Weights`` mapping from variable path (``"dense/kernel"``)
to tensor, and runs the model with :func:`call`, which goes through Keras 3's
``stateless_call``: no layer is rewritten, no attribute is patched, no model is copied,
and no variable is ever assigned.

BatchNorm: with ``training=True`` a ``BatchNormalization`` layer normalises with the
statistics of the batch it sees (as in the MAML paper). The moving statistics it would
update are returned by ``stateless_call`` and discarded, so inner steps never pollute
them. Keras' TensorFlow backend computes batch variance with ``tf.nn.moments``, which
stops the gradient through the mean inside the variance: harmless for first derivatives,
but it drops a term of the second derivative, so second-order MAML through BatchNorm is
silently wrong (about 5% off on a small network). :func:`call` computes the moments
exactly instead (identical forward values, correct derivatives of every order); the
switch is scoped to the calling thread and to :func:`call` itself.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping

import keras
import tensorflow as tf

from metalearn.functional.losses import (Gaussian, gaussian_nll, predictive_mse,
                                          softmax_cross_entropy)
from metalearn.functional.moments import batch_moments, exact_moments, example_mask

Weights = Dict[str, tf.Tensor]
"""A model's weights by variable path, e.g. ``{"dense/kernel": <tf.Tensor [1, 40]>, ...}``."""

__all__ = ["Weights", "layer", "metric_dtype", "full_precision", "variables", "weights", "call",
           "call_and_update", "check_built", "exact_moments", "batch_moments", "example_mask",
           "softmax_cross_entropy", "Gaussian", "gaussian_nll", "predictive_mse"]


def check_built(model: keras.Model) -> None:
    """Raises ``ValueError`` unless ``model`` is a built Keras model with trainable weights."""
    if not isinstance(model, keras.Model):
        raise TypeError(f"expected a keras.Model, got {type(model).__name__}: {model!r}")
    if model.built and model.weights and not model.trainable_variables:
        raise ValueError(
            f"model {model.name!r} is built but has no trainable weights (its "
            f"{len(model.weights)} weights are all frozen: model.trainable or a layer's "
            "trainable is False): the inner loop adapts and the outer step learns "
            "trainable weights; set trainable = True on the layers to learn")
    if not model.built or not model.trainable_variables:
        raise ValueError(
            f"model {model.name!r} has no trainable weights yet: build it first "
            "(give it a keras.Input, call model.build(input_shape), or call it on a batch)")


def layer(model: keras.Model, name: str) -> keras.layers.Layer:
    """``model``'s layer called ``name``; ``ValueError`` listing its layers if none is."""
    try:
        return model.get_layer(name)
    except ValueError as error:
        raise ValueError(f"model {model.name!r} has no layer {name!r}; its layers are "
                         f"{[layer.name for layer in model.layers]}") from error


def variables(model: keras.Model) -> Dict[str, keras.Variable]:
    """The model's trainable variables by path, in ``model.trainable_variables`` order."""
    check_built(model)
    by_path: Dict[str, keras.Variable] = {}
    for variable in model.trainable_variables:
        if variable.path in by_path:
            raise ValueError(f"model {model.name!r} has two trainable variables at path "
                             f"{variable.path!r}; give its layers unique names")
        by_path[variable.path] = variable
    return by_path


def metric_dtype(model: keras.Model) -> tf.DType:
    """The dtype of a model's losses, metrics and meta-gradients: float64 for a float64
    model, float32 otherwise (a mixed-precision model's outputs are cast up to it)."""
    check_built(model)
    dtype = tf.as_dtype(model.trainable_variables[0].dtype)
    return tf.float64 if dtype == tf.float64 else tf.float32


def full_precision(outputs: Any, dtype: tf.DType) -> Any:
    """Outputs of a mixed-precision model (float16/bfloat16) cast to ``dtype`` (the
    learner's metric dtype, :func:`metric_dtype`), so losses, metrics and meta-gradients
    are float32."""
    low = (tf.float16, tf.bfloat16)
    return tf.nest.map_structure(lambda t: tf.cast(t, dtype) if t.dtype in low else t,
                                 outputs)


def weights(model: keras.Model) -> Weights:
    """Reads the model's trainable weights as tensors.

    The read is recorded by any active ``tf.GradientTape``, so gradients taken with
    respect to ``model.trainable_variables`` flow through everything computed from the
    returned tensors.
    """
    return {path: tf.convert_to_tensor(v) for path, v in variables(model).items()}


def call(model: keras.Model, weights: Mapping[str, tf.Tensor], inputs: Any,
         training: bool = True, **kwargs: Any) -> Any:
    """Runs ``model`` on ``inputs`` with the given weights instead of its variables.

    Args:
      model: a built Keras model, left untouched.
      weights: tensors by variable path. Paths missing from it take the model's current
        variable values, so a partial mapping (only the head, say) is fine.
      inputs: the model's input.
      training: passed to the model; ``True`` makes BatchNorm use batch statistics.
      **kwargs: further keyword arguments for the model's ``call``.

    Returns:
      The model's output. Non-trainable state updates (BatchNorm moving statistics,
      dropout seeds) are discarded.

    Raises:
      TypeError: ``weights`` is not a mapping (e.g. an ``Adapted``: give its ``.weights``).
      KeyError: a path in ``weights`` is not one of the model's trainable variables.
      ValueError: a given weight's shape differs from its variable's.
    """
    return _stateless_call(model, weights, inputs, training, kwargs)[0]


def call_and_update(model: keras.Model, weights: Mapping[str, tf.Tensor], inputs: Any,
                    training: bool = True, **kwargs: Any) -> Any:
    """:func:`call`, then assigns the non-trainable state the call computed (BatchNorm's
    moving statistics, in training mode) to the model's variables: what a plain
    supervised step (whole-class pre-training) needs so that the model can later run
    with ``training=False``. Never used by an inner loop, which must not assign."""
    outputs, state = _stateless_call(model, weights, inputs, training, kwargs)
    for variable, value in zip(model.non_trainable_variables, state):
        variable.assign(value)
    return outputs


def _stateless_call(model, weights, inputs, training, kwargs):
    if not isinstance(weights, Mapping):
        raise TypeError(f"weights must be tensors by variable path (a dict), got "
                        f"{type(weights).__name__}"
                        + (": what adapt() returns holds them as .weights"
                           if hasattr(weights, "weights") and hasattr(weights, "state")
                           else ""))
    by_path = variables(model)
    unknown = sorted(set(weights) - set(by_path))
    if unknown:
        raise KeyError(f"weights {unknown} are not trainable variables of model "
                       f"{model.name!r}; its paths are {list(by_path)}")
    trainable = []
    for path, variable in by_path.items():
        if path in weights:
            value = weights[path]
            if not value.shape.is_compatible_with(variable.shape):
                raise ValueError(f"weight {path!r} has shape {value.shape}, expected "
                                 f"{tuple(variable.shape)}")
            trainable.append(value)
        else:
            trainable.append(tf.convert_to_tensor(variable))
    non_trainable = [tf.convert_to_tensor(v) for v in model.non_trainable_variables]
    with exact_moments():
        return model.stateless_call(trainable, non_trainable, inputs, training=training,
                                    **kwargs)
