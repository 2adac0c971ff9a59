"""How a meta-batch runs: the one home of the formulations and the runtime.

A **formulation** says how the tasks of a batch are run; it is the only place where one
is chosen or interpreted. Outer rules, evaluation and :meth:`Learner.meta_metrics` all
ask one (:class:`Formulation`'s methods), so :class:`Auto` resolves the same way in
training and in evaluation.

* :class:`MapFn`: a compiled loop over tasks (``tf.map_fn``), graph flat in the tasks;
  unrolled where a piece has a ``tf.custom_gradient`` (TensorFlow ignores those inside
  ``tf.map_fn``).
* :class:`Unrolled`: one copy of the work per task in the graph.
* :class:`Batched`: every layer run once for all tasks, with a task axis on inputs and
  adapted weights (:mod:`metalearn.functional.batched`).
* :class:`Accumulate`: each task's meta-gradient computed and summed inside a
  ``tf.while_loop``; only ``parallel_iterations`` tasks' activations alive at once, so
  memory is flat in the meta-batch; custom gradients honoured.
* :class:`Auto` (the default): resolved when the step is traced by :func:`choose`, a
  pure function of the meta-batch, inner steps, order, device and memory budget (on a
  CPU always ``Accumulate``).

The **runtime** (:class:`Runtime`) is how the process runs: seed, XLA, dtype policy,
op determinism and thread pools, applied before anything is built.
"""

from __future__ import annotations

import math
import re
import weakref
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import gin
import keras
import numpy as np
import tensorflow as tf

from metalearn import functional
from metalearn.adapters.updates import FirstOrder
from metalearn.functional import batched, memory
from metalearn.tasks.episode import Episode, example_mask


# Calibrated on benchmarks/README.md's map_fn rows (Omniglot net, 5 support and 75 query
# images per task): per task, a second-order inner step keeps about five times the
# support set's forward activations (forward, inner backward, and what the outer
# backward through it holds), a first-order one about one time; the query set's forward
# activations are kept once.
INNER_STEP_FACTOR = {True: 5.0, False: 1.0}   # by second_order
# The batched formulation holds convolutions' patches: 1.8-2.2x map_fn's step memory in
# benchmarks/README.md (B = 8 and 32, 1 and 5 inner steps).
BATCHED_FACTOR = 2.0
_UNITS = {"": 1, "b": 1, "kb": 10 ** 3, "mb": 10 ** 6, "gb": 10 ** 9, "tb": 10 ** 12,
          "kib": 2 ** 10, "mib": 2 ** 20, "gib": 2 ** 30, "tib": 2 ** 40}


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


def estimate_step_bytes(example_bytes: int, support: int, query: int, inner_steps: int,
                        second_order: bool) -> int:
    """Activation bytes one task keeps alive for its meta-gradient.

    ``example_bytes`` (one example's forward activations,
    :func:`metalearn.functional.memory.activation_bytes`) times the support examples,
    the inner steps and :data:`INNER_STEP_FACTOR`, plus the query examples once.
    """
    steps = max(int(inner_steps), 1)
    return int(example_bytes * (support * steps * INNER_STEP_FACTOR[bool(second_order)]
                                + query))


class Choice(NamedTuple):
    """What :func:`choose` decided, and why (``estimate``: the bytes it expects the
    chosen formulation's activations to take, ``None`` when unknown)."""
    mode: str
    reason: str
    estimate: Optional[int]


