"""The formulations: how the tasks of a meta-batch run, over the one task run of the
learner (:meth:`Learner.run_task`, :meth:`Learner.run_tasks`).

A formulation reads five members of a learner, written down as :class:`TaskLearner`
(``pieces``, ``metric_names``, ``model``, ``run_task``, ``run_tasks``), and nothing else: no formulation writes a task's pipeline of its own, so a learner's
overrides are honoured by all of them alike.
"""

from __future__ import annotations

import math
from typing import (TYPE_CHECKING, Any, Callable, Dict, List, Optional, Protocol, Sequence,
                    Tuple, Union)

import gin
import tensorflow as tf

from metalearn import functional
from metalearn.pieces import COUNT, Pieces, check_range
from metalearn.tasks.episode import Episode

if TYPE_CHECKING:  # the learner's result types, named in the protocol only
    from metalearn.learners.task import Resume, TaskRun

class TaskLearner(Protocol):
    """What a formulation reads of a learner: these five members and nothing else
    (:class:`~metalearn.Learner` has them; so may any object that runs tasks)."""

    @property
    def pieces(self) -> Pieces:
        """The learner's pieces: ``capabilities.custom_gradient`` (a tape around a
        compiled loop over tasks would not see it), ``capabilities.step_prefix``
        (several counts of inner steps from one run) and ``gradient_metrics`` (handles
        whose gradients are backward-pass figures)."""

    @property
    def metric_names(self) -> List[str]:
        """The names of one task's figures (its run's ``metrics``)."""

    @property
    def model(self) -> Any:
        """The Keras model, whose weights' dtype is the figures' (``float64`` for a
        float64 model, else ``float32``: :func:`metalearn.functional.metric_dtype`)."""

    def run_task(self, episode: Episode, steps: Union[None, int, Sequence[int]] = None,
                 weights: Optional[Dict[str, tf.Tensor]] = None,
                 resume: Optional[Resume] = None) -> Union[TaskRun, Dict[int, TaskRun]]:
        """One task's run (no task axis); given a list of counts of inner steps
        (``steps``), the runs after each by count, from one run where the pieces say
        so (``pieces.capabilities.step_prefix``)."""

    def run_tasks(self, episodes: Episode, steps: Optional[int] = None,
                  weights: Optional[Dict[str, tf.Tensor]] = None,
                  task_weights: Optional[Dict[str, tf.Tensor]] = None) -> TaskRun:
        """Every task at once (every field with a task axis); whether it can is asked
        of the pieces (``pieces.capabilities.task_axis``, ``pieces.task_axis_reasons``)."""


def figures_signature(learner: TaskLearner) -> Dict[str, tf.TensorSpec]:
    """One task's figures as specs (scalars of the metric dtype, by the learner's
    ``metric_names``): what a formulation stacks over the tasks."""
    dtype = functional.metric_dtype(learner.model)
    return {name: tf.TensorSpec([], dtype) for name in learner.metric_names}


def num_tasks(episodes: Any) -> Union[int, tf.Tensor]:
    """The meta-batch of a nest with a leading task axis: static where the shapes say
    it (XLA needs a known trip count to differentiate a loop), else a tensor."""
    first = tf.nest.flatten(episodes)[0]
    return first.shape[0] if first.shape[0] is not None else tf.shape(first)[0]


def signature(fn: Callable[[Any], Any], batched: Any) -> Any:
    """The ``tf.TensorSpec`` nest of ``fn``'s result on one element of ``batched`` (a
    nest with a leading task axis), traced without running: what
    :meth:`Formulation.per_task` needs of a function whose results are not known
    ahead (it is given as ``signature=None``)."""
    spec = tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape[1:], t.dtype), batched)
    outputs = tf.function(fn, autograph=False).get_concrete_function(spec).structured_outputs
    return tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), outputs)


_traced = signature  # for the methods, whose ``signature`` argument shadows the function


def _missing_gradients(variables: Sequence[tf.Variable], gradients: Sequence[Any]) -> None:
    missing = [v.path for v, g in zip(variables, gradients) if g is None]
    if missing:
        raise ValueError(f"no meta-gradient reaches {missing}: the meta-loss does not "
                         "depend on them (is the graph disconnected?)")


def gradient_metrics(sums: Dict[str, Any], tasks: tf.Tensor, dtype: tf.DType
                     ) -> Dict[str, tf.Tensor]:
    """Per-task metrics (``[tasks]`` each, every entry the mean over the tasks) from the
    gradients of the meta-loss with respect to the learner's gradient-metric handles
    (``sums``: each piece's backward pass sets its handle's gradient to its figure of
    the task, so the gradient is the sum over tasks). Handles no gradient reached (no
    backward pass used them) give no metric."""
    return {name: tf.fill([tasks], tf.cast(total, dtype) / tf.cast(tasks, dtype))
            for name, total in sums.items() if total is not None}


