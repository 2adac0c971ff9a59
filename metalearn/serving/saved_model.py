"""A learner's adapt-then-predict as a TensorFlow SavedModel, loadable without metalearn.

:func:`export_saved_model` traces the learner's own task run
(:meth:`~metalearn.Learner.run_task`: adapt on the support set, then predict the
queries, BatchNorm as the library computes it) into a ``tf.function`` whose set sizes
are unknown, and saves it in a plain ``tf.Module`` that holds the variables it reads,
in TensorFlow Serving's layout (``directory/<version>/``)::

    path = export_saved_model(learner, "exported/sinusoid", example=episode)
    served = tf.saved_model.load(path).signatures["serving_default"]
    predictions = served(support_x=sx, support_y=sy, query_x=qx)["predictions"]

Nothing here knows a family of learners: whatever the learner's task run does (an inner
loop of any update transforms and step wrappers, implicit gradients, a learned
optimizer, generated weights, a head's fit, a neural process's encoding, a transformer
reading the support set in context) is what is traced. The same mechanism gives the
``adapt`` and ``predict`` signatures: ``adapt(support_x, support_y)`` returns the
task's solution, :meth:`~metalearn.Learner.adapt`'s ``Adapted(weights, state)``, as
flat tensors (the weights adaptation changed, ``weights_<path>``, and the task's state,
``state_<path>``: a head's fit, an encoded context), and ``predict(query_x, ...)``
gives the predictions of :meth:`~metalearn.Learner.predict` from them, so that a
server adapts once per task and caches the result for later queries. ``metadata.json``
beside ``saved_model.pb`` says the inputs' and outputs' shapes and dtypes, the ways,
the inner steps and the signatures.

Before it is written, the traced task run is run on the example episode and compared
with the library's own ``run_task`` (and ``adapt`` then ``predict`` with it). A learner
that cannot be exported raises :class:`UnsupportedExport` naming it and the reason: a
learner whose queries are made inside its task run (``query_data``, a meta-RL policy's
rollouts), a task run that does not trace with the set sizes unknown, or one whose
traced predictions differ from the library's. LiteRT and ONNX are converted from this
SavedModel (:mod:`metalearn.serving.litert`, :mod:`metalearn.serving.onnx`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
from typing import Any, Callable, Dict, Iterator, List, NamedTuple, Optional, Tuple

import keras
import numpy as np
import tensorflow as tf

from metalearn import atomic
from metalearn.flags import EXPORT_FORMATS
from metalearn.learners import Learner
from metalearn.learners.task import Adapted
from metalearn.runs.files import check_version_folder
from metalearn.tasks.episode import Episode

FORMATS = EXPORT_FORMATS
"""The export formats ``python -m metalearn.export --format`` names: ``litert`` and
``onnx`` are converted from the SavedModel (:mod:`metalearn.serving.conversion`)."""

METADATA = "metadata.json"
"""The file beside ``saved_model.pb`` that describes the export (inputs, ways, inner
steps, signatures)."""

TOLERANCE = 1e-4
"""The largest difference (absolute, and relative to the predictions' size) between
the traced task run's predictions on the example episode and the library's that an
export accepts (float32 round-off of another order of the same ops is ~1e-6)."""


class UnsupportedExport(NotImplementedError):
    """A learner or a format that cannot be exported (the message names it and why)."""


def describe_learner(learner: Any) -> str:
    """``"<Learner class> (adapter <Adapter class>)"``, how export errors name a
    learner."""
    adapter = getattr(learner, "adapter", None)
    return f"{type(learner).__name__} (adapter {type(adapter).__name__})"


def export_refusals(learner: Any) -> List[str]:
    """Why ``learner``'s task run cannot be served from a support set and queries,
    known before any tracing (empty: nothing known; the trace may still fail, and
    :func:`export_saved_model` then names that)."""
    if not isinstance(learner, Learner):
        return [f"{type(learner).__name__} is not a metalearn Learner"]
    reasons = []
    if type(learner).query_data is not Learner.query_data:
        reasons.append(f"{type(learner).__name__} overrides query_data: its queries are "
                       "made inside the task run by the adapted model (e.g. a meta-RL "
                       "policy's rollouts), so there are no given queries to predict")
    return reasons


def check_exportable(learner: Learner, format: str = "saved_model") -> None:
    """Checks that ``learner`` can be exported to ``format``, before any tracing.

    Raises:
      ValueError: a format that is not one of :data:`FORMATS`.
      UnsupportedExport: a learner that cannot be exported (:func:`export_refusals`),
        naming it and the reason. (``metalearn.serving.check_exportable`` also checks
        the limits of ``litert`` and ``onnx``:
        :func:`~metalearn.serving.conversion.check_exportable`.)
    """
    if format not in FORMATS:
        raise ValueError(f"unknown export format {format!r}: one of {', '.join(FORMATS)}")
    # litert and onnx: the SavedModel they are converted from is checked here, the
    # format's own limits by metalearn.serving.conversion.check_convertible
    reasons = export_refusals(learner)
    if reasons:
        raise UnsupportedExport(f"{describe_learner(learner)} cannot be exported to "
                                f"{format!r}: " + "; ".join(reasons))


def check_target(directory: str, version: int = 1, overwrite: bool = False) -> str:
    """The version folder ``directory/<version>`` an export writes, checked before any
    work: ``version`` a positive integer, and the folder absent or empty unless
    ``overwrite`` (:func:`metalearn.runs.files.check_version_folder`, which needs no
    TensorFlow: ``python -m metalearn.export`` asks it before TensorFlow loads).

    Raises:
      ValueError: ``version`` below 1.
      FileExistsError: a non-empty version folder, or a file there (naming it).
    """
    return check_version_folder(directory, version, overwrite)


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


def _variables(learner: Learner, functions: List[Any]) -> List[tf.Variable]:
    """Every TensorFlow variable the exported functions read (what their traces
    captured), and the learner's model's, meta-variables and own, once each."""
    found, seen = [], set()
    candidates = [*learner.model.variables, *learner.meta_variables, *learner.variables,
                  *[v for f in functions for v in f.variables]]
    for variable in candidates:
        variable = variable.value if isinstance(variable, keras.Variable) else variable
        if id(variable) not in seen:
            seen.add(id(variable))
            found.append(variable)
    return found


def named_leaves(value: Any, prefix: str) -> List[Tuple[str, Any]]:
    """``(name, leaf)`` of a nest in ``keras.tree.flatten``'s order, each name
    ``prefix`` and the leaf's path joined by ``_`` (dict keys, a named tuple's fields,
    list indices), made a valid signature name; a single tensor is ``prefix`` alone."""
    pairs = []

    def walk(item, path):
        if isinstance(item, dict):
            for key in sorted(item):
                walk(item[key], path + [str(key)])
        elif isinstance(item, tuple) and type(item) is not tuple:  # a named tuple
            for field, leaf in zip(item._fields, item):
                walk(leaf, path + [field])
        elif isinstance(item, (list, tuple)):
            for i, leaf in enumerate(item):
                walk(leaf, path + [str(i)])
        elif item is not None:
            pairs.append(("_".join([prefix, *path]), item))

    walk(value, [])
    names, used = [], set()
    for name, leaf in pairs:
        name = re.sub(r"[^A-Za-z0-9_]", "_", name)
        unique, i = name, 1
        while unique in used:
            unique, i = f"{name}_{i}", i + 1
        used.add(unique)
        names.append((unique, leaf))
    return names


def _outputs(predictions: Any) -> Dict[str, tf.Tensor]:
    # a single tensor is "predictions"; a nest (a Gaussian) "predictions_mean", ...
    return dict(named_leaves(predictions, "predictions"))


class _Cache(NamedTuple):
    """What the ``adapt`` signature gives, as found while tracing it."""
    paths: List[str]                 # the adapted weights' paths, in order
    weights: Dict[str, str]          # signature name -> path of each changed weight
    state: Any                       # the state's structure
    state_names: List[str]           # signature names of its leaves, in flatten order


def _cached_functions(learner: Learner, steps: Optional[int], specs: Dict[str, Any]
                      ) -> Tuple[Any, Any, _Cache]:
    """The ``adapt`` and ``predict`` functions (traced) of any learner: the task's
    solution (:meth:`~metalearn.Learner.adapt`: the weights its adaptation changed and
    its state) as flat tensors by name, and :meth:`~metalearn.Learner.predict` from
    them."""
    found: List[_Cache] = []

    @tf.function(input_signature=[specs["support_x"], specs["support_y"]],
                 autograph=False)
    def adapt(support_x, support_y):
        initial = learner.initial_weights()
        adapted = Adapted.of(learner.adapt(support_x, support_y, steps, weights=initial),
                             f"{type(learner).__name__}.adapt")
        changed = {p: t for p, t in adapted.weights.items() if t is not initial.get(p)}
        weights = named_leaves(changed, "weights")
        state = named_leaves(adapted.state, "state")
        found.append(_Cache(list(adapted.weights),
                            {n: p for (n, _), p in zip(weights, sorted(changed))},
                            adapted.state, [n for n, _ in state]))
        return dict(weights + state)

    outputs = adapt.get_concrete_function().structured_outputs
    cache = found[-1]
    inputs = {n: tf.TensorSpec(t.shape, t.dtype, name=n) for n, t in outputs.items()}

    @tf.function(input_signature=[specs["query_x"], inputs], autograph=False)
    def predict(query_x, solution):
        initial = learner.initial_weights()
        by_path = {p: n for n, p in cache.weights.items()}
        weights = {p: solution[by_path[p]] if p in by_path else initial[p]
                   for p in cache.paths}
        state = keras.tree.pack_sequence_as(cache.state,
                                            [solution[n] for n in cache.state_names])
        return _outputs(learner.predict(Adapted(weights, state), query_x))

    predict.get_concrete_function()
    return adapt, predict, cache


def _difference(got: Dict[str, Any], expected: Dict[str, Any]) -> Optional[str]:
    """Where ``got`` differs from ``expected`` beyond :data:`TOLERANCE`, else ``None``."""
    if sorted(got) != sorted(expected):
        return f"outputs {sorted(got)}, the library's {sorted(expected)}"
    for name, want in expected.items():
        want, have = np.asarray(want, np.float64), np.asarray(got[name], np.float64)
        if want.shape != have.shape:
            return (f"output {name} of shape {list(have.shape)}, the library's "
                    f"{list(want.shape)}")
        gap = float(np.max(np.abs(have - want), initial=0.0))
        if not np.isfinite(gap) or gap > TOLERANCE * (1.0 + float(
                np.max(np.abs(want), initial=0.0))):
            return f"output {name} differs from the library's by {gap:.3g}"
    return None


def _traced(what: str, learner: Learner, fn: Callable[[], Any]) -> Any:
    """``fn()``, a failure of its trace raised as :class:`UnsupportedExport` naming the
    learner, ``what`` was traced and the error."""
    try:
        return fn()
    except UnsupportedExport:
        raise
    except Exception as error:  # noqa: BLE001 -- any failure of the trace is the reason
        message = str(error).strip().splitlines()
        raise UnsupportedExport(
            f"{describe_learner(learner)} cannot be exported to 'saved_model': {what} with "
            f"the set sizes unknown failed: {type(error).__name__}: "
            f"{message[0] if message else ''}") from error


@contextlib.contextmanager
def absl_level_kept() -> Iterator[None]:
    """Puts the ``absl`` logger's level back as it was: ``tf.saved_model.save`` (its
    ``AutoTrackable._trackable_children``) silences absl while it lists attributes and
    then sets the verbosity it read, which pins the logger at the level it inherited
    (WARNING under the root's default), so every later INFO line of the program would
    go silent."""
    logger = logging.getLogger("absl")
    level = logger.level
    try:
        yield
    finally:
        logger.setLevel(level)


def export_saved_model(learner: Learner, directory: str, inner_steps: Optional[int] = None,
                       version: int = 1, example: Optional[Episode] = None,
                       overwrite: bool = False, check: bool = True) -> str:
    """Writes ``learner``'s adapt-then-predict as a SavedModel in TensorFlow Serving's
    layout, ``directory/<version>/``, loadable with TensorFlow alone.

    The ``serving_default`` signature, ``(support_x, support_y, query_x) ->
    {"predictions": ...}``, runs the learner's own :meth:`~metalearn.Learner.run_task`
    (its adaptation, ``inner_steps`` inner steps where it has an inner loop, on the
    support set, then its predictions on the queries), traced with the support and
    query set sizes unknown; the feature shapes and dtypes are the ``example``
    episode's. Predictions that are a nest (a neural process's Gaussian) are one output
    per leaf (``predictions_mean``, ``predictions_scale``). The ``adapt`` signature,
    ``(support_x, support_y) -> {name: tensor}``, gives the task's solution (the
    weights adaptation changed, ``weights_<path>``, and the task's state,
    ``state_<path>``), and ``predict``, ``(query_x, that solution by name) ->
    {"predictions": ...}``, the predictions from it; they are left out where
    adaptation gives nothing to keep, or where the learner's class overrides ``split``
    (the support set it adapts on is then not the one given). ``metadata.json`` beside
    ``saved_model.pb`` describes the inputs and outputs, the ways, the inner steps and
    the signatures.

    Args:
      learner: a learner (e.g. a restored run's ``experiment.learner``) that
        :func:`check_exportable` accepts.
      directory: the model's folder; the export is its ``<version>`` subfolder.
      inner_steps: inner steps of the served adaptation; ``None``: the adapter's own
        (as trained).
      version: the version subfolder, a positive integer.
      example: one episode (no task axis) of the tasks to serve, e.g. the first of
        ``sampler.sample(seed, 1, "test")``: its inputs' feature shapes and dtypes.
      overwrite: replace a non-empty version folder instead of refusing it.
      check: run the traced functions on ``example`` and compare their predictions
        with the library's (``run_task``; ``predict`` of ``adapt``) before writing.

    Returns:
      The version folder written.

    Raises:
      UnsupportedExport: a learner that cannot be exported (named, with the reason:
        :func:`export_refusals`, a trace that fails with the set sizes unknown, or
        traced predictions that differ from the library's).
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
        if getattr(type(learner.adapter), "steps", None) == 0 and inner_steps:
            raise ValueError(f"{describe_learner(learner)} has no inner loop: inner_steps="
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
        return _outputs(learner.run_task(episode, inner_steps, measure=False).predictions)

    serving = _traced("tracing its task run (run_task)", learner,
                      serve.get_concrete_function)
    signatures = {"serving_default": serving}
    module = tf.Module()  # the signatures alone: saving the functions as attributes
    # too would serialise each twice (four times the seconds)
    cache, left_out = None, None
    if type(learner).split is not Learner.split:
        left_out = (f"{type(learner).__name__} overrides split: the support set it adapts "
                    "on is not the one given")
    else:
        adapt, predict, cache = _traced("tracing its adapt and predict", learner,
                                        lambda: _cached_functions(learner, inner_steps,
                                                                  specs))
        if not (cache.weights or cache.state_names):
            cache, left_out = None, "adaptation gives nothing to keep (no weight changed, " \
                                    "no state)"
        else:
            signatures["adapt"] = adapt.get_concrete_function()
            signatures["predict"] = predict.get_concrete_function()
    if check:
        _check(learner, example, inner_steps, signatures)
    module.state = _variables(learner, list(signatures.values()))
    outputs = serving.structured_outputs
    solution = signatures["adapt"].structured_outputs if cache else {}
    metadata = {
        "format": "saved_model", "learner": type(learner).__name__,
        "adapter": type(learner.adapter).__name__, "inner_steps": steps,
        "inner_steps_trained": trained, "ways": getattr(learner, "ways", None),
        "query_training": learner.query_training,
        "meta_step": int(learner.meta_step.numpy()),
        "inputs": {name: _described(spec) for name, spec in specs.items()},
        "outputs": {name: _described(tf.TensorSpec(t.shape, t.dtype))
                    for name, t in outputs.items()},
        "solution": {name: _described(tf.TensorSpec(t.shape, t.dtype))
                     for name, t in solution.items()},
        "adapted_weights": dict(cache.weights) if cache else {},
        "signatures": {
            "serving_default": "adapt on (support_x, support_y), then predict query_x: "
                               f"{sorted(outputs)}",
            **({"adapt": "(support_x, support_y) -> the task's solution by name (the "
                         "weights adaptation changed, weights_<path>; the task's state, "
                         "state_<path>): " + ", ".join(sorted(solution)),
                "predict": f"(query_x, the solution adapt gave, by name) -> "
                           f"{sorted(outputs)}"}
               if cache else {})},
        **({"adapt_left_out": left_out} if left_out else {}),
    }
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    partial = os.path.join(parent, f".{os.path.basename(path)}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        # the functions serve predictions: the gradients of custom-gradient ops in them
        # (iMAML's, a head's implicit fit) are not saved; saving them takes seconds
        options = tf.saved_model.SaveOptions(experimental_custom_gradients=False)
        with absl_level_kept():
            _traced("saving its traced functions", learner,
                    lambda: tf.saved_model.save(module, partial, signatures=signatures,
                                                options=options))
        atomic.write(os.path.join(partial, METADATA),
                     json.dumps(metadata, indent=2, sort_keys=True) + "\n")
        if os.path.isdir(path):
            shutil.rmtree(path)  # empty, or overwrite was asked for (checked above)
        os.replace(partial, path)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return path


def _check(learner: Learner, example: Episode, steps: Optional[int],
           signatures: Dict[str, Any]) -> None:
    """The traced functions on ``example`` against the library's predictions.

    Raises:
      UnsupportedExport: naming the learner and the difference (a random op in the
        task run, or code that reads the static set sizes).
    """
    expected = _outputs(learner.run_task(example, steps, measure=False).predictions)
    got = signatures["serving_default"](support_x=example.support_x,
                                        support_y=example.support_y,
                                        query_x=example.query_x)
    found = _difference(got, expected)
    if found is None and "adapt" in signatures:
        solution = signatures["adapt"](support_x=example.support_x,
                                       support_y=example.support_y)
        found = _difference(signatures["predict"](query_x=example.query_x, **solution),
                            expected)
        found = found and f"predict(adapt(...)): {found}"
    if found:
        raise UnsupportedExport(
            f"{describe_learner(learner)} cannot be exported to 'saved_model': traced with "
            f"the set sizes unknown, on the example episode, {found} (a random op in the task "
            "run, or code that reads the set sizes while tracing)")