def choose(tasks: int, inner_steps: int, second_order: bool, device: str,
           memory_budget: Optional[int], task_bytes: Optional[int],
           batched_available: bool = False, parallel_iterations: int = 2) -> Choice:
    """The formulation :class:`Auto` runs (a pure function).

    The rule (measurements in benchmarks/README.md):

    1. On a CPU, ``accumulate`` whatever the budget: only ``parallel_iterations`` tasks'
       activations alive at once, so the leanest formulation (peak memory flat in the
       meta-batch), and on the Omniglot step measured on idle cores faster than or level
       with ``map_fn`` at every meta-batch from 4 to 32, at 1 and 5 inner steps, first
       and second order.
    2. On a GPU, the whole-batch formulation that is fastest there if its activations
       (``tasks x task_bytes``, twice that for ``batched``'s patches) fit in
       ``memory_budget``: ``batched`` where the learner allows it (one kernel per layer
       for all tasks instead of one per task; not measured yet), else ``map_fn``; with
       no budget or no estimate, that one without the memory check.
    3. Otherwise ``accumulate``.

    Args:
      tasks: the meta-batch (tasks on this replica).
      inner_steps: the adapter's inner steps (0 for no inner loop).
      second_order: whether the meta-gradient goes through the inner gradients.
      device: ``"cpu"`` or ``"gpu"`` (anything else is treated as a GPU).
      memory_budget: bytes the step's activations may take, or ``None``.
      task_bytes: :func:`estimate_step_bytes` for one task, or ``None``.
      batched_available: whether :class:`Batched` can run the learner.
      parallel_iterations: tasks in flight with ``accumulate``.
    """
    alive = min(tasks, max(int(parallel_iterations), 1)) * task_bytes \
        if task_bytes is not None else None
    if device == "cpu":
        return Choice("accumulate", "on a cpu: the leanest, and the fastest or level "
                                    "(benchmarks/README.md)", alive)
    fast = "batched" if batched_available else "map_fn"
    factor = BATCHED_FACTOR if fast == "batched" else 1.0
    if task_bytes is None or memory_budget is None:
        what = "no memory budget" if memory_budget is None else "no activation estimate"
        return Choice(fast, f"{what}: the fastest on {device}", None)
    whole = int(tasks * task_bytes * factor)
    if whole <= memory_budget:
        return Choice(fast, f"{tasks} tasks x {task_bytes} B = {whole} B fit in "
                            f"{memory_budget} B: the fastest on {device}", whole)
    if fast == "batched" and tasks * task_bytes <= memory_budget:
        return Choice("map_fn", f"batched's {whole} B exceed {memory_budget} B, "
                                f"map_fn's {tasks * task_bytes} B fit", tasks * task_bytes)
    return Choice("accumulate", f"{tasks} tasks x {task_bytes} B = {whole} B exceed "
                                f"{memory_budget} B: accumulate keeps {alive} B", alive)


# --- what a formulation needs to know about a learner --------------------------------

def _inner_steps(learner: Any, steps: Optional[int]) -> int:
    if steps is not None and not isinstance(steps, tf.Tensor):
        return int(steps)
    found = [getattr(p, "steps", None) for p in [learner.adapter, *learner.adapter.parts()]]
    return max([s for s in found if isinstance(s, int)], default=0)


def _second_order(learner: Any) -> bool:
    pieces = [p for piece in learner.pieces for p in [piece, *piece.parts()]]
    return not any(isinstance(p, FirstOrder) for p in pieces)


def _examples(x: Any) -> Tuple[Optional[int], Optional[Sequence[int]]]:
    """Examples per task and one example's shape, from a batch with a task axis."""
    first = tf.nest.flatten(x)[0]
    shape = list(first.shape)
    return (shape[1] if len(shape) > 1 else None), shape[2:]


def _num_tasks(episodes: Any) -> Union[int, tf.Tensor]:
    """The meta-batch: static where the shapes say it (XLA needs a known trip count to
    differentiate a loop), else a tensor."""
    first = tf.nest.flatten(episodes)[0]
    return first.shape[0] if first.shape[0] is not None else tf.shape(first)[0]


def full_precision(outputs: Any, dtype: tf.DType) -> Any:
    """Outputs of a mixed-precision model (float16/bfloat16) cast to ``dtype`` (the
    learner's metric dtype), so losses, metrics and meta-gradients are float32."""
    low = (tf.float16, tf.bfloat16)
    return tf.nest.map_structure(lambda t: tf.cast(t, dtype) if t.dtype in low else t,
                                 outputs)


def check_metrics(learner: Any, metrics: Dict[str, Any], where: str) -> Dict[str, Any]:
    """``metrics`` (one task's figures, or a batch's) checked against the names the
    learner declares (:attr:`Learner.metric_names`): every formulation runs this on what
    :meth:`Learner.episode_metrics` gives, so an undeclared or missing figure is the
    same clear error whichever formulation runs (never dropped, never a raw nest error).

    Raises:
      ValueError: naming the figures not declared and those declared but not given.
    """
    declared = list(learner.metric_names)
    given = list(metrics)
    if sorted(given) != sorted(declared):
        extra = [k for k in given if k not in declared]
        missing = [k for k in declared if k not in given]
        raise ValueError(
            f"{type(learner).__name__}.{where} gives per-task figures {given}, but the "
            f"learner declares {declared} (metric_names): "
            + (f"not declared {extra}; " if extra else "")
            + (f"declared but not given {missing}; " if missing else "")
            + f"override {type(learner).__name__}.metric_names to declare what "
              "episode_metrics returns")
    return metrics


