"""Adapters: the inner loop's interface (:class:`Adapter`) and :class:`NoAdaptation`.

An adapter is a :class:`~metalearn.pieces.Piece` (the vocabulary, with
:class:`~metalearn.pieces.Capabilities`, path selection, ``clamp_step`` and
:class:`~metalearn.pieces.SplitLoss`, lives one floor below, in
:mod:`metalearn.pieces`, so that heads and learners use it without reaching into
adapters); it holds the update transforms it applies to gradients
(:mod:`metalearn.adapters.updates`) and the wrappers around its steps
(:mod:`metalearn.adapters.wrappers`).

The names that moved to :mod:`metalearn.pieces` stay importable from here.
"""

from __future__ import annotations

import abc
from typing import Any, Dict, List, Optional, Tuple

import gin
import keras
import tensorflow as tf

from metalearn.functional import Weights
from metalearn.pieces.piece import (CallFn, Capabilities, LossFn, Piece,  # noqa: F401
                                    SplitLoss, check_patterns, clamp_step, select_paths)

__all__ = ["Adapter", "CallFn", "Capabilities", "LossFn", "NoAdaptation", "Piece",
           "SplitLoss", "check_patterns", "clamp_step", "select_paths"]

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
                                "instead (CHANGELOG.md, 'Migration')")

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

    def forward(self, call: CallFn, weights: Weights, x: Any,
                state: Optional[Dict[str, Any]] = None) -> Any:
        """The model's output on a batch ``x`` with (adapted) ``weights``.

        ``Learner.forward`` (so the support loss and query predictions alike) goes
        through this. The default is ``call(weights, x)``: one set of weights for the
        whole batch. An adapter whose weights depend on each input (a hypernetwork
        conditioned on the input itself) overrides it.

        Args:
          state: the task's state (:attr:`metalearn.learners.Adapted.state`, which
            holds what :meth:`task_state` gave), given for query predictions after
            adaptation; ``None`` inside the inner loop (the support forward pass), and
            never given to an adapter whose :meth:`task_state` is empty, so an adapter
            written without this argument keeps working.
        """
        return call(weights, x)

    def task_state(self, weights: Weights, support_x: Any, support_y: Any,
                   loss_fn: LossFn) -> Dict[str, Any]:
        """What :meth:`forward` reads besides the weights, computed once per task from
        its support set after :meth:`adapt` (``weights`` are the adapted ones): e.g. a
        neural process's encoded context, ``{"context": {...}}``. The learner keeps it
        in :attr:`metalearn.learners.Adapted.state` beside the adapted weights (never
        inside them) and hands it back to :meth:`forward` for the queries. Nothing by
        default."""
        return {}

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
