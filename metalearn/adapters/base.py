"""The inner-loop interface: pieces, their capabilities, and adapters.

An inner loop is built from *pieces* (:class:`Piece`): an :class:`Adapter` (the loop,
or a hypernetwork), the update transforms it applies to gradients
(:mod:`metalearn.adapters.updates`), the wrappers around its steps
(:mod:`metalearn.adapters.wrappers`). A composite never copies its parts' flags: what it
can do (:attr:`Piece.capabilities`), which weights it sets per task
(:meth:`Piece.task_paths`) and what it meta-learns (:attr:`Piece.meta_variables`) are
computed from every part it holds, found by ``tf.Module``'s own attribute traversal
(attributes, lists, tuples and dicts of pieces). A wrapper cannot forget to forward one.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import re
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import gin
import keras
import numpy as np
import tensorflow as tf

from metalearn.functional import Weights

LossFn = Callable[[Weights, Any, Any], tf.Tensor]
"""``loss_fn(weights, x, y)``: a task's scalar loss of the model run with ``weights``."""

CallFn = Callable[[Weights, Any], Any]
"""``call(weights, x)``: the model's output on ``x`` run with ``weights``."""


class SplitLoss:
    """A :data:`LossFn` that also gives its two halves: the model's outputs and the loss
    of those outputs, ``loss_fn(w, x, y) == loss(y, outputs(w, x, y))``.

    The learner hands its support loss to the adapter in this form (where the loss is
    its own, not an override of ``support_loss``), so an inner loop that needs the
    curvature of the loss in the outputs (Gauss-Newton products in
    :class:`~metalearn.adapters.ImplicitGradientDescent`) can ask for it; every other
    adapter just calls it.

    Args:
      outputs: ``outputs(weights, x, y)``, the model's outputs on ``x`` (``y`` given for
        what depends on the labels, e.g. the padding mask of batch statistics).
      loss: ``loss(y, outputs)``, the task's scalar loss of those outputs.
    """

    def __init__(self, outputs: Callable[[Weights, Any, Any], Any],
                 loss: Callable[[Any, Any], tf.Tensor]):
        self.outputs, self.loss = outputs, loss

    def __call__(self, weights: Weights, x: Any, y: Any) -> tf.Tensor:
        return self.loss(y, self.outputs(weights, x, y))


def select_paths(paths: Sequence[str], patterns: Sequence[str], what: str,
                 exclude: Sequence[str] = ()) -> List[str]:
    """The ``paths`` (in order) that a regular expression in ``patterns`` matches
    (``re.search``), minus ``exclude``.

    Raises:
      ValueError: nothing matches; the message names ``what`` (e.g. ``"Mask"``), the
        patterns and the available paths.
    """
    excluded = set(exclude)
    selected = [p for p in paths
                if p not in excluded and any(re.search(r, p) for r in patterns)]
    if not selected:
        note = f" ({sorted(excluded)} excluded)" if excluded else ""
        raise ValueError(f"{what}={tuple(patterns)!r} matches none of the weights "
                         f"{list(paths)}{note}")
    return selected


def clamp_step(step: Any, last: int) -> Any:
    """``min(step, last)`` for an inner-step index that is a Python int (steps unrolled)
    or a scalar integer tensor (steps in a ``tf.while_loop``:
    :class:`~metalearn.adapters.wrappers.WhileLoop`)."""
    if isinstance(step, (int, np.integer)):
        return min(int(step), last)
    return tf.minimum(step, last)