def _scalar_signature(learner: Any, names: Sequence[str]) -> Dict[str, tf.TensorSpec]:
    return {k: tf.TensorSpec([], functional.metric_dtype(learner.model)) for k in names}


def _missing_gradients(variables: Sequence[tf.Variable], gradients: Sequence[Any]) -> None:
    missing = [v.path for v, g in zip(variables, gradients) if g is None]
    if missing:
        raise ValueError(f"no meta-gradient reaches {missing}: the meta-loss does not "
                         "depend on them (is the graph disconnected?)")


def gradient_metrics(learner: Any, sums: Dict[str, Any], tasks: tf.Tensor
                     ) -> Dict[str, tf.Tensor]:
    """Per-task metrics (``[tasks]`` each, every entry the mean over the tasks) from the
    gradients of the meta-loss with respect to the learner's gradient-metric handles
    (``sums``: each piece's backward pass sets its handle's gradient to its figure of
    the task, so the gradient is the sum over tasks). Handles no gradient reached (no
    backward pass used them) give no metric."""
    dtype = functional.metric_dtype(learner.model)
    return {name: tf.fill([tasks], tf.cast(total, dtype) / tf.cast(tasks, dtype))
            for name, total in sums.items() if total is not None}


# --- formulations ----------------------------------------------------------------------

class Formulation:
    """How the tasks of a batch run. Subclasses override what they do differently; every
    method takes episodes with a leading task axis.

    The four questions an outer rule or an evaluation asks:

    * :meth:`per_task`: any function of one episode, for every task, stacked;
    * :meth:`metrics`: each task's figures after adaptation (``[tasks]`` each);
    * :meth:`adapted`: each task's adapted weights and query figures;
    * :meth:`gradients`: the meta-gradient of the mean query loss and the figures.
    """

    name = "formulation"

    def resolve(self, learner: Any, episodes: Any, steps: Optional[int] = None
                ) -> "Formulation":
        """The concrete formulation that runs ``episodes`` (itself, except :class:`Auto`)."""
        return self

    def check(self, learner: Any) -> None:
        """Raises ``ValueError`` if this formulation cannot run ``learner``'s tasks."""

    def per_task(self, learner: Any, fn: Callable[[Episode], Any], episodes: Any,
                 signature: Any) -> Any:
        """``fn`` applied to every task of ``episodes``, results stacked on a task axis.

        Args:
          learner: whose pieces' capabilities decide what may run in a compiled loop.
          fn: a function of one episode (no task axis) to a nest of tensors.
          signature: the nest of ``tf.TensorSpec`` that ``fn`` returns.
        """
        raise NotImplementedError

    def metrics(self, learner: Any, episodes: Any, steps: Optional[int] = None,
                weights: Optional[Dict[str, tf.Tensor]] = None) -> Dict[str, tf.Tensor]:
        """Per-task figures (``[tasks]`` each) of :meth:`Learner.episode_metrics`,
        checked against the learner's declared names (:func:`check_metrics`)."""
        weights = learner.initial_weights() if weights is None else weights
        return self.per_task(
            learner, lambda e: check_metrics(learner, learner.episode_metrics(e, steps, weights),
                                             "episode_metrics"),
            episodes, _scalar_signature(learner, learner.metric_names))

    def adapted(self, learner: Any, episodes: Any, steps: Optional[int] = None,
                weights: Optional[Dict[str, tf.Tensor]] = None
                ) -> Tuple[Dict[str, tf.Tensor], Dict[str, tf.Tensor]]:
        """Each task's adapted weights (``[tasks, ...]`` by path, no gradient through
        them) and its query figures (``[tasks]`` each), as Reptile needs them."""
        weights = learner.initial_weights() if weights is None else weights

        def one_task(episode):
            support_x, support_y, query_x, query_y = learner.split(episode)
            adapted = learner.adapt(support_x, support_y, steps=steps, weights=weights)
            adapted = {p: tf.stop_gradient(adapted[p]) for p in weights}
            query_x, query_y = learner.query_data(adapted, query_x, query_y)
            with functional.example_mask(example_mask(query_y)):
                predictions = learner.predict(adapted, query_x)
            return adapted, learner.query_metrics(query_y, predictions)

        signature = ({p: tf.TensorSpec(w.shape, w.dtype) for p, w in weights.items()},
                     _scalar_signature(learner, ["loss", *learner.metrics]))
        return self.per_task(learner, one_task, episodes, signature)

    def gradients(self, learner: Any, episodes: Any, variables: Sequence[tf.Variable],
                  steps: Optional[int] = None
                  ) -> Tuple[List[tf.Tensor], Dict[str, tf.Tensor]]:
        """The meta-gradient of the mean query loss over ``episodes`` with respect to
        ``variables`` (one tape around :meth:`metrics`), and the per-task figures,
        the pieces' backward-pass figures (``learner.pieces.gradient_metrics``) included.

        Raises:
          ValueError: no meta-gradient reaches some of ``variables``.
        """
        variables = list(variables)
        handles = learner.pieces.gradient_metrics
        with tf.GradientTape() as tape:
            metrics = self.metrics(learner, episodes, steps)
            loss = tf.reduce_mean(metrics["loss"])
        gradients = tape.gradient(loss, variables + list(handles.values()))
        gradients, measured = gradients[:len(variables)], gradients[len(variables):]
        _missing_gradients(variables, gradients)
        metrics = dict(metrics)
        metrics.update(gradient_metrics(learner, dict(zip(handles, measured)),
                                        tf.shape(metrics["loss"])[0]))
        return list(gradients), metrics

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def _unrolled(fn: Callable[[Episode], Any], episodes: Any) -> Any:
    tasks = tf.nest.flatten(episodes)[0].shape[0]
    if tasks is None:
        raise ValueError("the unrolled formulation needs the meta-batch size in the "
                         "episodes' static shape")
    results = [fn(tf.nest.map_structure(lambda t: t[i], episodes)) for i in range(tasks)]
    return tf.nest.map_structure(lambda *t: tf.stack(t), *results)


