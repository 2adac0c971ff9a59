"""Every reach into a private Keras, gin or TensorFlow API, in one place.

Each reach is a small function with a guard: it checks that the private name is there
(and has the expected form) and raises :class:`PrivateAPIMoved`, naming the name and the
versions it was written for, when it is not. ``tests/compat_test.py`` calls every one
of them, so an upgrade that moves one of these APIs fails loudly in the tests instead
of silently changing a result.

Written for: Keras 3.x (TensorFlow backend), gin-config 0.5, TensorFlow 2.16-2.21.
"""

from __future__ import annotations

from typing import Any, Callable, List

import gin
import keras
import tensorflow as tf

WRITTEN_FOR = {"keras": "3.x", "gin-config": "0.5", "tensorflow": "2.16-2.21"}


class PrivateAPIMoved(RuntimeError):
    """A private API metalearn relies on is not where it was (a dependency upgrade)."""


def _moved(what: str, library: str, version: str) -> PrivateAPIMoved:
    return PrivateAPIMoved(
        f"{what} is not where metalearn expects it in {library} {version} (written for "
        f"{library} {WRITTEN_FOR[library]}); see metalearn/_compat.py")


# --- Keras ------------------------------------------------------------------------

def keras_tf_backend_nn() -> Any:
    """Keras' TensorFlow-backend ``nn`` module, whose ``moments`` BatchNormalization
    calls (patched by :mod:`metalearn.functional.moments` for exact moments)."""
    if keras.backend.backend() != "tensorflow":
        raise RuntimeError("metalearn needs Keras' TensorFlow backend, found "
                           f"{keras.backend.backend()!r}; set KERAS_BACKEND=tensorflow")
    try:
        from keras.src.backend.tensorflow import nn as tf_backend_nn
    except ImportError as error:
        raise _moved("keras.src.backend.tensorflow.nn", "keras", keras.__version__) \
            from error
    if not callable(getattr(tf_backend_nn, "moments", None)):
        raise _moved("keras.src.backend.tensorflow.nn.moments", "keras", keras.__version__)
    return tf_backend_nn


def optimizer_learning_rate(optimizer: keras.optimizers.Optimizer) -> Any:
    """The learning rate an optimizer was given (a float, a schedule or a callable),
    before Keras wraps it in a variable: ``optimizer._learning_rate``."""
    if not hasattr(optimizer, "_learning_rate"):
        raise _moved("keras.optimizers.Optimizer._learning_rate", "keras",
                     keras.__version__)
    return optimizer._learning_rate


def run_functional_graph(model: keras.Model, inputs: Any,
                         call_fn: Callable[..., Any]) -> Any:
    """Runs a functional model's graph (``keras.Function._run_through_graph``) with
    ``call_fn(layer, *args, **kwargs)`` computing each node from its inputs' values:
    the walk Keras' own ``Functional.call`` makes, with another way to call a layer."""
    import inspect
    run = getattr(model, "_run_through_graph", None)
    if run is None or "call_fn" not in inspect.signature(run).parameters:
        raise _moved("keras.Function._run_through_graph(inputs, operation_fn, call_fn)",
                     "keras", keras.__version__)
    return run(inputs, operation_fn=lambda operation: operation, call_fn=call_fn)


def loss_in_dtype(loss: keras.losses.Loss, dtype: str) -> keras.losses.Loss:
    """A shallow copy of a Keras loss object that computes in ``dtype``, for a loss whose
    class cannot be rebuilt with another ``dtype`` (its constructor takes none): the
    copy's ``_dtype_policy`` and ``_dtype``, what ``Loss.dtype`` and ``Loss.__call__``
    read, are set. ``loss`` itself is left as it was. (Not ``copy.copy``: Keras pickles a
    loss through its config, which fails for a class it cannot locate by name.)"""
    if not (hasattr(loss, "_dtype_policy") and hasattr(loss, "_dtype")):
        raise _moved("keras.losses.Loss._dtype_policy and ._dtype", "keras",
                     keras.__version__)
    copied = object.__new__(type(loss))
    copied.__dict__.update(vars(loss))
    copied._dtype_policy = keras.dtype_policies.get(dtype)
    copied._dtype = dtype
    if copied.dtype != dtype:
        raise _moved("keras.losses.Loss.dtype (read from ._dtype)", "keras",
                     keras.__version__)
    return copied


# --- gin ----------------------------------------------------------------------------

def gin_version() -> str:
    try:
        from importlib.metadata import version
        return version("gin-config")
    except Exception:  # noqa: BLE001 - only for the message
        return "unknown"


def gin_file_readers() -> List[Any]:
    """gin's list of ``(reader, exists)`` pairs for config files
    (``gin.config._FILE_READERS``), mutable in place."""
    readers = getattr(gin.config, "_FILE_READERS", None)
    if not isinstance(readers, list) or not all(
            isinstance(r, tuple) and len(r) == 2 for r in readers):
        raise _moved("gin.config._FILE_READERS", "gin-config", gin_version())
    return readers


def gin_location_prefixes() -> List[str]:
    """The search path gin's ``include`` uses (``gin.config._LOCATION_PREFIXES``)."""
    prefixes = getattr(gin.config, "_LOCATION_PREFIXES", None)
    if not isinstance(prefixes, list):
        raise _moved("gin.config._LOCATION_PREFIXES", "gin-config", gin_version())
    return prefixes


