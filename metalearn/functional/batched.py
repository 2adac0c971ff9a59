"""A model run on a whole meta-batch at once, with different weights for every task.

The per-task formulations of a meta-batch (``metalearn.execution.MapFn()`` or
``Unrolled()``) run the model once per task. This module runs it once for all tasks:
inputs carry a leading task axis (``[tasks, examples, ...]``) and so may any weight
(``[tasks, *variable.shape]``), which is what an inner loop started from one set of
initial weights turns them into. Each layer with weights is computed by a *rule*:

- ``Dense``: one batched matmul over tasks (``[T, n, i] x [T, i, o]``);
- ``Conv2D``: patch extraction (``tf.image.extract_patches``) for every task's images,
  then one batched matmul (``[T, n*h*w, kh*kw*c] x [T, kh*kw*c, filters]``): B small
  GEMMs become one large one, and no per-task (grouped) convolution is needed;
- ``BatchNormalization``: per-task batch moments (exact to every derivative order, as in
  :func:`metalearn.functional.call`), or the shared moving statistics at inference;
- every layer without weights (activations, pooling, flatten, residual ``Add``, ...):
  the task axis is folded into the batch axis and the layer itself is called (layers
  with several inputs, too);
- a random layer needs its own rule (one task's draws shared by every task, as the
  per-task formulation draws them): ``metalearn.layers.DropBlock`` registers one.

A weight given without the task axis (its variable's own shape) is shared by all tasks,
e.g. MAML++'s per-step BatchNorm copies, which are not adapted. Sequential and
functional models (also nested, residual connections included) are supported;
:func:`register` adds a rule for another layer class.

Which formulation is fastest depends on the device; ``benchmarks/meta_step.py``
measures them (see benchmarks/README.md). On CPUs the per-task loop wins.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Mapping, Optional, Type

import keras
import tensorflow as tf

from metalearn import _compat, functional
from metalearn.functional.moments import batch_moments, current_example_mask

__all__ = ["call", "register", "supports"]

Rule = Callable[[keras.layers.Layer, Dict[str, tf.Tensor], tf.Tensor, bool], tf.Tensor]
"""``rule(layer, weights, x, training) -> y``: ``weights`` by variable name (``"kernel"``),
each ``[tasks, *shape]`` or ``shape`` (shared); ``x`` and ``y`` with a leading task axis."""

_RULES: Dict[Type[keras.layers.Layer], Rule] = {}


def register(layer_class: Type[keras.layers.Layer]) -> Callable[[Rule], Rule]:
    """Decorator: ``rule`` computes ``layer_class`` layers (and subclasses) on a task axis.

    Example::

        @metalearn.functional.batched.register(MyLayer)
        def _my_layer(layer, weights, x, training):
            return tf.einsum("tni,tio->tno", x, weights["kernel"])
    """
    def decorator(rule: Rule) -> Rule:
        _RULES[layer_class] = rule
        return rule
    return decorator


def _rule_for(layer: keras.layers.Layer) -> Optional[Rule]:
    for cls in type(layer).__mro__:
        if cls in _RULES:
            return _RULES[cls]
    return None


def _is_graph(model: keras.Model) -> bool:
    """A functional model (``keras.Model(inputs, outputs)``), walked node by node."""
    return isinstance(model, keras.Function) and not isinstance(model, keras.Sequential)


def _sublayers(model: keras.Model):
    if not isinstance(model, keras.Sequential) and not _is_graph(model):
        raise ValueError(
            f"batched formulation supports keras.Sequential and functional models; "
            f"{model.name!r} is a subclassed {type(model).__name__}: use "
            "the MapFn() formulation (metalearn.execution; gin: "
            "Experiment.formulation = @MapFn())")
    return model.layers


def _no_rule(layer: keras.layers.Layer) -> str:
    return (f"layer {layer.name!r} ({type(layer).__name__}) has weights and no batched "
            "rule (see metalearn.functional.batched.register)")


def supports(model: keras.Model) -> Optional[str]:
    """``None`` if :func:`call` can run ``model``, else the reason it cannot."""
    try:
        for layer in _sublayers(model):
            if isinstance(layer, keras.Model):
                reason = supports(layer)
                if reason:
                    return reason
            elif layer.weights and _rule_for(layer) is None:
                return _no_rule(layer)
    except ValueError as error:
        return str(error)
    return None


def call(model: keras.Model, weights: Mapping[str, tf.Tensor], inputs: tf.Tensor,
         training: bool = True) -> tf.Tensor:
    """Runs ``model`` for every task of a meta-batch with that task's weights.

    Args:
      model: a built Keras Sequential model, left untouched.
      weights: tensors by variable path; each either ``[tasks, *shape]`` (one per task)
        or ``shape`` (shared). Missing paths take the variable's value (shared).
      inputs: ``[tasks, examples, *input_shape]``.
      training: ``True`` makes BatchNorm use each task's batch statistics.

    Returns:
      ``[tasks, examples, *output_shape]``: task ``t``'s slice equals
      ``functional.call(model, weights_t, inputs[t], training)``.
    """
    by_path = functional.variables(model)
    unknown = sorted(set(weights) - set(by_path))
    if unknown:
        raise KeyError(f"weights {unknown} are not trainable variables of model "
                       f"{model.name!r}; its paths are {list(by_path)}")
    for path, value in weights.items():
        shape = tuple(by_path[path].shape)
        if tuple(value.shape[-len(shape):] if shape else ()) != shape or \
                value.shape.rank not in (len(shape), len(shape) + 1):
            raise ValueError(f"weight {path!r} has shape {value.shape}, expected "
                             f"{shape} (shared) or [tasks, *{shape}]")
    inputs = tf.convert_to_tensor(inputs)
    if inputs.shape.rank is not None and inputs.shape.rank < 2:
        raise ValueError(f"inputs need a task and an example axis, got shape {inputs.shape}")
    return _run(model, weights, inputs, training)


def _run(model: keras.Model, weights: Mapping[str, tf.Tensor], x: Any,
         training: bool) -> Any:
    _sublayers(model)  # a clear error for a model of another kind
    if _is_graph(model):
        return _compat.run_functional_graph(
            model, x, lambda layer, *args, **kwargs: _layer(layer, weights, args, kwargs,
                                                            training))
    for layer in model.layers:
        x = _layer(layer, weights, (x,), {}, training)
    return x


def _layer(layer: keras.layers.Layer, weights: Mapping[str, tf.Tensor], args: tuple,
           kwargs: dict, training: bool) -> Any:
    """One layer (or nested model) on inputs with a task axis."""
    if isinstance(layer, keras.Model):
        return _run(layer, weights, args[0], training)
    rule = _rule_for(layer)
    if rule is None:
        if layer.weights:
            raise ValueError(_no_rule(layer) + ": use the MapFn() formulation "
                             "(metalearn.execution)")
        return _folded(layer, args, kwargs, training)
    layer_weights = {}
    for variable in layer.trainable_variables:
        value = weights.get(variable.path)
        layer_weights[variable.name] = tf.convert_to_tensor(variable) if value is None \
            else value
    return rule(layer, layer_weights, args[0], training)


def _folded(layer: keras.layers.Layer, args: tuple, kwargs: dict,
            training: bool) -> Any:
    """A weightless layer on ``[T, n, ...]`` inputs (one or several, e.g. ``Add``'s
    list): tasks folded into the batch axis, unfolded after."""
    tensors = [t for t in tf.nest.flatten((args, kwargs)) if tf.is_tensor(t)]
    leading = tf.shape(tensors[0])[:2]
    fold = lambda t: tf.reshape(t, tf.concat([[-1], tf.shape(t)[2:]], 0)) \
        if tf.is_tensor(t) else t
    args, kwargs = tf.nest.map_structure(fold, (args, kwargs))
    y = layer(*args, **kwargs, training=training)
    return tf.nest.map_structure(
        lambda t: tf.reshape(t, tf.concat([leading, tf.shape(t)[1:]], 0)), y)


def _per_task(value: tf.Tensor, rank: int) -> tf.Tensor:
    """``value`` (``[T, *s]`` or shared ``s`` of rank ``rank``) shaped to broadcast
    against ``[T, ...]`` tensors: shared weights gain a leading 1."""
    return value[None] if value.shape.rank == rank else value


def _in_compute_dtype(layer: keras.layers.Layer, *tensors: tf.Tensor):
    """``tensors`` cast to the layer's compute dtype (its mixed-precision policy)."""
    dtype = tf.as_dtype(layer.compute_dtype)
    return [t if t.dtype == dtype else tf.cast(t, dtype) for t in tensors]