def _check_parallel(parallel_iterations: int, owner: str) -> int:
    if isinstance(parallel_iterations, bool) or int(parallel_iterations) != \
            parallel_iterations or int(parallel_iterations) < 1:
        raise ValueError(f"{owner}.parallel_iterations must be a whole number >= 1, got "
                         f"{parallel_iterations!r}")
    return int(parallel_iterations)


class InFlight(Formulation):
    """A formulation that runs ``parallel_iterations`` tasks at once (its one option)."""

    def __init__(self, parallel_iterations: int = 2):
        self.parallel_iterations = _check_parallel(parallel_iterations, type(self).__name__)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(parallel_iterations={self.parallel_iterations})"


@gin.configurable
class MapFn(InFlight):
    """A compiled loop over tasks (``tf.map_fn``): graph size, so compile time, flat in
    the number of tasks. Where any piece has a ``tf.custom_gradient`` (which TensorFlow
    ignores inside ``tf.map_fn``) the tasks are unrolled instead.

    Args:
      parallel_iterations: tasks run concurrently.
    """

    name = "map_fn"

    def per_task(self, learner, fn, episodes, signature):
        if learner.pieces.capabilities.custom_gradient:
            return _unrolled(fn, episodes)
        # tf.map_fn sets the global variable scope's caching device for its loop and
        # restores it only when ``fn`` returns: an error raised by ``fn`` (a clear one of
        # ours included) left it set, and every later variable made in a strategy's
        # scope failed ("Caching devices is not yet supported ..."). Restore it always.
        scope = tf.compat.v1.get_variable_scope()
        caching_device = scope.caching_device
        try:
            return tf.map_fn(fn, episodes, fn_output_signature=signature,
                             parallel_iterations=self.parallel_iterations)
        finally:
            if scope.caching_device is not caching_device:  # (only set while tracing)
                scope.set_caching_device(caching_device)



@gin.configurable
class Unrolled(Formulation):
    """One copy of the work per task in the graph (needs the meta-batch in the
    episodes' static shape)."""

    name = "unrolled"

    def per_task(self, learner, fn, episodes, signature):
        return _unrolled(fn, episodes)