def check_patterns(patterns: Any, what: str) -> tuple:
    """``patterns`` as a tuple of regular expressions over weight paths; raises
    ``ValueError`` naming ``what`` unless it is a non-empty list of them."""
    if patterns is gin.REQUIRED or isinstance(patterns, str) or not patterns:
        raise ValueError(f"{what} needs a non-empty list of path patterns, got {patterns!r}")
    return tuple(patterns)


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What an inner loop allows; a composite's are the combination of its parts'.

    Attributes:
      custom_gradient: some part computes its gradient with ``tf.custom_gradient``
        (implicit differentiation, recomputed steps). TensorFlow ignores custom
        gradients inside ``tf.map_fn``'s loop, so the learner then runs a batch's tasks
        unrolled. Any part having it gives it to the whole.
      task_axis: the loop also works on weights with a leading task axis
        (``[tasks, *shape]``) and a ``loss_fn`` returning one loss per task, treating
        tasks independently (the ``Batched()`` formulation needs it). Elementwise
        steps qualify; anything that mixes values across a whole weight vector (a
        global norm, a dot product) or indexes one task's examples does not. Every part
        must have it.
    """

    custom_gradient: bool = False
    task_axis: bool = True

    def __and__(self, other: "Capabilities") -> "Capabilities":
        return Capabilities(custom_gradient=self.custom_gradient or other.custom_gradient,
                            task_axis=self.task_axis and other.task_axis)


class Piece(tf.Module):
    """A part of an inner loop. Subclasses say what they themselves need; what a
    composite needs is computed over every piece it holds.

    Override :meth:`own_capabilities`, :meth:`own_task_paths` and
    :meth:`own_meta_variables` for the piece itself; never the combined
    :attr:`capabilities`, :meth:`task_paths` or :attr:`meta_variables`.

    :attr:`meta_step` is the learner's outer-step counter (an int64 ``tf.Variable`` the
    compiled meta-step advances). :class:`~metalearn.Learner` sets it on its adapter and
    on every piece inside it; it is ``None`` for a piece used alone. Schedules over
    meta-training read it inside the graph (``tf.where``), so nothing retraces.
    """

    def __init__(self, name: Optional[str] = None):
        super().__init__(name=name)
        self.meta_step: Optional[tf.Variable] = None

    # --- what this piece itself says ---------------------------------------------

    def own_capabilities(self) -> Capabilities:
        """This piece's own needs, its parts' aside (default: no custom gradient,
        works on a task axis)."""
        return Capabilities()

    def own_task_paths(self, weights: Weights) -> Sequence[str]:
        """Paths of model weights this piece sets per task (never meta-trained)."""
        return ()

    def own_meta_variables(self) -> List[tf.Variable]:
        """Variables this piece meta-learns, its parts' aside."""
        return []

    # --- what the whole says: computed over the parts ------------------------------

    def parts(self) -> List["Piece"]:
        """Every piece inside this one (recursively), found by ``tf.Module``."""
        return [m for m in self.submodules if isinstance(m, Piece)]

    @property
    def capabilities(self) -> Capabilities:
        """This piece's :meth:`own_capabilities` combined with every part's."""
        return functools.reduce(lambda a, b: a & b,
                                [p.own_capabilities() for p in [self, *self.parts()]])

    def task_paths(self, weights: Weights) -> List[str]:
        """Paths (in ``weights`` order) that this piece or any part sets per task."""
        found = set()
        for piece in [self, *self.parts()]:
            found.update(piece.own_task_paths(weights))
        return [p for p in weights if p in found]

    def own_gradient_metrics(self) -> Dict[str, tf.Variable]:
        """What this piece measures in its backward pass (a linear solve's residual),
        by metric name: for each, a scalar zero variable (a handle, never assigned, not
        checkpointed) that the piece's gradient computation reads and whose gradient it
        sets to the figure of each task (see
        :func:`metalearn.adapters.implicit_diff.implicit_solution`'s ``report``). The
        meta-step differentiates the meta-loss with respect to the handles too and
        reports each gradient's mean over tasks with the other metrics."""
        return {}

    @property
    def gradient_metrics(self) -> Dict[str, tf.Variable]:
        """:meth:`own_gradient_metrics` of this piece and every part."""
        found: Dict[str, tf.Variable] = {}
        for piece in [self, *self.parts()]:
            found.update(piece.own_gradient_metrics())
        return found

    @property
    def meta_variables(self) -> List[tf.Variable]:
        """Variables the outer step trains: this piece's and every part's, once each."""
        found, seen = [], set()
        for piece in [self, *self.parts()]:
            for variable in piece.own_meta_variables():
                if id(variable) not in seen:
                    seen.add(id(variable))
                    found.append(variable)
        return found

    def bind(self, meta_step: Optional[tf.Variable]) -> None:
        """Gives this piece and every part the learner's outer-step counter."""
        for piece in [self, *self.parts()]:
            piece.meta_step = meta_step


