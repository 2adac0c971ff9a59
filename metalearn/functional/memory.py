"""How much memory a model's activations take, from its shapes alone (nothing runs),
and the memory budget they are held to.

:func:`activation_bytes` is what the ``Auto()`` formulation multiplies by the
examples, inner steps and tasks of a meta-step to compare against a memory budget
(:func:`metalearn.execution.choose`). A budget is spelled one way everywhere
(:func:`parse_memory`: bytes or a size such as ``"2GiB"``); the model-based learners
(neural processes, :class:`~metalearn.adapters.InContext`) hold each task's estimate
to theirs with :func:`check_budget` before the work, by default to this machine's
memory (:func:`machine_memory`).
"""

from __future__ import annotations

import os
import re
from typing import Iterator, Optional, Sequence, Union

import keras
import numpy as np
import tensorflow as tf

from metalearn.functional import call, weights as model_weights

_UNITS = {"": 1, "b": 1, "kb": 10 ** 3, "mb": 10 ** 6, "gb": 10 ** 9, "tb": 10 ** 12,
          "kib": 2 ** 10, "mib": 2 ** 20, "gib": 2 ** 30, "tib": 2 ** 40}


class MemoryBudgetError(ValueError):
    """A piece's estimate of the memory one task's work needs exceeds its memory budget
    (refused before the work, instead of the process being killed by the system)."""


def parse_memory(value: Union[int, float, str, None]) -> Optional[int]:
    """Bytes from ``value``: a number of bytes, or a string such as ``"2GiB"``,
    ``"512 MiB"``, ``"1.5GB"`` (``None`` stays ``None``).

    Raises:
      ValueError: not a positive size.
    """
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"memory_budget must be bytes or a size like '2GiB', got {value!r}")
    if isinstance(value, (int, float)):
        number, unit = float(value), ""
    else:
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(value))
        if match is None or match.group(2).lower() not in _UNITS:
            raise ValueError(f"memory_budget must be bytes or a size like '2GiB' "
                             f"(units: B, KB, MB, GB, TB, KiB, MiB, GiB, TiB), got {value!r}")
        number, unit = float(match.group(1)), match.group(2).lower()
    if not number > 0:
        raise ValueError(f"memory_budget must be > 0, got {value!r}")
    return int(number * _UNITS[unit])


CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max",                     # cgroup v2
                 "/sys/fs/cgroup/memory/memory.limit_in_bytes")    # cgroup v1
"""Files that hold a container's memory limit, where the system kills a process that
exceeds it however much physical memory the machine has."""


def _cgroup_limit(path: str) -> Optional[int]:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() and int(text) > 0 else None  # "max": no limit


def machine_memory() -> Optional[int]:
    """The memory this process may use, in bytes: the machine's physical memory, or the
    container's limit (cgroup) where that is lower; ``None`` where the system says
    neither."""
    found = []
    try:
        found.append(int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")))
    except (AttributeError, ValueError, OSError):
        pass
    found += [_cgroup_limit(path) for path in CGROUP_LIMITS]
    found = [f for f in found if f is not None and f > 0]
    return min(found) if found else None


def describe_bytes(count: int) -> str:
    """``count`` bytes as people read them: ``"20.0 GiB (21474836480 B)"``."""
    for unit, size in (("TiB", 2 ** 40), ("GiB", 2 ** 30), ("MiB", 2 ** 20),
                       ("KiB", 2 ** 10)):
        if count >= size:
            return f"{count / size:.1f} {unit} ({int(count)} B)"
    return f"{int(count)} B"


def check_budget(owner: str, estimate: int, sizes: str, budget: Optional[int]) -> None:
    """Raises :class:`MemoryBudgetError` if ``estimate`` bytes exceed ``budget`` (this
    machine's memory where ``budget`` is ``None``; nothing is checked where that is
    unknown too), naming ``owner``, the ``sizes`` the estimate was made from, the
    estimate and the limit.

    Args:
      owner: what does the work, as messages name it (``"AttentiveNeuralProcess"``).
      estimate: the bytes the work is expected to keep alive.
      sizes: the sizes behind the estimate, in words (``"20000 context points, ..."``).
      budget: the limit in bytes (:func:`parse_memory`), or ``None`` for the machine's.
    """
    limit = machine_memory() if budget is None else int(budget)
    if limit is None or estimate <= limit:
        return
    what = "memory_budget" if budget is not None else "this machine's memory"
    raise MemoryBudgetError(
        f"{owner}: {sizes} need an estimated {describe_bytes(estimate)} of memory, more "
        f"than the limit of {describe_bytes(limit)} ({what}); use a smaller context or "
        f"fewer targets per task (split the targets over several predictions), or raise "
        f"{owner}.memory_budget")


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