def _activation(layer: keras.layers.Layer, y: tf.Tensor) -> tf.Tensor:
    activation = getattr(layer, "activation", None)
    return y if activation is None else activation(y)


def _bias(layer, weights, y: tf.Tensor) -> tf.Tensor:
    if not getattr(layer, "use_bias", False):
        return y
    bias = tf.cast(_per_task(weights["bias"], 1), y.dtype)  # [T or 1, units]
    middle = y.shape.rank - 2
    return y + tf.reshape(bias, tf.concat([tf.shape(bias)[:1], [1] * middle,
                                           tf.shape(bias)[1:]], 0))


@register(keras.layers.Dense)
def _dense(layer: keras.layers.Dense, weights: Dict[str, tf.Tensor], x: tf.Tensor,
           training: bool) -> tf.Tensor:
    if getattr(layer, "lora_enabled", False) or getattr(layer, "quantization_mode", None):
        raise ValueError(f"Dense {layer.name!r}: LoRA/quantized Dense has no batched rule")
    kernel, x = _in_compute_dtype(layer, weights["kernel"], x)
    shape = tf.shape(x)
    flat = tf.reshape(x, tf.stack([shape[0], -1, shape[-1]]))  # [T, n*..., in]
    if kernel.shape.rank == 2:
        y = tf.reshape(tf.matmul(tf.reshape(flat, [-1, shape[-1]]), kernel),
                       tf.stack([shape[0], -1, kernel.shape[-1]]))
    else:
        y = tf.matmul(flat, kernel)  # [T, n*..., units]
    y = tf.reshape(y, tf.concat([shape[:-1], [kernel.shape[-1]]], 0))
    return _activation(layer, _bias(layer, weights, y))