_LEGACY_FLAGS = {
    "needs_unrolled_tasks": "own_capabilities() returning Capabilities(custom_gradient=...)",
    "supports_task_axis": "own_capabilities() returning Capabilities(task_axis=...)",
    "generated_paths": "own_task_paths(weights)",
}


class Adapter(Piece, abc.ABC):
    """Maps (initial weights, support set) to adapted weights, as a pure function.

    An adapter may own meta-learned state (learned inner learning rates, a
    hypernetwork): it creates it in :meth:`build` and lists it in
    :meth:`own_meta_variables`, and the outer step trains it with the model's initial
    weights. :meth:`adapt` must never assign to any variable; it returns new tensors.

    To write an adapter, subclass this and implement :meth:`adapt` (and :meth:`build` if
    it owns variables); say what it allows in :meth:`own_capabilities` (an adapter
    works on a task axis only if it says so). To change how gradient steps update the
    weights, write an update transform instead (:mod:`metalearn.adapters.updates`),
    see docs/tutorials/inner_loop_piece.md.
    """

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for name, instead in _LEGACY_FLAGS.items():
            if name in cls.__dict__:
                raise TypeError(f"{cls.__name__} defines {name!r}, which metalearn 0.2 "
                                f"computes from an adapter's parts: define {instead} "
                                "instead (BUILD.md, 'Migration')")

    def __init__(self, name: Optional[str] = None):
        super().__init__(name=name)
        self._built = False

    def own_capabilities(self) -> Capabilities:
        return Capabilities(task_axis=False)  # an adapter must say it works on a task axis

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
    def needs_unrolled_tasks(self) -> bool:
        """Whether a batch's tasks must run unrolled (``capabilities.custom_gradient``)."""
        return self.capabilities.custom_gradient

    @property
    def supports_task_axis(self) -> bool:
        """Whether the ``Batched()`` formulation works (``capabilities.task_axis``)."""
        return self.capabilities.task_axis

    def forward(self, call: CallFn, weights: Weights, x: Any) -> Any:
        """The model's output on a batch ``x`` with (adapted) ``weights``.

        ``Learner.forward`` (so the support loss and query predictions alike) goes
        through this. The default is ``call(weights, x)``: one set of weights for the
        whole batch. An adapter whose weights depend on each input (a hypernetwork
        conditioned on the input itself) overrides it.
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

    @property
    def metric_names(self) -> Tuple[str, ...]:
        """Names of the per-task figures :meth:`adapt_and_measure` reports (how well the
        inner loop did, e.g. its support loss); none by default."""
        return ()

    def adapt_and_measure(self, weights: Weights, support_x: Any, support_y: Any,
                          loss_fn: LossFn, steps: Optional[int] = None
                          ) -> Tuple[Weights, Dict[str, tf.Tensor]]:
        """:meth:`adapt`, and scalars by each of :attr:`metric_names` measured on the
        way (what the learner reports with its query metrics, in training and in
        evaluation). The default measures nothing."""
        return self.adapt(weights, support_x, support_y, loss_fn, steps=steps), {}

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

    def own_capabilities(self) -> Capabilities:
        return Capabilities()

    def adapt(self, weights: Weights, support_x: Any, support_y: Any, loss_fn: LossFn,
              steps: Optional[int] = None) -> Weights:
        return dict(weights)

    def adapt_trajectory(self, weights: Weights, support_x: Any, support_y: Any,
                         loss_fn: LossFn, steps: Optional[int] = None) -> List[Weights]:
        return [dict(weights)]