def _specs(variables: Sequence[tf.Variable]) -> List[tf.TensorSpec]:
    return [tf.TensorSpec(v.shape, v.dtype) for v in variables]


def _dense(gradients: Sequence[Any], variables: Sequence[tf.Variable]) -> List[tf.Tensor]:
    return [tf.zeros(v.shape, v.dtype) if g is None else tf.cast(tf.convert_to_tensor(g),
                                                                 v.dtype)
            for g, v in zip(gradients, variables)]


# --- formulations ----------------------------------------------------------------------

class Formulation:
    """How the tasks of a batch run. Subclasses override what they do differently; every
    method takes episodes with a leading task axis and a learner as
    :class:`TaskLearner` writes it down.

    The questions an outer rule or an evaluation asks:

    * :meth:`per_task`: any function of one episode, for every task, stacked;
    * :meth:`metrics`: each task's figures (``[tasks]`` each) of its
      :meth:`~metalearn.Learner.run_task`;
    * :meth:`metrics_by_steps`: those figures after each of several numbers of inner
      steps, in one graph (one run for all where the pieces allow it);
    * :meth:`adapted`: each task's adapted weights and figures;
    * :meth:`gradients`: the meta-gradient of the mean objective and the figures;
    * :meth:`task_gradients`: each task's meta-gradient (``[tasks, ...]``).
    """

    name = "formulation"

    def resolve(self, learner: TaskLearner, episodes: Any, steps: Optional[int] = None
                ) -> "Formulation":
        """The concrete formulation that runs ``episodes`` (itself, except ``Auto``)."""
        return self

    def check(self, learner: TaskLearner) -> None:
        """Raises ``ValueError`` if this formulation cannot run ``learner``'s tasks."""

    def for_evaluation(self) -> "Formulation":
        """The formulation an evaluation of a run trained with this one runs: itself.
        An evaluation has no meta-gradient and runs one traced function over many
        batches, often for more inner steps than training took, so a formulation whose
        graph grows with the tasks and the steps answers with one that traces a task
        once (:class:`Unrolled`)."""
        return self

    def per_task(self, learner: TaskLearner, fn: Callable[[Episode], Any], episodes: Any,
                 signature: Any = None) -> Any:
        """``fn`` applied to every task of ``episodes``, results stacked on a task axis.

        Args:
          learner: whose pieces' capabilities decide what may run in a compiled loop.
          fn: a function of one episode (no task axis) to a nest of tensors.
          signature: the nest of ``tf.TensorSpec`` that ``fn`` returns; ``None``: traced
            from ``fn`` (:func:`signature`).
        """
        raise NotImplementedError

    def signature_of(self, fn: Callable[[Episode], Any], episodes: Any) -> Any:
        """What :meth:`per_task` needs to know ahead of ``fn``'s results, for a caller
        that runs ``fn`` on ``episodes``' tasks several times and traces it once: the
        nest of ``tf.TensorSpec`` (:func:`signature`), or ``None`` where :meth:`per_task`
        needs none (:class:`Unrolled`)."""
        return _traced(fn, episodes)

    def _signature(self, fn, episodes, given):
        return given if given is not None else _traced(fn, episodes)

    def metrics(self, learner: TaskLearner, episodes: Any, steps: Optional[int] = None,
                weights: Optional[Dict[str, tf.Tensor]] = None) -> Dict[str, tf.Tensor]:
        """Per-task figures (``[tasks]`` each) of the learner's
        :meth:`~metalearn.Learner.run_task` (``weights``: where every task starts;
        ``None``: the learner's, read in each task's run)."""
        return self.per_task(learner, lambda e: learner.run_task(e, steps, weights).metrics,
                             episodes, figures_signature(learner))

    def metrics_by_steps(self, learner: TaskLearner, episodes: Any, counts: Sequence[int],
                         weights: Optional[Dict[str, tf.Tensor]] = None
                         ) -> Dict[int, Dict[str, tf.Tensor]]:
        """:meth:`metrics` after each number of inner steps in ``counts``, by count
        (``{count: {metric: [tasks]}}``, the same figures as ``metrics(learner,
        episodes, count, weights)``) in one function of each episode: every count of a
        task from one :meth:`~metalearn.Learner.run_task` given the counts where the
        pieces allow it (``capabilities.step_prefix``), else one run per count."""
        counts = list(dict.fromkeys(counts))
        spec = {k: figures_signature(learner) for k in counts}

        def one_task(episode):
            if learner.pieces.capabilities.step_prefix:
                runs = learner.run_task(episode, counts, weights)
            else:  # a class of its own run_task: each count on its own
                runs = {k: learner.run_task(episode, k, weights) for k in counts}
            return {k: run.metrics for k, run in runs.items()}
        return self.per_task(learner, one_task, episodes, spec)

    def adapted(self, learner: TaskLearner, episodes: Any, steps: Optional[int] = None,
                weights: Optional[Dict[str, tf.Tensor]] = None
                ) -> Tuple[Dict[str, tf.Tensor], Dict[str, tf.Tensor]]:
        """Each task's adapted weights (``[tasks, ...]`` by path of ``weights``, no
        gradient through them) and its figures (``[tasks]`` each), as Reptile needs
        them.

        Args:
          weights: where every task starts, by path (the learner's initial weights):
            the paths returned.
        """
        if weights is None:
            raise ValueError("Formulation.adapted needs the starting weights (e.g. "
                             "learner.initial_weights()): their paths are what it returns")

        def one_task(episode):
            run = learner.run_task(episode, steps, weights)
            return {p: tf.stop_gradient(run.adapted.weights[p]) for p in weights}, run.metrics

        spec = ({p: tf.TensorSpec(w.shape, w.dtype) for p, w in weights.items()},
                figures_signature(learner))
        return self.per_task(learner, one_task, episodes, spec)

    def gradients(self, learner: TaskLearner, episodes: Any,
                  variables: Sequence[tf.Variable], steps: Optional[int] = None
                  ) -> Tuple[List[tf.Tensor], Dict[str, tf.Tensor]]:
        """The meta-gradient of the mean objective (the tasks' ``"loss"``) over
        ``episodes`` with respect to ``variables`` (one tape around :meth:`metrics`),
        and the per-task figures, the pieces' backward-pass figures
        (``learner.pieces.gradient_metrics``) included.

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
        metrics.update(gradient_metrics(dict(zip(handles, measured)),
                                        tf.shape(metrics["loss"])[0], loss.dtype))
        return list(gradients), metrics

    def task_gradients(self, learner: TaskLearner, episodes: Any,
                       variables: Sequence[tf.Variable], steps: Optional[int] = None
                       ) -> Tuple[List[tf.Tensor], Dict[str, tf.Tensor]]:
        """Each task's meta-gradient: for every variable a ``[tasks, *shape]`` tensor,
        entry ``i`` the gradient of task ``i``'s objective (its ``"loss"``), and the
        per-task figures (the pieces' backward-pass figures each task's own). Their
        mean over the tasks is :meth:`gradients`'. Run as this formulation runs tasks
        (a tape per task inside its loop; :class:`Batched`: all tasks at once).

        Raises:
          ValueError: no meta-gradient reaches some of ``variables``.
        """
        variables = list(variables)
        handles = learner.pieces.gradient_metrics
        missing: List[tf.Variable] = []

        def one_task(episode):
            with tf.GradientTape() as tape:
                metrics = learner.run_task(episode, steps).metrics
                loss = metrics["loss"]
            grads = tape.gradient(loss, variables + list(handles.values()))
            grads, measured = grads[:len(variables)], grads[len(variables):]
            missing[:] = [v for v, g in zip(variables, grads) if g is None]
            dtype = loss.dtype
            metrics = {**metrics, **{name: tf.cast(g, dtype) if g is not None
                                     else tf.constant(math.nan, dtype)
                                     for name, g in zip(handles, measured)}}
            return _dense(grads, variables), metrics

        figures = dict(figures_signature(learner))
        dtype = figures["loss"].dtype
        figures.update({name: tf.TensorSpec([], dtype) for name in handles})
        gradients, metrics = self.per_task(learner, one_task, episodes,
                                           (_specs(variables), figures))
        _missing_gradients(missing, [None] * len(missing))
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


def check_parallel(parallel_iterations: int, owner: str) -> int:
    """``parallel_iterations`` checked (a whole number >= 1), naming ``owner``."""
    return check_range(owner, "parallel_iterations", parallel_iterations, COUNT)


class InFlight(Formulation):
    """A formulation that runs ``parallel_iterations`` tasks at once (its one option)."""

    def __init__(self, parallel_iterations: int = 2):
        self.parallel_iterations = check_parallel(parallel_iterations, type(self).__name__)

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

    def per_task(self, learner, fn, episodes, signature=None):
        if learner.pieces.capabilities.custom_gradient:
            return _unrolled(fn, episodes)
        signature = self._signature(fn, episodes, signature)
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

    def per_task(self, learner, fn, episodes, signature=None):
        return _unrolled(fn, episodes)  # no signature needed: one call per task

    def signature_of(self, fn, episodes):
        """``None``: :meth:`per_task` calls ``fn`` on each task and needs no signature
        (tracing one would trace ``fn`` once more)."""
        return None

    def for_evaluation(self):
        """:class:`MapFn`: the same figures from a graph of one task (the main job's
        evaluation, 25 tasks a batch after 10 inner steps, traced in 14 s of CPU
        unrolled against 1 s)."""
        return MapFn()


@gin.configurable
class Batched(Formulation):
    """Every layer runs once for all tasks, with a leading task axis on inputs and
    adapted weights: the learner's :meth:`~metalearn.Learner.run_tasks`. Needs a
    Sequential or functional model whose weighted layers have batched rules, pieces
    whose capabilities allow a task axis, and a learner whose per-task methods run as
    ``Learner`` defines them (``learner.pieces.task_axis_reasons()`` says what
    is missing). Functions of one episode (:meth:`per_task`) run as :class:`MapFn`
    does."""

    name = "batched"

    def check(self, learner):
        reasons = learner.pieces.task_axis_reasons()
        if reasons:
            raise ValueError("the Batched formulation is not available: "
                             + "; ".join(reasons) + ". Use MapFn() or Accumulate().")

    def per_task(self, learner, fn, episodes, signature=None):
        return MapFn().per_task(learner, fn, episodes, signature)

    def metrics(self, learner, episodes, steps=None, weights=None):
        return learner.run_tasks(episodes, steps, weights).metrics

    def metrics_by_steps(self, learner, episodes, counts, weights=None):
        # every task at once, once per count (run_tasks keeps no trajectory)
        return {k: self.metrics(learner, episodes, k, weights)
                for k in dict.fromkeys(counts)}

    def adapted(self, learner, episodes, steps=None, weights=None):
        if weights is None:
            return super().adapted(learner, episodes, steps, weights)  # its error
        run = learner.run_tasks(episodes, steps, weights)
        return {p: tf.stop_gradient(run.adapted.weights[p]) for p in weights}, run.metrics

    def task_gradients(self, learner, episodes, variables, steps=None):
        """All tasks at once: each variable broadcast to one copy per task (the
        learner's tasks independent along the task axis, so task ``i``'s objective
        reads copy ``i`` only), the gradient of the summed objectives with respect to
        the copies. Variables of the learner's pieces (not model weights) are read
        by every task: then task by task, as :class:`MapFn` does."""
        variables = list(variables)
        learned = {id(v) for v in learner.pieces.meta_variables}
        if any(id(v) in learned for v in variables):
            return MapFn().task_gradients(learner, episodes, variables, steps)
        tasks = num_tasks(episodes)
        with tf.GradientTape() as tape:
            copies = {v.path: tf.broadcast_to(tf.convert_to_tensor(v),
                                              tf.concat([[tasks], tf.shape(v)], 0))
                      for v in variables}
            tape.watch(list(copies.values()))
            metrics = learner.run_tasks(episodes, steps, task_weights=copies).metrics
            loss = tf.reduce_sum(metrics["loss"])
        gradients = tape.gradient(loss, [copies[v.path] for v in variables])
        _missing_gradients(variables, gradients)
        return [tf.convert_to_tensor(g) for g in gradients], metrics


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

    def per_task(self, learner, fn, episodes, signature=None):
        if learner.pieces.capabilities.custom_gradient:
            # a tape around the loop (meta_metrics under a caller's tape) would not see
            # the pieces' custom gradients, as in tf.map_fn: unrolled, as MapFn does
            return _unrolled(fn, episodes)
        signature = self._signature(fn, episodes, signature)
        tasks = num_tasks(episodes)
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
        tasks = num_tasks(episodes)
        signature = figures_signature(learner)
        dtype = signature["loss"].dtype
        scale = 1.0 / tf.cast(tasks, dtype)
        handles = learner.pieces.gradient_metrics
        names = list(signature) + list(handles)
        missing: List[tf.Variable] = []

        def body(i, totals, arrays):
            episode = tf.nest.map_structure(lambda t: tf.gather(t, i), episodes)
            with tf.GradientTape() as tape:
                # the weights are read inside the tape: one task's record of them
                metrics = learner.run_task(episode, steps).metrics
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
