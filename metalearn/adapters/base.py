"""The inner-loop interface: how weights are adapted to one task."""

from __future__ import annotations

import abc
import re
from typing import Any, Callable, List, Optional, Sequence

import gin
import keras
import tensorflow as tf

from metalearn.functional import Weights

LossFn = Callable[[Weights, Any, Any], tf.Tensor]
"""``loss_fn(weights, x, y)``: a task's scalar loss of the model run with ``weights``."""

CallFn = Callable[[Weights, Any], Any]
"""``call(weights, x)``: the model's output on ``x`` run with ``weights``."""


def select_paths(weights: Weights, patterns: Sequence[str], what: str,
                 exclude: Sequence[str] = ()) -> List[str]:
    """The paths of ``weights`` (in order) that a regular expression in ``patterns``
    matches (``re.search``), minus ``exclude``.

    Raises:
      ValueError: nothing matches; the message names ``what`` (e.g. ``"adapt"``), the
        patterns and the available paths.
    """
    excluded = set(exclude)
    paths = [p for p in weights
             if p not in excluded and any(re.search(r, p) for r in patterns)]
    if not paths:
        note = f" ({sorted(excluded)} excluded)" if excluded else ""
        raise ValueError(f"{what}={tuple(patterns)!r} matches none of the weights "
                         f"{list(weights)}{note}")
    return paths


class Adapter(tf.Module, abc.ABC):
    """Maps (initial weights, support set) to adapted weights, as a pure function.

    An adapter may own meta-learned state (learned inner learning rates, a
    hypernetwork): it creates it in :meth:`build` and lists it in
    :attr:`meta_variables`, and the outer step trains it with the model's initial
    weights. :meth:`adapt` must never assign to any variable; it returns new tensors.

    Schedules over meta-training (MAML++'s derivative-order annealing) read
    :attr:`meta_step`, the learner's outer-step counter (an int64 ``tf.Variable`` that
    the compiled meta-step advances), with ``tf.where``/``tf.cond`` so nothing retraces.
    :class:`~metalearn.Learner` sets it; it is ``None`` for an adapter used alone.

    To write an adapter, subclass this and implement :meth:`adapt` (and :meth:`build` if
    it owns variables). See BUILD.md, "Adding an adapter".
    """

    needs_unrolled_tasks = False
    """True for adapters whose gradient is a ``tf.custom_gradient``: TensorFlow does not
    apply custom gradients inside ``tf.map_fn``'s loop, so the learner then runs the tasks
    of a batch unrolled whatever its ``task_batching``."""

    supports_task_axis = False
    """True for adapters whose :meth:`adapt` also works on weights with a leading task axis
    (``[tasks, *shape]``) and a ``loss_fn`` returning one loss per task (``[tasks]``),
    treating tasks independently: the learner's ``task_batching="batched"`` needs it.
    Elementwise gradient steps qualify (the gradient of the summed per-task losses is
    every task's own gradient); anything that mixes values across a whole weight vector
    (a dot product, a norm) does not, unless written per task."""

    def __init__(self, name: Optional[str] = None):
        super().__init__(name=name)
        self._built = False
        self.meta_step: Optional[tf.Variable] = None

    def build(self, model: keras.Model, weights: Weights) -> None:
        """Creates the adapter's meta-learned state for ``model``; called once by Learner.

        Args:
          model: the learner's (built) model.
          weights: its initial weights by path, for shapes and dtypes.
        """
        self._built = True

    @property
    def built(self) -> bool:
        return self._built

    @property
    def meta_variables(self) -> List[keras.Variable]:
        """Variables the outer step trains besides the model's (empty by default)."""
        return []

    def generated_paths(self, weights: Weights) -> Sequence[str]:
        """Paths of model weights this adapter replaces outright (never meta-trained)."""
        return ()

    def forward(self, call: CallFn, weights: Weights, x: Any) -> Any:
        """The model's output on a batch ``x`` with (adapted) ``weights``.

        ``Learner.forward`` (so the support loss and query predictions alike) goes
        through this. The default is ``call(weights, x)``: one set of weights for the
        whole batch. An adapter whose weights depend on each input (a hypernetwork
        conditioned on the input itself) overrides it.

        Args:
          call: runs the model on a batch with the given weights.
          weights: weights by path, as :meth:`adapt` returned them.
          x: a batch of inputs.
        """
        return call(weights, x)

    @abc.abstractmethod
    def adapt(self, weights: Weights, support_x: Any, support_y: Any, loss_fn: LossFn,
              steps: Optional[int] = None) -> Weights:
        """Adapts ``weights`` to the task given by its support set.

        Args:
          weights: initial weights by path (tensors; gradients flow through them).
          support_x, support_y: one task's support set, no task axis.
          loss_fn: the task loss of the model run with given weights.
          steps: number of inner steps, overriding the adapter's own where it has one.

        Returns:
          Adapted weights by path (a subset of paths is allowed: missing ones stay at
          the model's variables).
        """

    def adapt_trajectory(self, weights: Weights, support_x: Any, support_y: Any,
                         loss_fn: LossFn, steps: Optional[int] = None) -> List[Weights]:
        """The weights after 0, 1, ..., ``steps`` inner steps (``steps + 1`` entries).

        Needed by learners that look at every inner step (MAML++'s multi-step loss);
        adapters without a notion of steps need not implement it.
        """
        raise NotImplementedError(
            f"{type(self).__name__} does not expose its per-step weights "
            "(adapt_trajectory); the multi-step loss needs an adapter that does, "
            "e.g. GradientDescent")


@gin.configurable
class NoAdaptation(Adapter):
    """No inner loop: the adapted weights are the initial ones (Prototypical Networks,
    or a plain pre-trained model as a baseline)."""

    steps = 0
    supports_task_axis = True

    def adapt(self, weights: Weights, support_x: Any, support_y: Any, loss_fn: LossFn,
              steps: Optional[int] = None) -> Weights:
        return dict(weights)

    def adapt_trajectory(self, weights: Weights, support_x: Any, support_y: Any,
                         loss_fn: LossFn, steps: Optional[int] = None) -> List[Weights]:
        return [dict(weights)]