def batched_unavailable(learner: Any) -> List[str]:
    """Why :class:`Batched` cannot run ``learner`` (empty when it can): a piece that
    cannot run on a task axis, a model without batched layer rules, or an overridden
    per-task method of the learner."""
    reasons = []
    for piece in learner.pieces:
        if not piece.capabilities.task_axis:
            blocking = [type(p).__name__ for p in [piece, *piece.parts()]
                        if not p.own_capabilities().task_axis]
            reasons.append(f"{type(piece).__name__} cannot run on a task axis "
                           f"(capabilities.task_axis is False for {blocking})")
    reason = batched.supports(learner.model)
    if reason:
        reasons.append(reason)
    reasons += [f"{type(learner).__name__} overrides {method}()"
                for method in overridden(learner, PER_TASK_METHODS)]
    return reasons


PER_TASK_METHODS = ("forward", "predict", "task_initial_weights", "episode_metrics",
                    "query_data")
"""The learner's per-task methods, which :class:`Batched` (every task at once through
the model's layers) runs as ``Learner`` defines them, and so cannot follow an override of."""


def overridden(learner: Any, methods: Sequence[str]) -> List[str]:
    """Those of ``methods`` that ``learner``'s class defines below ``Learner`` (the
    class named so, where each method is first defined)."""
    found = []
    for method in methods:
        owner = next((c for c in type(learner).__mro__ if method in vars(c)), None)
        if owner is not None and owner.__name__ != "Learner":
            found.append(method)
    return found


@gin.configurable
class Batched(Formulation):
    """Every layer runs once for all tasks, with a leading task axis on inputs and
    adapted weights (:mod:`metalearn.functional.batched`). Needs a Sequential or
    functional model whose weighted layers have batched rules, pieces whose
    capabilities allow a task axis, and a learner whose per-task methods
    (``forward``, ``predict``, ``task_initial_weights``, ``episode_metrics``,
    ``query_data``) are not overridden. Functions of one episode (:meth:`per_task`)
    run as :class:`MapFn` does."""

    name = "batched"

    def check(self, learner):
        reasons = batched_unavailable(learner)
        if reasons:
            raise ValueError("the Batched formulation is not available: "
                             + "; ".join(reasons) + ". Use MapFn() or Accumulate().")

    def per_task(self, learner, fn, episodes, signature):
        return MapFn().per_task(learner, fn, episodes, signature)

    def _adapt(self, learner, episodes, steps, weights):
        """Adapted weights ``[tasks, ...]``, the adapter's figures and the query set."""
        self.check(learner)
        weights = learner.initial_weights() if weights is None else weights
        support_x, support_y, query_x, query_y = learner.split(episodes)
        tasks = tf.shape(tf.nest.flatten(support_x)[0])[:1]
        per_task = {path: tf.broadcast_to(value, tf.concat([tasks, tf.shape(value)], 0))
                    for path, value in weights.items()}
        per_task = learner.task_initial_weights(per_task, support_x, support_y)

        def support_losses(task_weights, x, y):
            with functional.example_mask(example_mask(y)):  # [tasks, examples]
                predictions = full_precision(
                    batched.call(learner.model, task_weights, x, training=True),
                    functional.metric_dtype(learner.model))
            return tf.vectorized_map(lambda args: learner.task_loss(*args), (y, predictions))

        adapted, inner = learner.adapter.adapt_and_measure(per_task, support_x, support_y,
                                                           support_losses, steps=steps)
        return adapted, inner, query_x, query_y

    def _query_metrics(self, learner, adapted, query_x, query_y):
        with functional.example_mask(example_mask(query_y)):
            predictions = full_precision(
                batched.call(learner.model, adapted, query_x,
                             training=learner.query_training),
                functional.metric_dtype(learner.model))
        return tf.vectorized_map(lambda args: learner.query_metrics(*args),
                                 (query_y, predictions))

    def metrics(self, learner, episodes, steps=None, weights=None):
        adapted, inner, query_x, query_y = self._adapt(learner, episodes, steps, weights)
        results = self._query_metrics(learner, adapted, query_x, query_y)
        dtype = functional.metric_dtype(learner.model)
        results.update({k: tf.cast(v, dtype) for k, v in inner.items()})
        return check_metrics(learner, results, "episode_metrics (batched)")

    def adapted(self, learner, episodes, steps=None, weights=None):
        weights = learner.initial_weights() if weights is None else weights
        adapted, _, query_x, query_y = self._adapt(learner, episodes, steps, weights)
        adapted = {p: tf.stop_gradient(adapted[p]) for p in weights}
        return adapted, self._query_metrics(learner, adapted, query_x, query_y)