@register(keras.layers.Conv2D)
def _conv2d(layer: keras.layers.Conv2D, weights: Dict[str, tf.Tensor], x: tf.Tensor,
            training: bool) -> tf.Tensor:
    if layer.data_format != "channels_last" or getattr(layer, "groups", 1) != 1:
        raise ValueError(f"Conv2D {layer.name!r}: the batched rule needs channels_last "
                         f"and groups=1, got {layer.data_format!r}, groups={layer.groups}")
    padding = layer.padding.upper()
    if padding not in ("SAME", "VALID"):
        raise ValueError(f"Conv2D {layer.name!r}: padding {layer.padding!r} unsupported")
    kernel, x = _in_compute_dtype(layer, weights["kernel"], x)  # [T,] kh, kw, c, f
    kh, kw, channels, filters = kernel.shape[-4:]
    shape = tf.shape(x)  # [T, n, H, W, C]
    images = tf.reshape(x, tf.concat([[-1], shape[2:]], 0))
    if (kh, kw) == (1, 1) and tuple(layer.dilation_rate) == (1, 1):
        strides = layer.strides
        patches = images[:, ::strides[0], ::strides[1], :]
    else:
        patches = tf.image.extract_patches(
            images, sizes=[1, kh, kw, 1], strides=[1, *layer.strides, 1],
            rates=[1, *layer.dilation_rate, 1], padding=padding)
    out = tf.shape(patches)  # [T*n, h, w, kh*kw*c] ordered (row, column, channel)
    depth = kh * kw * channels
    if kernel.shape.rank == 4:
        y = tf.matmul(tf.reshape(patches, [-1, depth]), tf.reshape(kernel, [depth, filters]))
    else:
        y = tf.matmul(tf.reshape(patches, tf.stack([shape[0], -1, depth])),
                      tf.reshape(kernel, [-1, depth, filters]))  # [T, n*h*w, f]
    y = tf.reshape(y, tf.concat([shape[:2], out[1:3], [filters]], 0))
    return _activation(layer, _bias(layer, weights, y))


@register(keras.layers.BatchNormalization)
def _batch_norm(layer: keras.layers.BatchNormalization, weights: Dict[str, tf.Tensor],
                x: tf.Tensor, training: bool) -> tf.Tensor:
    rank = x.shape.rank
    if rank is None or layer.axis not in (-1, rank - 2):  # axis counted without tasks
        raise ValueError(f"BatchNormalization {layer.name!r}: the batched rule needs the "
                         f"feature axis last, got axis={layer.axis}")
    compute = tf.float32 if x.dtype in (tf.float16, tf.bfloat16) else x.dtype
    values = tf.cast(x, compute)
    if training:
        axes = list(range(1, rank - 1))  # per task: examples and spatial axes
        mean, variance = batch_moments(values, axes, keepdims=True,
                                       mask=current_example_mask())  # [tasks, examples]
    else:
        mean = tf.cast(tf.convert_to_tensor(layer.moving_mean), compute)
        variance = tf.cast(tf.convert_to_tensor(layer.moving_variance), compute)
    y = (values - mean) * tf.math.rsqrt(variance + layer.epsilon)

    def broadcast(value: tf.Tensor) -> tf.Tensor:
        value = tf.cast(_per_task(value, 1), compute)  # [T or 1, C]
        return tf.reshape(value, tf.concat([tf.shape(value)[:1], [1] * (rank - 2),
                                            tf.shape(value)[1:]], 0))
    if layer.scale:
        y = y * broadcast(weights["gamma"])
    if layer.center:
        y = y + broadcast(weights["beta"])
    return tf.cast(y, x.dtype)
