"""A learner's adapt-then-predict as a TensorFlow SavedModel, loadable without metalearn.

:func:`export_saved_model` traces the learner's own task run
(:meth:`~metalearn.Learner.run_task`: adapt on the support set, then predict the
queries, BatchNorm as the library computes it) into a ``tf.function`` whose set sizes
are unknown, and saves it in a plain ``tf.Module`` that holds the learner's variables,
in TensorFlow Serving's layout (``directory/<version>/``)::

    path = export_saved_model(learner, "exported/sinusoid", example=episode)
    served = tf.saved_model.load(path).signatures["serving_default"]
    predictions = served(support_x=sx, support_y=sy, query_x=qx)["predictions"]

A learner whose adapted state is a head's fit and whose weights do not change per task
(Prototypical Networks) also gets ``adapt(support_x, support_y) -> state`` and
``predict(query_x, state...) -> {"predictions"}`` signatures, so that a task's fit is
computed once and cached. ``metadata.json`` beside ``saved_model.pb`` says the inputs'
shapes and dtypes, the ways, the inner steps and the signatures.

Supported in this first slice: the gradient-based learners (``Learner``,
``MultiStepLossLearner`` and ``ProtoMAML`` with a ``GradientDescent`` inner loop: MAML,
ANIL, Meta-SGD, MAML++, ...) and the embedding learners with a head
(``PrototypicalNetworks``, ``EmbeddingLearner``). Other learners raise
:class:`UnsupportedExport` naming them. LiteRT and ONNX are converted from this SavedModel
(:mod:`metalearn.serving.litert`, :mod:`metalearn.serving.onnx`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from typing import Any, Dict, List, Optional

import keras
import tensorflow as tf

from metalearn import atomic
from metalearn.adapters.base import NoAdaptation
from metalearn.adapters.gradient_descent import GradientDescent
from metalearn.flags import EXPORT_FORMATS
from metalearn.learners import (EmbeddingLearner, Learner, MultiStepLossLearner,
                                PrototypicalNetworks, ProtoMAML)
from metalearn.learners.task import Adapted
from metalearn.tasks.episode import Episode

FORMATS = EXPORT_FORMATS
"""The export formats ``python -m metalearn.export --format`` names: ``litert`` and
``onnx`` are converted from the SavedModel (:mod:`metalearn.serving.conversion`)."""

METADATA = "metadata.json"
"""The file beside ``saved_model.pb`` that describes the export (inputs, ways, inner
steps, signatures)."""

_GRADIENT_LEARNERS = (Learner, MultiStepLossLearner, ProtoMAML)
_EMBEDDING_LEARNERS = (EmbeddingLearner, PrototypicalNetworks)
_SUPPORTED = ("Learner, MultiStepLossLearner and ProtoMAML with a GradientDescent inner "
              "loop; PrototypicalNetworks and EmbeddingLearner (no inner loop or "
              "GradientDescent)")


class UnsupportedExport(NotImplementedError):
    """A learner or a format that cannot be exported yet (the message names it and
    what is supported)."""


def check_exportable(learner: Learner, format: str = "saved_model") -> None:
    """Checks that ``learner`` can be exported to ``format``, before any tracing.

    Raises:
      ValueError: a format that is not one of :data:`FORMATS`.
      UnsupportedExport: a learner (its class, or its adapter's) that is not
        supported yet, naming it. (``metalearn.serving.check_exportable`` also checks
        the limits of ``litert`` and ``onnx``:
        :func:`~metalearn.serving.conversion.check_exportable`.)
    """
    if format not in FORMATS:
        raise ValueError(f"unknown export format {format!r}: one of {', '.join(FORMATS)}")
    # litert and onnx: the SavedModel they are converted from is checked here, the
    # format's own limits by metalearn.serving.conversion.check_convertible
    adapter = type(getattr(learner, "adapter", None))
    if type(learner) in _EMBEDDING_LEARNERS and adapter in (NoAdaptation, GradientDescent):
        return
    if type(learner) in _GRADIENT_LEARNERS and adapter is GradientDescent:
        return
    raise UnsupportedExport(f"{type(learner).__name__} (adapter {adapter.__name__}) cannot "
                            f"be exported to {format!r} yet; supported: {_SUPPORTED}")


def check_target(directory: str, version: int = 1, overwrite: bool = False) -> str:
    """The version folder ``directory/<version>`` an export writes, checked before any
    work: ``version`` a positive integer, and the folder absent or empty unless
    ``overwrite``.

    Raises:
      ValueError: ``version`` below 1.
      FileExistsError: a non-empty version folder, or a file there (naming it).
    """
    if int(version) != version or version < 1:
        raise ValueError(f"version must be a positive integer (TensorFlow Serving's "
                         f"folder name), got {version!r}")
    path = os.path.join(directory, str(int(version)))
    if os.path.exists(path) and not os.path.isdir(path):
        raise FileExistsError(f"{path} is a file, not a version folder")
    if os.path.isdir(path) and os.listdir(path) and not overwrite:
        raise FileExistsError(f"{path} exists and is not empty: give another version, or "
                              "overwrite=True (--overwrite) to replace it")
    return path


def _one_episode(example: Episode) -> Episode:
    if not isinstance(example, Episode):
        raise TypeError(f"example must be a metalearn Episode, got {type(example).__name__}")
    for name, value in zip(Episode._fields, example):
        if not (tf.is_tensor(value) or hasattr(value, "dtype")):
            raise UnsupportedExport(f"example.{name} is a {type(value).__name__}: only "
                                    "episodes of single tensors (no padded MaskedLabels, "
                                    "no nested inputs) can be exported yet")
    return Episode(*[tf.convert_to_tensor(v) for v in example])


def _spec(value: tf.Tensor, name: str) -> tf.TensorSpec:
    # the example axis unknown (any set size), the feature shape and dtype as given
    return tf.TensorSpec([None, *value.shape[1:]], value.dtype, name=name)


def _described(spec: tf.TensorSpec) -> Dict[str, Any]:
    return {"shape": spec.shape.as_list(), "dtype": spec.dtype.name}


def _variables(learner: Learner) -> List[tf.Variable]:
    """Every TensorFlow variable the learner's task run may read: the model's (Keras
    variables unwrapped), the pieces' meta-variables and the learner's own."""
    found, seen = [], set()
    for variable in [*learner.model.variables, *learner.meta_variables, *learner.variables]:
        variable = variable.value if isinstance(variable, keras.Variable) else variable
        if id(variable) not in seen:
            seen.add(id(variable))
            found.append(variable)
    return found


def _names(paths: List[str]) -> List[str]:
    return [re.sub(r"[^A-Za-z0-9_]", "_", p) or f"state_{i}" for i, p in enumerate(paths)]


def _adapt_and_predict(learner: Learner, steps: Optional[int], specs: Dict[str, Any]):
    """The ``adapt`` and ``predict`` functions of a head learner whose weights stay
    those of its variables (no inner loop): the head's fit by name, and predictions from
    it. ``None`` for other learners."""
    if not (isinstance(learner, EmbeddingLearner) and
            isinstance(learner.adapter, NoAdaptation)):
        return None
    sx, sy, qx = specs["support_x"], specs["support_y"], specs["query_x"]
    state = tf.function(lambda x, y: learner.adapt(x, y, steps).state,
                        input_signature=[sx, sy], autograph=False
                        ).get_concrete_function().structured_outputs
    flat = keras.tree.flatten_with_path(state)
    names = _names(["/".join(str(p) for p in path) for path, _ in flat])
    state_specs = {n: tf.TensorSpec(t.shape, t.dtype, name=n) for n, (_, t) in
                   zip(names, flat)}

    @tf.function(input_signature=[sx, sy], autograph=False)
    def adapt(support_x, support_y):
        fitted = learner.adapt(support_x, support_y, steps).state
        return dict(zip(names, keras.tree.flatten(fitted)))

    @tf.function(input_signature=[qx, state_specs], autograph=False)
    def predict(query_x, state):
        fitted = keras.tree.pack_sequence_as(state_structure, [state[n] for n in names])
        adapted = Adapted(learner.initial_weights(), fitted)
        return {"predictions": learner.predict(adapted, query_x)}

    state_structure = state
    return adapt, predict, state_specs


def export_saved_model(learner: Learner, directory: str, inner_steps: Optional[int] = None,
                       version: int = 1, example: Optional[Episode] = None,
                       overwrite: bool = False) -> str:
    """Writes ``learner``'s adapt-then-predict as a SavedModel in TensorFlow Serving's
    layout, ``directory/<version>/``, loadable with TensorFlow alone.

    The ``serving_default`` signature, ``(support_x, support_y, query_x) ->
    {"predictions": ...}``, runs the learner's own :meth:`~metalearn.Learner.run_task`
    (its inner loop for ``inner_steps`` steps on the support set, then its predictions
    on the queries), traced with the support and query set sizes unknown; the feature
    shapes and dtypes are the ``example`` episode's. A head learner without an inner loop
    also gets ``adapt`` and ``predict`` signatures (its fit computed once per task).
    ``metadata.json`` beside ``saved_model.pb`` describes the inputs and outputs, the
    ways, the inner steps and the signatures.

    Args:
      learner: a supported learner (:func:`check_exportable`), e.g. a restored run's
        ``experiment.learner``.
      directory: the model's folder; the export is its ``<version>`` subfolder.
      inner_steps: inner steps of the served adaptation; ``None``: the adapter's own
        (as trained).
      version: the version subfolder, a positive integer.
      example: one episode (no task axis) of the tasks to serve, e.g. the first of
        ``sampler.sample(seed, 1, "test")``: its inputs' feature shapes and dtypes.
      overwrite: replace a non-empty version folder instead of refusing it.

    Returns:
      The version folder written.

    Raises:
      UnsupportedExport: a learner that cannot be exported yet (named).
      FileExistsError: a non-empty version folder without ``overwrite`` (before any
        tracing).
      ValueError: ``inner_steps`` negative, or given to a learner without an inner loop.
    """
    check_exportable(learner)
    path = check_target(directory, version, overwrite)
    if example is None:
        raise ValueError("export_saved_model needs an example episode (no task axis) for "
                         "the inputs' feature shapes and dtypes")
    example = _one_episode(example)
    trained = int(getattr(learner.adapter, "steps", 0))
    if inner_steps is not None:
        if int(inner_steps) < 0:
            raise ValueError(f"inner_steps must be 0 or more, got {inner_steps}")
        if isinstance(learner.adapter, NoAdaptation) and inner_steps:
            raise ValueError(f"{type(learner).__name__} has no inner loop: inner_steps="
                             f"{inner_steps} does not apply")
        inner_steps = int(inner_steps)
    steps = trained if inner_steps is None else inner_steps
    specs = {name: _spec(getattr(example, name), name)
             for name in ("support_x", "support_y", "query_x")}
    query_y = _spec(example.query_y, "query_y")

    @tf.function(input_signature=[specs["support_x"], specs["support_y"],
                                  specs["query_x"]], autograph=False)
    def serve(support_x, support_y, query_x):
        # the query labels only carry their shape (measure=False computes no loss)
        labels = tf.zeros(tf.concat([tf.shape(query_x)[:1], tf.shape(example.query_y)[1:]
                                     ], 0), query_y.dtype)
        episode = Episode(support_x, support_y, query_x, labels)
        return {"predictions": learner.run_task(episode, inner_steps,
                                                measure=False).predictions}

    module = tf.Module()
    serving = serve.get_concrete_function()
    signatures = {"serving_default": serving}
    module.serve = serve
    cached = _adapt_and_predict(learner, inner_steps, specs)
    state_specs = {}
    if cached is not None:
        adapt, predict, state_specs = cached
        module.adapt, module.predict = adapt, predict
        signatures["adapt"] = adapt.get_concrete_function()
        signatures["predict"] = predict.get_concrete_function()
    module.state = _variables(learner)
    output = serving.structured_outputs["predictions"]
    metadata = {
        "format": "saved_model", "learner": type(learner).__name__,
        "adapter": type(learner.adapter).__name__, "inner_steps": steps,
        "inner_steps_trained": trained, "ways": getattr(learner, "ways", None),
        "query_training": learner.query_training,
        "meta_step": int(learner.meta_step.numpy()),
        "inputs": {name: _described(spec) for name, spec in specs.items()},
        "outputs": {"predictions": _described(tf.TensorSpec(output.shape, output.dtype))},
        "signatures": {
            "serving_default": "adapt on (support_x, support_y), then predict query_x: "
                               "{'predictions'}",
            **({"adapt": "(support_x, support_y) -> the task's state by name: "
                         + ", ".join(f"{n} {s.shape.as_list()} {s.dtype.name}"
                                     for n, s in state_specs.items()),
                "predict": "(query_x, the state adapt gave, by name) -> {'predictions'}"}
               if state_specs else {})},
    }
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    partial = os.path.join(parent, f".{os.path.basename(path)}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        tf.saved_model.save(module, partial, signatures=signatures)
        atomic.write(os.path.join(partial, METADATA),
                     json.dumps(metadata, indent=2, sort_keys=True) + "\n")
        if os.path.isdir(path):
            shutil.rmtree(path)  # empty, or overwrite was asked for (checked above)
        os.replace(partial, path)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return path