@gin.configurable
class Accumulate(InFlight):
    """Each task's meta-gradient computed and summed inside a ``tf.while_loop`` over the
    tasks: only ``parallel_iterations`` tasks' activations are alive at once, so memory
    is flat in the meta-batch. Each task's tape lives inside the loop body, so custom
    gradients (implicit differentiation, recomputed steps) are honoured; functions of
    one episode (:meth:`per_task`) run in the same loop, their results written to
    ``tf.TensorArray``\\ s (unrolled where a piece has a custom gradient, as with
    :class:`MapFn`: a tape around the loop would not see it).

    Args:
      parallel_iterations: tasks in flight at once.
    """

    name = "accumulate"

    def per_task(self, learner, fn, episodes, signature):
        if learner.pieces.capabilities.custom_gradient:
            # a tape around the loop (meta_metrics under a caller's tape) would not see
            # the pieces' custom gradients, as in tf.map_fn: unrolled, as MapFn does
            return _unrolled(fn, episodes)
        tasks = _num_tasks(episodes)
        specs = tf.nest.flatten(signature)

        def body(i, arrays):
            episode = tf.nest.map_structure(lambda t: tf.gather(t, i), episodes)
            values = tf.nest.flatten(fn(episode))
            return i + 1, [a.write(i, v) for a, v in zip(arrays, values)]

        arrays = [tf.TensorArray(s.dtype, size=tasks, element_shape=s.shape) for s in specs]
        # loop variables as a tuple, the body's structure: eagerly, with
        # maximum_iterations, tf.while_loop compares them exactly (list != tuple)
        _, arrays = tf.while_loop(lambda i, _: i < tasks, body, (tf.constant(0), arrays),
                                  parallel_iterations=self.parallel_iterations,
                                  maximum_iterations=tasks)
        return tf.nest.pack_sequence_as(signature, [a.stack() for a in arrays])

    def gradients(self, learner, episodes, variables, steps=None):
        variables = list(variables)
        tasks = _num_tasks(episodes)
        dtype = functional.metric_dtype(learner.model)
        scale = 1.0 / tf.cast(tasks, dtype)
        handles = learner.pieces.gradient_metrics
        names = list(learner.metric_names) + list(handles)
        missing: List[tf.Variable] = []

        def body(i, totals, arrays):
            episode = tf.nest.map_structure(lambda t: tf.gather(t, i), episodes)
            with tf.GradientTape() as tape:
                # the weights are read inside the tape: one task's record of them
                metrics = check_metrics(learner, learner.episode_metrics(episode, steps),
                                        "episode_metrics")
                loss = metrics["loss"] * scale
            grads = tape.gradient(loss, variables + list(handles.values()))
            grads, measured = grads[:len(variables)], grads[len(variables):]
            metrics = {**metrics, **{
                name: tf.cast(g, dtype) if g is not None else tf.constant(math.nan, dtype)
                for name, g in zip(handles, measured)}}
            missing[:] = [v for v, g in zip(variables, grads) if g is None]
            grads = [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g)
                     for v, g in zip(variables, grads)]
            totals = [t + tf.cast(g, t.dtype) for t, g in zip(totals, grads)]
            arrays = [a.write(i, metrics[k]) for a, k in zip(arrays, names)]
            return i + 1, totals, arrays

        totals = [tf.zeros(v.shape, v.dtype) for v in variables]
        arrays = [tf.TensorArray(dtype, size=tasks, element_shape=[]) for _ in names]
        _, totals, arrays = tf.while_loop(lambda i, *_: i < tasks, body,
                                          (tf.constant(0), totals, arrays),
                                          parallel_iterations=self.parallel_iterations)
        _missing_gradients(missing, [None] * len(missing))
        metrics = {k: a.stack() for k, a in zip(names, arrays)}
        # The one-tape formulations see only the sum of a figure over the tasks: report
        # the same here (each entry the mean), so every formulation gives the same metrics.
        metrics.update({name: tf.fill([tasks], tf.reduce_mean(metrics[name]))
                        for name in handles})
        return totals, metrics



