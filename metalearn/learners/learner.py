"""Learner = model + adapter + loss: the object research code holds and subclasses."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import gin
import keras
import numpy as np
import tensorflow as tf

from metalearn import _compat, configurables, execution, functional
from metalearn.adapters.base import Adapter
from metalearn.adapters.gradient_descent import GradientDescent
from metalearn.functional import Weights, batched
from metalearn.learners.task import Adapted, Resume, TaskRun, Trajectory
from metalearn.learners.task_init import TaskInit
from metalearn.pieces import Capabilities, LossFn, Piece, Pieces, SplitLoss
from metalearn.tasks.episode import Episode, example_mask, restrict_to_classes, unmask

MetricFn = Callable[[Any, Any], tf.Tensor]
"""A loss or metric: ``fn(y_true, y_pred) -> tf.Tensor`` (a Keras loss or metric object, or
any callable of that signature)."""

_MOVED = {
    "task_batching": "the formulation, an object of metalearn.execution: "
                     "Experiment.formulation = @MapFn() (or Unrolled, Batched, Accumulate, "
                     "Auto), make_meta_step(..., formulation=MapFn()), "
                     "learner.meta_metrics(episodes, formulation=MapFn())",
    "memory_budget": "Auto(memory_budget=...) (metalearn.execution; gin: "
                     "Auto.memory_budget = '2GiB')",
    "parallel_iterations": "MapFn(parallel_iterations=...) or Accumulate(parallel_iterations=...)"
                           " (metalearn.execution)",
    "zero_init": "task_init=[ZeroInit(patterns)] (metalearn.learners.ZeroInit; gin: "
                 "Learner.task_init = [@ZeroInit()], ZeroInit.patterns = ('head',))",
}

_MOVED_MEMBERS = {
    "capabilities": "learner.pieces.capabilities (the learner's pieces as one Piece)",
    "gradient_metrics": "learner.pieces.gradient_metrics",
    "metric_dtype": "metalearn.functional.metric_dtype(learner.model)",
    "predict_on": "metalearn.learners.predict_on(learner, weights, x, y) (it calls "
                  "learner.predict: override that)",
    "support_objective": "metalearn.learners.support_objective(learner) (from "
                         "learner.support_loss: override that)",
    "support_outputs": "learner.forward under functional.example_mask (override "
                       "support_loss for another inner objective)",
    "query_metric_names": "['loss', *learner.metrics] (learner.metric_names adds the "
                          "adapter's)",
    "episode_metrics": "learner.run_task(episode, steps, weights).metrics (the one task "
                       "run); to change what is minimised or measured override "
                       "objective_of(run) (or query_metrics)",
    "task_paths": "learner.pieces.task_paths(learner.initial_weights())",
    "adapt_trajectory": "metalearn.learners.adapt_trajectory(learner, support_x, "
                        "support_y, steps, weights), or run_task(...).trajectory where "
                        "the learner records it (records_trajectory)",
    "objective": "metalearn.learners.objective(learner, values, episodes, steps, "
                 "formulation)",
}


@gin.configurable
def accuracy(y_true: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
    """Per example, 1 where the arg-max logit is the integer label, else 0 (the
    learner's mean of it is the fraction of correct examples)."""
    predicted = tf.argmax(logits, axis=-1, output_type=tf.int64)
    labels = tf.cast(tf.reshape(y_true, tf.shape(predicted)), tf.int64)
    return tf.cast(tf.equal(predicted, labels), tf.float32)


def masked_mean(values: tf.Tensor, mask: tf.Tensor, what: str) -> tf.Tensor:
    """Mean of per-example ``values [..., n, ...]`` over the examples where ``mask
    [..., n]`` is True (trailing axes averaged first)."""
    values = tf.convert_to_tensor(values)
    if values.shape.rank is not None and values.shape.rank < mask.shape.rank:
        raise ValueError(f"{what} gives values of shape {values.shape.as_list()}, but padded "
                         f"episodes (MaskedLabels) need one value per example "
                         f"({mask.shape.as_list()}) to leave the padding out")
    rank = mask.shape.rank
    if values.shape.rank > rank:
        values = tf.reduce_mean(values, axis=list(range(rank, values.shape.rank)))
    total = tf.reduce_sum(tf.where(mask, values, tf.zeros_like(values)), -1)
    return total / tf.reduce_sum(tf.cast(mask, values.dtype), -1)


def per_example(fn: MetricFn, y_true: Any, y_pred: Any) -> tf.Tensor:
    """``fn``'s unreduced values: a Keras ``Loss`` object's ``call`` (its inputs in the
    loss's dtype, as its ``__call__`` would), any other function as it is."""
    if isinstance(fn, keras.losses.Loss):
        dtype = fn.dtype or y_pred.dtype
        return fn.call(tf.cast(y_true, dtype) if not tf.as_dtype(y_true.dtype).is_integer
                       else y_true, tf.cast(y_pred, dtype))
    return fn(y_true, y_pred)


def _step_reading_layers(model: keras.Model) -> List[keras.layers.Layer]:
    """The model's layers (nested models' too) that read the learner's meta-step, as
    pieces do: those with a ``meta_step`` attribute and ``bind`` (e.g. DropBlock's
    schedule and mask stream, which nothing assigns under ``functional.call``)."""
    found = []
    for layer in getattr(model, "layers", []):
        if isinstance(layer, keras.Model):
            found += _step_reading_layers(layer)
        elif hasattr(layer, "meta_step") and callable(getattr(layer, "bind", None)):
            found.append(layer)
    return found


def _as_fn(name: str, fn: Union[str, MetricFn]) -> MetricFn:
    if isinstance(fn, str):
        if fn == "accuracy":
            return accuracy
        try:
            return keras.losses.get(fn)
        except ValueError as error:
            raise ValueError(f"unknown {name} {fn!r}: give a callable(y_true, y_pred) "
                             "or a Keras loss name") from error
    if not callable(fn):
        raise TypeError(f"{name} must be callable(y_true, y_pred), got {fn!r}")
    return fn


def in_precision(fn: MetricFn, dtype: tf.DType) -> MetricFn:
    """``fn`` computing in ``dtype`` where it would not: a Keras 3 loss object casts its
    inputs to its own dtype (``floatx()``, float32 by default), so for a float64 model
    it gives a float32-exact loss and meta-gradient. Such a loss is rebuilt in float64
    (the caller's object is left as it was); anything else is returned unchanged."""
    if tf.as_dtype(dtype) != tf.float64 or not isinstance(fn, keras.losses.Loss) \
            or fn.dtype == "float64":
        return fn
    try:
        return type(fn).from_config({**fn.get_config(), "dtype": "float64"})
    except (TypeError, ValueError, NotImplementedError):  # a subclass without dtype
        return _compat.loss_in_dtype(fn, "float64")


def name_of(fn: Any) -> str:
    """A loss or metric's name in messages: its function name, else its class name."""
    return getattr(fn, "__name__", None) or type(fn).__name__


def _trailing_squeezed(dims: List[Optional[int]]) -> List[Optional[int]]:
    while dims and dims[-1] == 1:
        dims = dims[:-1]
    return dims


def _fit(a: List[Optional[int]], b: List[Optional[int]]) -> bool:
    return len(a) == len(b) and all(x is None or y is None or x == y for x, y in zip(a, b))


def check_loss_shapes(what: str, y_true: Any, y_pred: Any, values: Any = None) -> None:
    """Checks the static shapes of one task's targets, predictions and the per-example
    values a loss or metric gave for them: run while tracing (no op is added to the
    graph, so a compiled step pays nothing per step), and at each eager call.

    Integer targets (class labels) must be ``[N]`` or ``[N, 1]`` for ``[N, classes]``
    logits (or the logits' shape); float targets must have the predictions' shape,
    trailing size-1 axes aside. The values must be a scalar or start with the ``N``
    examples, and hold no more values than the predictions or targets do (a ``[N, N]``
    from broadcasting ``[N] - [N, 1]``, or a wrong length, is an error). Dimensions
    unknown at trace time, and targets or predictions that are not single tensors, are
    not checked.

    Args:
      what: the loss or metric, as the message names it (e.g. ``"Learner loss mse"``).

    Raises:
      ValueError: naming ``what`` and the shapes.
    """
    shapes = []
    for value in (y_true, y_pred) + (() if values is None else (values,)):
        shape = getattr(value, "shape", None)
        if shape is None or not hasattr(value, "dtype") or \
                tf.TensorShape(shape).rank is None:
            return
        shapes.append(tf.TensorShape(shape).as_list())
    target, predicted, given = (shapes + [None])[:3]
    integer = tf.as_dtype(y_true.dtype).is_integer
    if integer:
        fits = any(_fit(target, s) for s in (predicted, predicted[:-1],
                                             predicted[:-1] + [1])) if predicted else False
        need = ("integer class labels need shape [examples] or [examples, 1] for "
                "[examples, classes] logits")
    else:
        fits = _fit(_trailing_squeezed(target), _trailing_squeezed(predicted))
        need = ("regression targets need the predictions' shape (trailing size-1 axes "
                "aside): check the model's number of outputs, and that inputs and targets "
                "hold the same examples")
    if not fits:
        raise ValueError(f"{what}: targets of shape {target} do not fit predictions of "
                         f"shape {predicted}; {need}")
    if not given:  # not given, or a scalar
        return
    examples = predicted[0] if predicted else None
    sizes = [tf.TensorShape(s).num_elements() for s in (target, predicted, given)]
    too_many = None not in sizes and sizes[2] > max(sizes[0], sizes[1],
                                                    examples or 0)
    if (examples is not None and given[0] is not None and given[0] != examples) \
            or too_many:
        raise ValueError(
            f"{what} gives values of shape {given} for {examples} examples (targets "
            f"{target}, predictions {predicted}): it must give one value per example "
            f"([{examples}]) or a scalar; a shape like [{examples}, {examples}] is a "
            "broadcast of targets and predictions of different ranks (e.g. [N] - [N, 1]), "
            "averaged into a wrong loss")


def check_metrics(learner: "Learner", metrics: Dict[str, Any], where: str
                  ) -> Dict[str, Any]:
    """``metrics`` (one task's figures, or a batch's) checked against the names the
    learner declares (:attr:`Learner.metric_names`): :meth:`Learner.run_task` and
    :meth:`Learner.run_tasks` run it on what they give, so an undeclared or missing
    figure is the same clear error whichever formulation runs (never dropped, never a
    raw nest error).

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
              "objective_of returns")
    return metrics


BATCHED_METHODS = ("forward", "predict", "task_initial_weights", "query_data",
                   "adapt_and_measure", "objective_of")
"""The learner's per-task methods that :meth:`Learner.run_tasks` (every task at once
through the model's layers) runs as ``Learner`` defines them: a class that overrides one
runs its tasks one by one (``MapFn``, ``Accumulate``)."""


def check_resumable(learner: "Learner", who: str) -> None:
    """Raises ``TypeError`` naming ``who`` unless the learner's adapter is a loop that a
    carried trajectory can continue (``begin``, ``resume``, ``run_steps``: a
    ``GradientDescent``)."""
    adapter = learner.adapter
    if not all(callable(getattr(adapter, m, None)) for m in ("begin", "resume", "run_steps")):
        raise TypeError(f"{who} carries a GradientDescent inner loop across outer steps; "
                        f"the learner's adapter is {type(adapter).__name__}")


def predict_on(learner: "Learner", weights: Any, x: Any, y: Any) -> Any:
    """``learner.predict(weights, x)`` for inputs ``x`` whose labels are ``y``: for a
    padded episode the padding is kept out of the batch statistics (BatchNorm in
    training mode)."""
    with functional.example_mask(example_mask(y)):
        return learner.predict(weights, x)


def support_objective(learner: "Learner") -> LossFn:
    """What the learner's adapter minimises, as it receives it: the learner's
    :meth:`~Learner.support_loss`, given in its two halves
    (:class:`~metalearn.pieces.SplitLoss`: the model's outputs on the support set, then
    :meth:`~Learner.task_loss`) unless the learner's class overrides ``support_loss``,
    whose halves cannot be known (an adapter that needs them then says so)."""
    if type(learner).support_loss is not Learner.support_loss:
        return learner.support_loss
    return SplitLoss(learner._support_outputs, learner.task_loss)


ONE_RUN_METHODS = ("run_task", "adapt_and_measure")
"""The learner's methods that :meth:`Learner.run_task` given several counts of inner
steps replaces by one run along the trajectory: a class that overrides one runs each
count on its own."""


class TaskAxisRules(Piece):
    """The learner's own part in running its tasks, held among its
    :attr:`~Learner.pieces` so that the questions are asked of the pieces alone: on a
    task axis (:meth:`Learner.run_tasks`, the ``Batched`` formulation), whether its
    model's layers have batched rules (:func:`metalearn.functional.batched.supports`)
    and whether its class runs the per-task methods :meth:`~Learner.run_tasks` runs
    (:data:`BATCHED_METHODS`) as ``Learner`` defines them; for several counts of inner
    steps from one run (``Capabilities.step_prefix``, :meth:`Learner.run_task` given
    counts), whether its class adapts as ``Learner`` does (:data:`ONE_RUN_METHODS`)
    and its adapter reports no figures of a whole run."""

    def __init__(self, reasons: Sequence[str], one_run_reasons: Sequence[str] = ()):
        super().__init__(name="task_axis_rules")
        self.reasons = list(reasons)
        self.one_run_reasons = list(one_run_reasons)

    def own_capabilities(self) -> Capabilities:
        return Capabilities(task_axis=not self.reasons,
                            step_prefix=not self.one_run_reasons)

    def own_task_axis_reasons(self) -> List[str]:
        return list(self.reasons)

    def own_step_prefix_reasons(self) -> List[str]:
        return list(self.one_run_reasons)


@gin.configurable
@configurables.moved_members(_MOVED_MEMBERS)
@configurables.moved_keywords(_MOVED)
class Learner(tf.Module):
    """A Keras model, an inner-loop adapter and a task loss.

    Works on any unmodified, built Keras 3 model: adaptation runs the model through
    :func:`metalearn.functional.call` with weights given as tensors, so no variable is
    ever assigned by :meth:`adapt`, and meta-gradients reach :attr:`meta_variables`
    through every inner step.

    Example::

        learner = metalearn.Learner(model, adapter=metalearn.adapters.GradientDescent(
            steps=1, learning_rate=0.01), loss=keras.losses.MeanSquaredError())
        fast = learner.adapt(support_x, support_y)   # Adapted(weights, state); variables untouched
        y_hat = learner.predict(fast, query_x)
        loss = learner.meta_loss(episodes)           # mean query loss over the tasks

    One task runs in :meth:`run_task`, the one pipeline every formulation, outer rule
    and evaluation calls (split, task start, adapt, query data, predict, measure,
    objective), so an override is honoured everywhere. Methods meant to be overridden in
    research code: :meth:`task_loss` (the loss of one task's predictions), :meth:`split`
    (how an episode becomes support and query), :meth:`objective_of` (what is
    minimised and measured on one task's run), :meth:`query_data`, :meth:`predict`,
    :meth:`support_loss` and :meth:`task_initial_weights` (where one task's inner loop
    starts; by default the ``task_init`` pieces).

    :attr:`loss` and :attr:`metrics` are the task loss and the metrics by name, as
    given (names resolved to functions); each value they give is checked against the
    targets' and predictions' shapes once, while tracing (:func:`check_loss_shapes`).

    :attr:`meta_step` is the outer-step counter (an int64 ``tf.Variable``, also given to
    the adapter): the compiled meta-step of :mod:`metalearn.training` advances it after
    each update and the training loop checkpoints it as ``step``. Schedules over
    meta-training read it inside the graph, in pieces and in model layers that ask for
    it (those with ``meta_step`` and ``bind``, e.g. :class:`~metalearn.layers.DropBlock`).

    Args:
      model: a built Keras model.
      adapter: the inner loop; defaults to one MAML step, ``GradientDescent()``.
      loss: ``loss(y_true, y_pred)``, a Keras loss object, function or name; the mean of
        its output is a task's loss.
      metrics: extra per-task metrics by name, ``fn(y_true, y_pred)`` (mean of output),
        or the string ``"accuracy"``; reported with the query loss.
      query_training: run the query forward pass in training mode, so BatchNorm uses the
        query batch's statistics (the MAML paper's transductive setting). With ``False``
        it uses the moving statistics, which adaptation never updates.
      task_init: :class:`~metalearn.learners.task_init.TaskInit` pieces that set some
        weights per task before the inner loop (``ZeroInit``, Proto-MAML's
        ``PrototypeInit``, a CAVIA context), applied in order. Their weights are not
        meta-learned: they are left out of :attr:`meta_variables` (see
        ``pieces.task_paths``). ``[ZeroInit(("head",))]`` starts every task's linear head at
        zero (the "zeroing trick" of Kao et al., 2022): the meta-learned model then
        cannot depend on how a task's labels are numbered.
      name: the ``tf.Module`` name.

    How a batch of tasks runs is not the learner's: it is a formulation of
    :mod:`metalearn.execution` (``MapFn``, ``Unrolled``, ``Batched``, ``Accumulate``,
    ``Auto``), given to :meth:`meta_metrics`, the outer rule's step and evaluation.
    """

    def __init__(self, model: keras.Model, adapter: Optional[Adapter] = None,
                 loss: Optional[Union[str, MetricFn]] = None,
                 metrics: Optional[Mapping[str, Union[str, MetricFn]]] = None,
                 query_training: bool = True, task_init: Sequence[TaskInit] = (),
                 name: Optional[str] = None):
        super().__init__(name=name)
        functional.check_built(model)
        model_weights = functional.weights(model)
        task_init = list(task_init)
        for piece in task_init:
            if not isinstance(piece, TaskInit):
                raise TypeError(f"task_init must hold metalearn TaskInit pieces, got "
                                f"{piece!r}")
        if loss is None:
            raise ValueError("Learner needs a loss, e.g. keras.losses.MeanSquaredError()")
        self.model = model
        self.adapter = GradientDescent() if adapter is None else adapter
        if not isinstance(self.adapter, Adapter):
            raise TypeError(f"adapter must be a metalearn.adapters.Adapter, got {adapter!r}")
        self.loss = _as_fn("loss", loss)
        self.metrics = {str(k): _as_fn(f"metric {k!r}", v)
                        for k, v in dict(metrics or {}).items()}
        if "loss" in self.metrics:
            raise ValueError("'loss' is reserved for the query loss; rename that metric")
        self.query_training = bool(query_training)
        self.task_init = task_init
        dtype = tf.as_dtype(model.trainable_variables[0].dtype)
        self._metric_dtype = functional.metric_dtype(model)
        self.loss = in_precision(self.loss, dtype)
        self.metrics = {k: in_precision(v, dtype) for k, v in self.metrics.items()}
        # The outer-step counter: advanced by the compiled meta-step (training.loop),
        # checkpointed with the learner, read by schedules over meta-training.
        self.meta_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="meta_step")
        self._task_axis_rules = TaskAxisRules(self._own_task_axis_reasons(),
                                              self._own_step_prefix_reasons())
        for piece in [*self.pieces, *_step_reading_layers(model)]:
            if piece.meta_step is None:
                piece.bind(self.meta_step)
        if not self.adapter.built:
            self.adapter.build(model, model_weights)
        for piece in task_init:
            piece.build(model, model_weights)
        for piece in task_init:
            clash = set(piece.task_paths(model_weights)) & set(
                self.adapter.task_paths(model_weights))
            if clash:
                raise ValueError(f"task_init {type(piece).__name__} sets weights that the "
                                 f"adapter {type(self.adapter).__name__} sets per task: "
                                 f"{sorted(clash)}")

    # The loss and metrics were once private; subclasses may still use the old names.
    _loss = property(lambda self: self.loss,
                     lambda self, value: setattr(self, "loss", value))
    _metrics = property(lambda self: self.metrics,
                        lambda self, value: setattr(self, "metrics", value))

    @property
    def pieces(self) -> Pieces:
        """The learner's pieces as one :class:`~metalearn.pieces.Pieces`: every
        :class:`~metalearn.pieces.Piece` the learner holds as an attribute (alone, or in
        a list, tuple or dict), in the order they were set: its adapter, task
        initialisers and :class:`TaskAxisRules`, and whatever a subclass sets (an
        embedding learner's head), so a subclass's piece is asked like the others
        without an override. What they allow and measure, combined over every part:
        ``pieces.capabilities``, ``pieces.gradient_metrics`` (backward-pass figures
        the meta-step reports)."""
        found, seen = [], set()
        for name, value in vars(self).items():
            if name.startswith("_self_") or isinstance(value, (keras.Model, tf.Variable)):
                continue  # TensorFlow's tracking records, the model, the step counter
            for item in tf.nest.flatten(value):  # lists and dicts (tracked wrappers too)
                if isinstance(item, Piece) and id(item) not in seen:
                    seen.add(id(item))
                    found.append(item)
        return Pieces(found)

    # --- what the outer step trains ----------------------------------------------

    @property
    def meta_variables(self) -> List[keras.Variable]:
        """Everything the outer step differentiates: the model's initial weights (minus
        those set per task) and every piece's meta-learned state, once each."""
        per_task = set(self.pieces.task_paths(self.initial_weights()))
        found = [v for p, v in functional.variables(self.model).items()
                 if p not in per_task]
        seen = {id(v) for v in found}
        return found + [v for v in self.pieces.meta_variables if id(v) not in seen]

    def initial_weights(self) -> Weights:
        """The model's current weights as tensors (the meta-learned initialisation;
        :meth:`task_initial_weights` then sets the per-task ones)."""
        return functional.weights(self.model)

    # --- one task ----------------------------------------------------------------

    def forward(self, weights: Union[Weights, Adapted], x: Any, training: bool = True,
                state: Optional[Dict[str, Any]] = None) -> Any:
        """The model's output on ``x`` with the given weights (through the adapter's
        :meth:`~metalearn.adapters.Adapter.forward`, which is a plain call unless the
        adapter generates weights per input or reads the task's ``state``, ``None`` in
        the inner loop). ``weights`` may be what :meth:`adapt` gives (an
        :class:`~metalearn.learners.Adapted`): its weights, and its state unless
        ``state`` is given."""
        if isinstance(weights, Adapted):
            weights, state = weights.weights, weights.state if state is None else state
        call = lambda w, inputs: functional.call(self.model, w, inputs, training=training)
        outputs = self.adapter.forward(call, weights, x) if not state \
            else self.adapter.forward(call, weights, x, state=state)
        # a mixed-precision model's outputs (float16/bfloat16) cast up, so losses,
        # metrics and meta-gradients are computed in float32
        return functional.full_precision(outputs, self._metric_dtype)

    def task_loss(self, y_true: Any, y_pred: Any) -> tf.Tensor:
        """Scalar loss of one task's predictions (override for a custom loss): the mean
        of :attr:`loss`'s values, whose shapes are checked first (once, while tracing;
        see :func:`check_loss_shapes`). For padded episodes
        (:class:`~metalearn.tasks.episode.MaskedLabels`) the mean over the real
        examples, the task's absent classes left out of the logits."""
        what = f"{type(self).__name__} loss {name_of(self.loss)}"
        labels, mask, classes = unmask(y_true)
        if classes is not None:
            y_pred = restrict_to_classes(y_pred, classes)
        check_loss_shapes(what, labels, y_pred)
        values = per_example(self.loss, labels, y_pred) if mask is not None \
            else self.loss(labels, y_pred)
        check_loss_shapes(what, labels, y_pred, values)
        if mask is None:
            return tf.cast(tf.reduce_mean(values), self._metric_dtype)
        return tf.cast(masked_mean(values, mask, what), self._metric_dtype)

    def _support_outputs(self, weights: Weights, x: Any, y: Any) -> Any:
        # the model's outputs on a support batch (y gives the padding mask of batch
        # statistics): the first half of support_loss
        with functional.example_mask(example_mask(y)):
            return self.forward(weights, x, training=True)

    def support_loss(self, weights: Weights, x: Any, y: Any) -> tf.Tensor:
        """The inner loop's objective: the task loss on a support batch (override for
        another; the adapter receives it through :func:`support_objective`)."""
        return self.task_loss(y, self._support_outputs(weights, x, y))

    def adapt(self, support_x: Any, support_y: Any, steps: Optional[int] = None,
              weights: Optional[Weights] = None) -> Adapted:
        """The task's solution from its support set (no task axis): an
        :class:`~metalearn.learners.Adapted`, the adapted weights and the task's state
        (empty for a plain inner loop; a head's fit, an encoded context), what
        :meth:`predict` takes.

        Args:
          support_x, support_y: one task's support examples.
          steps: inner steps, overriding the adapter's default (e.g. more at test time).
          weights: starting weights; defaults to :meth:`initial_weights`.
        """
        return self.adapt_and_measure(support_x, support_y, steps, weights)[0]

    def adapt_and_measure(self, support_x: Any, support_y: Any, steps: Optional[int] = None,
                          weights: Optional[Weights] = None
                          ) -> Tuple[Adapted, Dict[str, tf.Tensor]]:
        """:meth:`adapt`'s result and the adapter's figures of the adaptation
        (:meth:`~metalearn.adapters.Adapter.adapt_and_measure`), what
        :meth:`run_task` reports: the adapted weights, with the adapter's
        :meth:`~metalearn.adapters.Adapter.task_state` as the state. Subclasses that
        add to the task's solution (a head's fit) override this method (``adapt``
        calls it)."""
        weights = self.initial_weights() if weights is None else weights
        weights = self.task_initial_weights(weights, support_x, support_y)
        adapted, figures = self.adapter.adapt_and_measure(
            weights, support_x, support_y, support_objective(self), steps=steps)
        return self._solution(adapted, support_x, support_y), figures

    def task_initial_weights(self, weights: Weights, support_x: Any,
                             support_y: Any) -> Weights:
        """Where one task's inner loop starts: ``weights`` with every ``task_init``
        piece applied in order (override to set weights from the support set another
        way)."""
        for piece in self.task_init:
            weights = piece.initial(weights, support_x, support_y)
        return weights

    def predict(self, adapted: Union[Adapted, Weights], x: Any) -> Any:
        """Predictions on query inputs with what :meth:`adapt` gave (an
        :class:`~metalearn.learners.Adapted`; weights by path alone are taken as
        ``Adapted(weights, {})``, e.g. predictions before adaptation)."""
        return self.forward(Adapted.of(adapted, f"{type(self).__name__}.predict"), x,
                            training=self.query_training)

    def query_data(self, adapted: Adapted, query_x: Any, query_y: Any) -> Tuple[Any, Any]:
        """The query set the task's solution (``adapted``, what :meth:`adapt` gave) is
        measured on: the episode's ``(query_x, query_y)`` as sampled (the default).
        Override it for data produced by the adapted model inside the step (a rollout
        of the adapted policy, queries chosen from the adapted model's predictions): a
        function of ``adapted`` in TensorFlow, through which the meta-gradient flows to
        every order.
        ``tests/adapters/adapted_data_test.py`` checks such a task against finite
        differences."""
        return query_x, query_y

    def split(self, episode: Episode) -> Tuple[Any, Any, Any, Any]:
        """``(support_x, support_y, query_x, query_y)`` of one episode (override to
        change what the inner loop sees, e.g. to add context inputs)."""
        return episode.support_x, episode.support_y, episode.query_x, episode.query_y

    # --- the task run: the one pipeline ----------------------------------------------

    records_trajectory: bool = False
    """Whether :meth:`run_task` records the weights after every inner step
    (:attr:`TaskRun.trajectory`) for :meth:`objective_of` (MAML++'s multi-step loss). Only
    a run of the adapter's own steps (``steps=None``: training, and a carried segment)
    records them: a run of a number of steps given explicitly (evaluation) is measured
    after its last step. Needs an adapter with ``adapt_trajectory`` (``GradientDescent``)."""

    def run_task(self, episode: Episode, steps: Union[None, int, Sequence[int]] = None,
                 weights: Optional[Weights] = None,
                 resume: Optional[Resume] = None, measure: bool = True
                 ) -> Union[TaskRun, Dict[int, TaskRun]]:
        """One task's run, the pipeline every formulation, outer rule and evaluation
        calls: :meth:`split`, the task start (:meth:`task_initial_weights`), adaptation
        (:meth:`adapt_and_measure`), :meth:`query_data`, :meth:`predict`,
        :meth:`query_metrics`, then :meth:`objective_of`.

        Given several counts of inner steps (``steps`` a list or tuple, e.g.
        ``(1, 5, 10)``), the runs after each, by count: each what ``run_task(episode,
        count, ...)`` gives, with the same ops. Where the pieces allow it
        (``pieces.capabilities.step_prefix``: every piece says that the first ``k``
        steps of an ``n``-step run are a ``k``-step run, and the learner's class adapts
        as ``Learner`` does) the task adapts once, for the most steps, along its
        trajectory (:func:`adapt_trajectory`), and the weights after each count are
        measured as a run of that count is (the adapter's task state, then
        :meth:`query_data` on): evaluation after 1, 5 and 10 steps runs 10 inner steps,
        not 16. Otherwise (``pieces.step_prefix_reasons()`` say why) one run per count.

        Args:
          episode: one episode (no task axis).
          steps: inner steps, overriding the adapter's default (e.g. more at test time);
            or a list or tuple of counts (whole numbers ``>= 0``; a repeat runs once).
          weights: starting weights; defaults to :meth:`initial_weights`.
          resume: a carried trajectory to continue (:class:`~metalearn.learners.task.
            Resume`, from :mod:`metalearn.outer.truncated`) instead of adapting from the
            start: ``resume.steps`` inner steps of the adapter's loop
            (``GradientDescent.run_steps``), the update's state after them in
            :attr:`TaskRun.inner_state`.
          measure: ``False`` stops after the predictions (``metrics`` empty, no loss
            computed): what the checks before training compare with the targets
            before a loss sees them.

        Returns:
          A :class:`~metalearn.learners.task.TaskRun`; its ``metrics`` are checked
          against :attr:`metric_names`. Given counts, ``{count: TaskRun}`` in their
          order.
        """
        if isinstance(steps, (list, tuple)):
            return self._run_counts(episode, steps, weights, resume, measure)
        support_x, support_y, query_x, query_y = self.split(episode)
        adapted, figures, trajectory, state = self._adaptation(support_x, support_y, steps,
                                                               weights, resume)
        run = TaskRun(adapted, support_x, support_y, query_x, query_y, None, {}, steps,
                      trajectory, state)
        return self._measured(run, figures, measure)

    def _run_counts(self, episode: Episode, counts: Sequence[int],
                    weights: Optional[Weights], resume: Optional[Resume],
                    measure: bool) -> Dict[int, TaskRun]:
        # run_task given several counts of inner steps
        counts = list(dict.fromkeys(counts))
        if not counts or any(isinstance(k, bool) or not isinstance(k, (int, np.integer))
                             or k < 0 for k in counts):
            raise ValueError(f"run_task needs whole numbers of inner steps >= 0 for its "
                             f"counts, got {counts}")
        if resume is not None:
            raise ValueError("run_task continues a carried trajectory (resume) for "
                             "resume.steps inner steps, not for several counts")
        counts = [int(k) for k in counts]
        if not self.pieces.capabilities.step_prefix:
            return {k: self.run_task(episode, k, weights, measure=measure) for k in counts}
        support_x, support_y, query_x, query_y = self.split(episode)
        path = adapt_trajectory(self, support_x, support_y, max(counts), weights)
        return {k: self._measured(TaskRun(self._solution(path[k], support_x, support_y),
                                          support_x, support_y, query_x, query_y, None,
                                          {}, k), {}, measure)
                for k in counts}

    def _measured(self, run: TaskRun, figures: Dict[str, tf.Tensor],
                  measure: bool = True) -> TaskRun:
        # the steps of run_task after adaptation, on a run of its adapted solution and
        # the episode's query set: query data, predictions, metrics, objective
        query_x, query_y = self.query_data(run.adapted, run.query_x, run.query_y)
        predictions = predict_on(self, run.adapted, query_x, query_y)
        run = run._replace(query_x=query_x, query_y=query_y, predictions=predictions)
        if not measure:
            return run
        metrics = self.query_metrics(query_y, predictions)
        metrics.update({k: tf.cast(v, self._metric_dtype) for k, v in figures.items()})
        run = run._replace(metrics=metrics)
        return run._replace(metrics=check_metrics(self, self.objective_of(run),
                                                  "objective_of"))

    def _adaptation(self, support_x: Any, support_y: Any, steps: Optional[int],
                    weights: Optional[Weights], resume: Optional[Resume]):
        """``(Adapted, the adapter's figures, trajectory or None, carried inner state or
        None)`` of one task: the adaptation step of :meth:`run_task`."""
        keep = self.records_trajectory and steps is None
        if resume is None and not keep:
            adapted, figures = self.adapt_and_measure(support_x, support_y, steps, weights)
            return adapted, figures, None, None
        if resume is None:
            path = adapt_trajectory(self, support_x, support_y, weights=weights)
            return (self._solution(path[-1], support_x, support_y), {},
                    Trajectory(path[1:], 0, len(path) - 1), None)
        adapter = self.adapter
        begun, begun_state = self._begin(support_x, support_y, weights)
        now, now_state = dict(begun), begun_state
        if resume.weights is not None:  # else the trajectory's start
            for path, value in resume.weights.items():
                now[path] = tf.where(resume.fresh, begun[path], value)
            now_state = tf.nest.map_structure(lambda b, c: tf.where(resume.fresh, b, c),
                                              begun_state, resume.state)
        now = adapter.resume(now, resume.start)  # what wrappers set per step: from theta
        ran = adapter.run_steps(now, now_state, support_x, support_y,
                                support_objective(self), resume.start, resume.steps,
                                trajectory=keep)
        path, state = ran if keep else ([ran[0]], ran[1])
        trajectory = Trajectory(path[1:], resume.start, resume.horizon) if keep else None
        return self._solution(path[-1], support_x, support_y), {}, trajectory, state

    def _solution(self, weights: Weights, support_x: Any, support_y: Any) -> Adapted:
        # adapted weights from the adapter's own loop as the task's solution: with the
        # adapter's task state, as adapt_and_measure gives it
        return Adapted(weights, dict(self.adapter.task_state(
            weights, support_x, support_y, support_objective(self))))

    def _begin(self, support_x: Any, support_y: Any, weights: Optional[Weights]):
        adapter = self.adapter
        check_resumable(self, f"{type(self).__name__}.run_task(resume=...)")
        weights = self.initial_weights() if weights is None else weights
        return adapter.begin(self.task_initial_weights(weights, support_x, support_y))

    def objective_of(self, run: TaskRun) -> Dict[str, tf.Tensor]:
        """The task's figures from its run; ``"loss"`` is what the outer step minimises
        (the default: the query loss of :meth:`query_metrics`, with the adapter's
        figures beside it). The one override point for another objective: MAML++'s
        multi-step loss (:class:`~metalearn.learners.MultiStepLossLearner`) and the
        latent neural process's negative ELBO override it, and every outer rule, every
        formulation and evaluation then see the same objective. Figures added here
        must be declared in :attr:`metric_names`."""
        return run.metrics

    def query_metrics(self, query_y: Any, predictions: Any) -> Dict[str, tf.Tensor]:
        """``{"loss": task loss, metric name: value, ...}`` of one task's predictions
        (for a padded episode, means over its real query examples)."""
        results = {"loss": self.task_loss(query_y, predictions)}
        labels, mask, classes = unmask(query_y)
        if classes is not None:
            predictions = restrict_to_classes(predictions, classes)
        for name, fn in self.metrics.items():
            values = fn(labels, predictions)
            what = f"{type(self).__name__} metric {name!r} {name_of(fn)}"
            check_loss_shapes(what, labels, predictions, values)
            value = tf.reduce_mean(values) if mask is None else masked_mean(values, mask, what)
            results[name] = tf.cast(value, self._metric_dtype)
        return results

    # --- every task at once -------------------------------------------------------------

    def _own_task_axis_reasons(self) -> List[str]:
        # what the learner itself (not its adapter's pieces) stands in the way of
        # running its tasks at once: its model, its class's per-task methods
        reasons = []
        reason = batched.supports(self.model)
        if reason:
            reasons.append(reason)
        if self.records_trajectory:
            reasons.append(f"{type(self).__name__} records every inner step's weights "
                           "(records_trajectory)")
        reasons += [f"{type(self).__name__} overrides {method}()"
                    for method in BATCHED_METHODS
                    if getattr(type(self), method) is not getattr(Learner, method)]
        return reasons

    def _own_step_prefix_reasons(self) -> List[str]:
        # what the learner itself (not its pieces) stands in the way of measuring
        # several counts of inner steps along one run: its class's adaptation, the
        # adapter's figures of a whole run
        reasons = [f"{type(self).__name__} overrides {method}()"
                   for method in ONE_RUN_METHODS
                   if getattr(type(self), method) is not getattr(Learner, method)]
        if self.adapter.metric_names:
            reasons.append(f"{type(self.adapter).__name__} measures "
                           f"{list(self.adapter.metric_names)} on a whole run")
        return reasons

    def run_tasks(self, episodes: Episode, steps: Optional[int] = None,
                  weights: Optional[Weights] = None,
                  task_weights: Optional[Weights] = None) -> TaskRun:
        """Every task of ``episodes`` (leading task axis) run at once: each layer of the
        model called once for all tasks, with a task axis on the adapted weights
        (:mod:`metalearn.functional.batched`); the same figures as :meth:`run_task`
        task by task, every field of the result with a leading task axis.

        Args:
          episodes, steps, weights: as for :meth:`run_task` (``weights`` without a
            task axis, shared by every task).
          task_weights: weights by path that already have a task axis, one copy per
            task, in place of those of ``weights`` (what each task's own meta-gradient
            is taken with respect to: ``Batched.task_gradients``).

        Raises:
          ValueError: the learner cannot (its pieces say why:
            ``pieces.task_axis_reasons()``).
        """
        reasons = self.pieces.task_axis_reasons()
        if reasons:
            raise ValueError("the Batched formulation is not available: "
                             + "; ".join(reasons) + ". Use MapFn() or Accumulate().")
        weights = self.initial_weights() if weights is None else weights
        support_x, support_y, query_x, query_y = self.split(episodes)
        tasks = tf.shape(tf.nest.flatten(support_x)[0])[:1]
        unknown = sorted(set(task_weights or {}) - set(weights))
        if unknown:
            raise ValueError(f"run_tasks: task_weights {unknown} are not weights of the "
                             f"model (its paths: {sorted(weights)})")
        per_task = {path: tf.broadcast_to(value, tf.concat([tasks, tf.shape(value)], 0))
                    for path, value in weights.items()}
        per_task.update(task_weights or {})
        per_task = self.task_initial_weights(per_task, support_x, support_y)
        dtype = self._metric_dtype

        def support_losses(task_weights, x, y):
            with functional.example_mask(example_mask(y)):  # [tasks, examples]
                predictions = functional.full_precision(
                    batched.call(self.model, task_weights, x, training=True), dtype)
            return tf.vectorized_map(lambda args: self.task_loss(*args), (y, predictions))

        adapted, figures = self.adapter.adapt_and_measure(per_task, support_x, support_y,
                                                          support_losses, steps=steps)
        # each task's state as adapt gives it; the layers' batched rules below read
        # the weights alone, so an adapter that runs on a task axis must give none
        state = tf.vectorized_map(lambda args: self._solution(*args).state,
                                  (adapted, support_x, support_y))
        if tf.nest.flatten(state):
            raise ValueError(f"{type(self.adapter).__name__} gives a task state "
                             f"({sorted(state)}, task_state) and says it runs on a task "
                             "axis (capabilities.task_axis), but the batched forward pass "
                             "reads the weights alone: its own_capabilities must say "
                             "task_axis=False")
        with functional.example_mask(example_mask(query_y)):
            predictions = functional.full_precision(
                batched.call(self.model, adapted, query_x, training=self.query_training),
                dtype)
        metrics = tf.vectorized_map(lambda args: self.query_metrics(*args),
                                    (query_y, predictions))
        metrics.update({k: tf.cast(v, dtype) for k, v in figures.items()})
        return TaskRun(Adapted(adapted, state), support_x, support_y, query_x, query_y,
                       predictions, check_metrics(self, metrics, "run_tasks"), steps)

    # --- a batch of tasks --------------------------------------------------------

    @property
    def metric_names(self) -> List[str]:
        """What a task run gives (:meth:`run_task`'s metrics): what
        :meth:`query_metrics` gives (``"loss"`` and the learner's metrics) and the
        adapter's figures (:attr:`~metalearn.adapters.Adapter.metric_names`)."""
        return ["loss", *self.metrics, *self.adapter.metric_names]

    def meta_metrics(self, episodes: Episode, steps: Union[None, int, Sequence[int]] = None,
                     weights: Optional[Weights] = None,
                     formulation: Optional["execution.Formulation"] = None
                     ) -> Union[Dict[str, tf.Tensor], Dict[int, Dict[str, tf.Tensor]]]:
        """Per-task metrics of a batch of episodes (leading task axis), each ``[tasks]``.

        Given several counts of inner steps (``steps`` a list or tuple), the metrics
        after each, by count (``{count: {metric: [tasks]}}``, each what ``steps=count``
        gives), every task's counts from one run where the pieces allow it
        (:meth:`run_task`; ``Formulation.metrics_by_steps``): what evaluation traces
        once for all its counts.

        Args:
          episodes: a batch of episodes with a leading task axis.
          steps: inner steps, overriding the adapter's default; or a list or tuple of
            counts.
          weights: initial weights to adapt from; defaults to the model's variables.
          formulation: how the tasks run (:mod:`metalearn.execution`); defaults to
            :class:`~metalearn.execution.Auto`, resolved as the meta-step resolves it.
        """
        if isinstance(episodes, Episode):
            episodes.check_tasks()  # static shapes: at trace time
        if weights is None:
            weights = self.initial_weights()  # read once: one tape record for all tasks
        chosen = execution.formulation(formulation)
        if isinstance(steps, (list, tuple)):
            return chosen.metrics_by_steps(self, episodes, steps, weights)
        return chosen.metrics(self, episodes, steps, weights)

    def meta_loss(self, episodes: Episode, steps: Optional[int] = None,
                  weights: Optional[Weights] = None,
                  formulation: Optional["execution.Formulation"] = None) -> tf.Tensor:
        """Mean query loss after adaptation over a batch of episodes (leading task axis)."""
        return tf.reduce_mean(self.meta_metrics(episodes, steps, weights, formulation)["loss"])


def adapt_trajectory(learner: Learner, support_x: Any, support_y: Any,
                     steps: Optional[int] = None,
                     weights: Optional[Weights] = None) -> List[Weights]:
    """The weights after 0, 1, ..., ``steps`` inner steps of one task (from ``weights``,
    default the learner's initial weights, after the task start): the adapter's
    ``adapt_trajectory`` on the learner's support objective."""
    weights = learner.initial_weights() if weights is None else weights
    weights = learner.task_initial_weights(weights, support_x, support_y)
    return learner.adapter.adapt_trajectory(weights, support_x, support_y,
                                            support_objective(learner), steps=steps)


def objective(learner: Learner, values: Sequence[Any], episodes: Episode,
              steps: Optional[int] = None,
              formulation: Optional["execution.Formulation"] = None
              ) -> Dict[str, tf.Tensor]:
    """Per-task metrics with every meta-variable at the given value, nothing assigned:
    the meta-loss as a function of the values of *all* of ``learner.meta_variables`` (model
    weights, learned hyperparameters, head and piece variables), what a black-box
    outer rule (evolution strategies) perturbs and finite differences check.

    Args:
      values: one tensor per :attr:`meta_variables`, in order.
      episodes: a batch of episodes with a leading task axis.

    Raises:
      ValueError: not one value per meta-variable, or a value of another shape or
        dtype.
    """
    variables = learner.meta_variables
    values = list(values)
    if len(values) != len(variables):
        raise ValueError(f"objective needs one value per meta-variable "
                         f"({len(variables)}), got {len(values)}")
    mapping = []
    for variable, value in zip(variables, values):
        if tf.is_tensor(value) and value.dtype != variable.dtype:
            raise ValueError(f"objective: the value for {variable.path} is "
                             f"{value.dtype.name}, the variable {variable.dtype}")
        value = tf.convert_to_tensor(value, dtype=variable.dtype)
        if not value.shape.is_compatible_with(variable.shape):
            raise ValueError(f"objective: the value for {variable.path} has shape "
                             f"{value.shape.as_list()}, the variable "
                             f"{list(variable.shape)}")
        mapping.append((variable, value))
    with keras.StatelessScope(state_mapping=mapping):
        return learner.meta_metrics(episodes, steps, formulation=formulation)