def gin_parser() -> Any:
    """gin's config parser module (``ConfigParser``, ``ParserDelegate``,
    ``BindingStatement``, ``IncludeStatement``): not part of gin's documented API."""
    from gin import config_parser
    for name in ("ConfigParser", "ParserDelegate", "BindingStatement", "IncludeStatement"):
        if not hasattr(config_parser, name):
            raise _moved(f"gin.config_parser.{name}", "gin-config", gin_version())
    return config_parser


def augment_exception_message_and_reraise(error: BaseException, message: str):
    """Re-raises ``error`` (same type) with ``message`` appended, as gin does
    (``gin.utils.augment_exception_message_and_reraise``)."""
    from gin import utils as gin_utils
    augment = getattr(gin_utils, "augment_exception_message_and_reraise", None)
    if augment is None:
        raise _moved("gin.utils.augment_exception_message_and_reraise", "gin-config",
                     gin_version())
    augment(error, message)


def system_path_file_exists() -> Callable[[str], bool]:
    """gin's test for a config file inside a Python package
    (``gin.resource_reader.system_path_file_exists``)."""
    from gin import resource_reader
    exists = getattr(resource_reader, "system_path_file_exists", None)
    if exists is None:
        raise _moved("gin.resource_reader.system_path_file_exists", "gin-config",
                     gin_version())
    return exists


# --- TensorFlow -------------------------------------------------------------------

def strategy_supports_no_merge_call() -> bool:
    """Whether the current strategy runs without ``merge_call``
    (``tf.__internal__.distribute.strategy_supports_no_merge_call``), as Keras'
    ``LossScaleOptimizer`` asks before a ``tf.cond`` around an update."""
    try:
        check = tf.__internal__.distribute.strategy_supports_no_merge_call
    except AttributeError as error:
        raise _moved("tf.__internal__.distribute.strategy_supports_no_merge_call",
                     "tensorflow", tf.__version__) from error
    return bool(check())


def trackable_object_graph() -> Any:
    """The proto class of a checkpoint's object graph (its ``_CHECKPOINTABLE_OBJECT_GRAPH``
    tensor): which object holds which variable, by attribute name."""
    try:
        from tensorflow.core.protobuf import trackable_object_graph_pb2
        return trackable_object_graph_pb2.TrackableObjectGraph
    except (ImportError, AttributeError) as error:
        raise _moved("tensorflow.core.protobuf.trackable_object_graph_pb2",
                     "tensorflow", tf.__version__) from error


def autograph_leaves_as_written(package: str) -> None:
    """Has AutoGraph call the functions of ``package`` (and its modules) as written,
    unconverted, as TensorFlow already does for Keras, NumPy and itself: a
    ``DoNotConvert`` rule put first in
    ``tensorflow.python.autograph.core.config.CONVERSION_RULES``. Idempotent.

    metalearn writes its graph control flow with ``tf.while_loop`` / ``tf.cond`` and
    never needs conversion; converting its modules costs ~8 s of the first trace in
    every process (benchmarks/README.md)."""
    try:
        from tensorflow.python.autograph.core import config
    except ImportError as error:
        raise _moved("tensorflow.python.autograph.core.config", "tensorflow",
                     tf.__version__) from error
    rules, rule = getattr(config, "CONVERSION_RULES", None), getattr(config, "DoNotConvert",
                                                                     None)
    if not isinstance(rules, tuple) or rule is None or not all(
            callable(getattr(r, "get_action", None)) for r in rules):
        raise _moved("tensorflow.python.autograph.core.config.CONVERSION_RULES",
                     "tensorflow", tf.__version__)
    if any(isinstance(r, rule) and r.matches(package) for r in rules):
        return
    config.CONVERSION_RULES = (rule(package),) + rules


def every_reach() -> List[Callable[[], Any]]:
    """Each guarded reach as a function of no arguments (what the tests call)."""
    return [keras_tf_backend_nn,
            lambda: optimizer_learning_rate(keras.optimizers.SGD(0.1)),
            gin_file_readers, gin_location_prefixes, gin_parser, system_path_file_exists,
            strategy_supports_no_merge_call, trackable_object_graph,
            lambda: _check_augment(), _check_functional_graph, _check_loss_in_dtype,
            lambda: autograph_leaves_as_written("metalearn")]


def _check_augment() -> None:
    try:
        augment_exception_message_and_reraise(ValueError("probe"), " appended")
    except ValueError as error:
        if "appended" not in str(error):
            raise _moved("gin.utils.augment_exception_message_and_reraise (message)",
                         "gin-config", gin_version())



def _check_functional_graph() -> None:
    inputs = keras.Input((2,))
    model = keras.Model(inputs, keras.layers.Add()([inputs, inputs]))
    seen = []
    out = run_functional_graph(model, [tf.ones((1, 2))],
                               lambda layer, *a, **k: seen.append(layer) or layer(*a, **k))
    if len(seen) != 1 or float(tf.reduce_sum(out)) != 4.0:
        raise _moved("keras.Function._run_through_graph (call_fn)", "keras",
                     keras.__version__)


def _check_loss_in_dtype() -> None:
    class NoDtype(keras.losses.Loss):
        def __init__(self):
            super().__init__(name="no_dtype")

        def call(self, y_true, y_pred):
            return y_true - y_pred

    loss = NoDtype()
    value = loss_in_dtype(loss, "float64")(tf.constant([1.0], tf.float64),
                                           tf.constant([1.0 - 1e-12], tf.float64))
    if value.dtype != tf.float64 or float(value) == 0.0 or loss.dtype == "float64":
        raise _moved("keras.losses.Loss computing in its ._dtype", "keras",
                     keras.__version__)