@gin.configurable
class Auto(Formulation):
    """The formulation :func:`choose` picks for a learner and a batch, when the step is
    traced: on a CPU :class:`Accumulate`; on a GPU :class:`Batched` where available,
    then :class:`MapFn`, while the estimated activations fit ``memory_budget``, else
    :class:`Accumulate`. Training, evaluation and :meth:`Learner.meta_metrics` resolve
    it by the same rule.

    Args:
      memory_budget: what the step's activations may take: bytes, or a size such as
        ``"2GiB"``. Read on a GPU only; ``None``: no memory check.
      parallel_iterations: tasks in flight for the formulation chosen.
    """

    name = "auto"

    def __init__(self, memory_budget: Optional[Union[int, str]] = None,
                 parallel_iterations: int = 2):
        self.memory_budget = parse_memory(memory_budget)
        self.parallel_iterations = _check_parallel(parallel_iterations, "Auto")
        # one example's activation bytes by (model, example shape): measured once, as
        # every trace of a step (and of each evaluation) resolves again
        self._activation_bytes: "weakref.WeakKeyDictionary[Any, Dict[Any, Optional[int]]]" = \
            weakref.WeakKeyDictionary()

    def choice(self, learner: Any, episodes: Any, steps: Optional[int] = None) -> Choice:
        """What :func:`choose` decides for ``learner`` on ``episodes`` (leading task
        axis), and why: the model's activations from its shapes, the batch's sizes from
        the episodes' static shapes."""
        support_x, query_x = episodes.support_x, episodes.query_x
        tasks = tf.nest.flatten(episodes)[0].shape[0]
        support, example = _examples(support_x)
        query, _ = _examples(query_x)
        device = "gpu" if tf.config.list_logical_devices("GPU") else "cpu"
        inner, second = _inner_steps(learner, steps), _second_order(learner)
        task_bytes = None
        shape = None if example is None else tuple(example)
        measured = self._activation_bytes.setdefault(learner.model, {})
        if shape not in measured:
            measured[shape] = memory.activation_bytes(learner.model, shape)
        per_example = measured[shape]
        if None not in (per_example, support, query, tasks):
            task_bytes = estimate_step_bytes(per_example, support, query, inner, second)
        return choose(tasks if tasks is not None else 1, inner, second, device,
                      self.memory_budget, task_bytes,
                      device != "cpu" and not batched_unavailable(learner),
                      self.parallel_iterations)

    def resolve(self, learner, episodes, steps=None):
        mode = self.choice(learner, episodes, steps).mode
        return {"accumulate": lambda: Accumulate(self.parallel_iterations),
                "map_fn": lambda: MapFn(self.parallel_iterations),
                "batched": Batched}[mode]()

    def per_task(self, learner, fn, episodes, signature):
        return self.resolve(learner, episodes).per_task(learner, fn, episodes, signature)

    def metrics(self, learner, episodes, steps=None, weights=None):
        return self.resolve(learner, episodes, steps).metrics(learner, episodes, steps, weights)

    def adapted(self, learner, episodes, steps=None, weights=None):
        return self.resolve(learner, episodes, steps).adapted(learner, episodes, steps, weights)

    def gradients(self, learner, episodes, variables, steps=None):
        return self.resolve(learner, episodes, steps).gradients(learner, episodes,
                                                                variables, steps)

    def __repr__(self) -> str:
        return (f"Auto(memory_budget={self.memory_budget}, "
                f"parallel_iterations={self.parallel_iterations})")


FORMULATIONS = {cls.name: cls for cls in (MapFn, Unrolled, Batched, Accumulate, Auto)}


def formulation(value: Union[None, str, Formulation]) -> Formulation:
    """``value`` as a :class:`Formulation`: ``None`` is :class:`Auto`; a name
    (``"map_fn"``, ``"unrolled"``, ``"batched"``, ``"accumulate"``, ``"auto"``) its
    class with default options.

    Raises:
      ValueError: an unknown name; TypeError: anything else.
    """
    if value is None:
        return Auto()
    if isinstance(value, Formulation):
        return value
    if isinstance(value, str):
        if value not in FORMULATIONS:
            raise ValueError(f"unknown formulation {value!r}: one of {sorted(FORMULATIONS)}"
                             " or an object such as metalearn.execution.MapFn()")
        return FORMULATIONS[value]()
    raise TypeError(f"formulation must be a metalearn.execution.Formulation (MapFn(), "
                    f"Unrolled(), Batched(), Accumulate(), Auto()) or its name, got {value!r}")


# --- the runtime -------------------------------------------------------------------------

