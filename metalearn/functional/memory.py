"""How much memory a model's activations take, from its shapes alone (nothing runs).

:func:`activation_bytes` is what the ``Auto()`` formulation multiplies by the
examples, inner steps and tasks of a meta-step to compare against a memory budget
(:func:`metalearn.execution.choose`).
"""

from __future__ import annotations

from typing import Iterator, Optional, Sequence

import keras
import numpy as np
import tensorflow as tf

from metalearn.functional import call, weights as model_weights

# Ops whose outputs are not activations: inputs, constants and variable reads.
_NOT_ACTIVATIONS = {"Placeholder", "Const", "ReadVariableOp", "Identity", "NoOp",
                    "VarHandleOp", "Shape", "Reshape", "Squeeze", "ExpandDims"}


def _layers(model: keras.Model) -> Iterator[keras.layers.Layer]:
    for layer in model.layers:
        if isinstance(layer, keras.Model):
            yield from _layers(layer)
        else:
            yield layer


def _from_layer_outputs(model: keras.Model) -> Optional[int]:
    total = 0
    for layer in _layers(model):
        try:
            outputs = tf.nest.flatten(layer.output)
        except (AttributeError, ValueError):  # never called symbolically (subclassed)
            return None
        for output in outputs:
            shape = tuple(output.shape)[1:]
            if any(d is None for d in shape):
                return None
            total += int(np.prod(shape, dtype=np.int64)) * tf.as_dtype(output.dtype).size
    return total


def _from_traced_call(model: keras.Model, example_shape: Sequence[int],
                      dtype: tf.DType) -> int:
    weights = model_weights(model)
    spec = tf.TensorSpec([1, *example_shape], dtype)
    graph = tf.function(lambda x: call(model, weights, x, training=True)
                        ).get_concrete_function(spec).graph
    return sum(o.shape.num_elements() * o.dtype.size
               for op in graph.get_operations() if op.type not in _NOT_ACTIVATIONS
               for o in op.outputs if o.dtype.is_floating and o.shape.is_fully_defined())


def activation_bytes(model: keras.Model, example_shape: Optional[Sequence[int]] = None,
                     dtype: tf.DType = tf.float32) -> Optional[int]:
    """Bytes of the activations of one example's forward pass through ``model``.

    The sum of every layer's output size (from the shapes Keras recorded when the model
    was built on a ``keras.Input``): what a backward pass keeps per example, give or
    take what graph optimisation fuses. For a model without recorded layer outputs
    (subclassed), the floating-point outputs of every op of one traced forward pass on
    an example of ``example_shape`` (an upper bound); ``None`` if that shape is not
    given either, or the model cannot be traced on it alone.

    Args:
      model: a built Keras model.
      example_shape: one example's shape (no batch axis), for models without recorded
        layer outputs.
      dtype: the inputs' dtype for the traced fallback.
    """
    found = _from_layer_outputs(model)
    if found is not None or example_shape is None:
        return found
    if any(d is None for d in example_shape):
        return None
    try:
        return _from_traced_call(model, [int(d) for d in example_shape], dtype)
    except (TypeError, ValueError):  # needs more than one plain input: no estimate
        return None