def check_threads(threads: Optional[Sequence[int]]) -> Optional[Tuple[int, int]]:
    """``(intra_op, inter_op)`` thread-pool sizes as a tuple (``None`` stays ``None``).

    Raises:
      ValueError: not two whole numbers >= 0.
    """
    if threads is None:
        return None
    values = tuple(threads) if isinstance(threads, (list, tuple)) else (threads,)
    if len(values) != 2 or not all(isinstance(v, int) and not isinstance(v, bool)
                                   and v >= 0 for v in values):
        raise ValueError(f"Runtime.threads must be (intra_op, inter_op), two whole "
                         f"numbers >= 0 (0: one per core), got {threads!r}")
    return values


def set_threads(threads: Optional[Sequence[int]]) -> None:
    """Sizes TensorFlow's CPU thread pools: ``(intra_op, inter_op)`` threads (0: one per
    core, TensorFlow's default), or nothing for ``None``. Must run before TensorFlow's
    runtime starts (before any tensor, model or strategy is made).

    Raises:
      ValueError: not two whole numbers >= 0.
      RuntimeError: the runtime already started with other pool sizes.
    """
    values = check_threads(threads)
    if values is None:
        return
    current = (tf.config.threading.get_intra_op_parallelism_threads(),
               tf.config.threading.get_inter_op_parallelism_threads())
    if current == values:
        return
    try:
        tf.config.threading.set_intra_op_parallelism_threads(values[0])
        tf.config.threading.set_inter_op_parallelism_threads(values[1])
    except RuntimeError as error:
        raise RuntimeError(f"Runtime.threads={values}: TensorFlow's runtime already "
                           f"started with {current}; set the thread pools before any "
                           f"tensor, model or strategy is made ({error})") from error


def enable_determinism(seed: Optional[int] = None) -> None:
    """Turns on TensorFlow's op determinism (``tf.config.experimental.
    enable_op_determinism``: every op gives the same result for the same inputs, and
    ops without a deterministic kernel raise) and, if ``seed`` is given, seeds Python,
    NumPy, TensorFlow and Keras (``keras.utils.set_random_seed``). Process-wide, and
    cannot be turned off again in the same process."""
    if seed is not None:
        keras.utils.set_random_seed(int(seed))
    tf.config.experimental.enable_op_determinism()


@gin.configurable
class Runtime:
    """How the process runs a meta-training: applied (:meth:`apply`) before anything is
    built, so the same config gives the same weights.

    Args:
      seed: the run's seed: weight initialisation (Python, NumPy, TensorFlow and Keras
        generators are seeded from it) and the task streams.
      jit_compile: compile the meta-step with XLA.
      dtype_policy: the Keras dtype policy the model is built under, e.g.
        ``"mixed_bfloat16"`` (bfloat16 compute, float32 weights) or ``"mixed_float16"``
        (GPUs). Weights, losses, metrics and meta-gradients stay float32.
      deterministic: turn on TensorFlow's op determinism (:func:`enable_determinism`).
      threads: ``(intra_op, inter_op)`` sizes of TensorFlow's CPU thread pools
        (:func:`set_threads`; 0 is one per core); ``None`` leaves TensorFlow's defaults.
        ``(1, 1)`` took 20% less CPU time and ~30 MiB less memory per step on 2 shared
        cores (benchmarks/README.md, "Thread pools").
    """

    def __init__(self, seed: int = 0, jit_compile: bool = False,
                 dtype_policy: str = "float32", deterministic: bool = False,
                 threads: Optional[Sequence[int]] = None):
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"Runtime.seed must be an integer, got {seed!r} "
                            f"({type(seed).__name__})")
        self.seed = int(seed)
        self.jit_compile = bool(jit_compile)
        try:
            self.dtype_policy = keras.dtype_policies.get(dtype_policy).name
        except ValueError as error:
            raise ValueError(f"Runtime.dtype_policy: {error}") from error
        self.deterministic = bool(deterministic)
        self.threads = check_threads(threads)

    def apply_threads(self) -> None:
        """Sizes the thread pools (before anything starts TensorFlow's runtime)."""
        set_threads(self.threads)

    def apply(self) -> None:
        """Applies the runtime to the process: thread pools, seeds (and op determinism),
        the global dtype policy. Call it before the model is built."""
        self.apply_threads()
        if self.deterministic:
            enable_determinism(self.seed)
        else:
            keras.utils.set_random_seed(self.seed)
        keras.mixed_precision.set_global_policy(self.dtype_policy)

    def __repr__(self) -> str:
        return (f"Runtime(seed={self.seed}, jit_compile={self.jit_compile}, "
                f"dtype_policy={self.dtype_policy!r}, deterministic={self.deterministic}, "
                f"threads={self.threads})")
