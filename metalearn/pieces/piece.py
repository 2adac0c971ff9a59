"""The vocabulary every piece speaks: :class:`Piece`, its :class:`Capabilities`, the
paths it selects and the loss it is handed.

An inner loop, a head, a task initialiser are each built from *pieces*
(:class:`Piece`, a ``tf.Module``): each piece says only what *it* needs
(:meth:`Piece.own_capabilities`, :meth:`Piece.own_task_paths`,
:meth:`Piece.own_meta_variables`); what a composite needs is computed from every part it
holds, found by ``tf.Module``'s own attribute traversal (attributes, lists, tuples and
dicts of pieces), so a wrapper cannot forget to forward one.

This floor sits below the adapters (:mod:`metalearn.adapters`), the heads
(:mod:`metalearn.heads`) and the learners, which all build on it, and above
:mod:`metalearn.functional`.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any, Callable, Dict, List, Optional, Sequence

import gin
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
        tasks independently (the ``Batched`` formulation of :mod:`metalearn.execution`
        needs it). Elementwise steps qualify; anything that mixes values across a whole weight vector (a
        global norm, a dot product) or indexes one task's examples does not. Every part
        must have it.
      first_order: some part treats the inner gradients as constants (FOMAML's
        ``FirstOrder``), so the meta-gradient holds no second-order terms (what the
        ``Auto`` formulation's memory model needs to know). Any part having it gives
        it to the whole.
      padding: the part honours padded episodes (support labels given as
        :class:`~metalearn.tasks.episode.MaskedLabels`, from a variable-way,
        variable-shot sampler): the padded examples contribute nothing and the classes
        the task does not have are out of it. A head must say so (every head of
        :mod:`metalearn.heads` does); the learner refuses padded episodes to a part
        that does not, rather than fit the padding. Every part must have it.
      step_prefix: the first ``k`` steps of an ``n``-step run are a ``k``-step run: a
        step depends on the steps before it and its index alone, never on how many
        steps the run makes (so a learned optimizer fed the fraction of the horizon
        does not have it), and the loop can keep the weights after each step. Then
        :meth:`~metalearn.Learner.run_task` given several counts adapts once, for the
        most steps asked, and measures after each count on the way (evaluation after
        1, 5 and 10 steps: one run of 10). Off unless a piece says it (every shipped
        piece that qualifies does); every part must have it.
    """

    custom_gradient: bool = False
    task_axis: bool = True
    first_order: bool = False
    padding: bool = True
    step_prefix: bool = False

    def __and__(self, other: "Capabilities") -> "Capabilities":
        return Capabilities(custom_gradient=self.custom_gradient or other.custom_gradient,
                            task_axis=self.task_axis and other.task_axis,
                            first_order=self.first_order or other.first_order,
                            padding=self.padding and other.padding,
                            step_prefix=self.step_prefix and other.step_prefix)


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

    def own_task_axis_reasons(self) -> List[str]:
        """Why this piece itself cannot run on a task axis (empty where its
        :meth:`own_capabilities` allow it): named in the ``Batched`` formulation's
        refusal."""
        if self.own_capabilities().task_axis:
            return []
        return [f"{type(self).__name__} cannot run on a task axis (its "
                "capabilities.task_axis is False)"]

    def own_step_prefix_reasons(self) -> List[str]:
        """Why this piece itself does not allow several counts of inner steps from one
        run (empty where its :meth:`own_capabilities` say ``step_prefix``): named where
        :meth:`~metalearn.Learner.run_task` runs each count on its own."""
        if self.own_capabilities().step_prefix:
            return []
        return [f"{type(self).__name__} does not say that the first k steps of an "
                "n-step run are a k-step run (its capabilities.step_prefix is False)"]

    def own_inner_steps(self) -> Optional[int]:
        """The inner steps this piece itself runs by default (``None``: it runs none
        of its own; a gradient-descent loop gives its ``steps``)."""
        return None

    # --- what the whole says: computed over the parts ------------------------------

    def parts(self) -> List["Piece"]:
        """Every piece inside this one (recursively), found by ``tf.Module``."""
        return [m for m in self.submodules if isinstance(m, Piece)]

    @property
    def capabilities(self) -> Capabilities:
        """This piece's :meth:`own_capabilities` combined with every part's."""
        return functools.reduce(lambda a, b: a & b,
                                [p.own_capabilities() for p in [self, *self.parts()]])

    def task_axis_reasons(self) -> List[str]:
        """Why this piece or a part cannot run on a task axis (empty when
        :attr:`capabilities` allow it): :meth:`own_task_axis_reasons` of every part."""
        return [r for piece in [self, *self.parts()] for r in piece.own_task_axis_reasons()]

    def step_prefix_reasons(self) -> List[str]:
        """Why this piece or a part does not allow several counts of inner steps from
        one run (empty when :attr:`capabilities` have ``step_prefix``):
        :meth:`own_step_prefix_reasons` of every part."""
        return [r for piece in [self, *self.parts()]
                for r in piece.own_step_prefix_reasons()]

    @property
    def inner_steps(self) -> int:
        """The most inner steps this piece or any part runs by default (0 for none):
        what an outer rule or the ``Auto`` formulation asks instead of reading a
        ``steps`` attribute."""
        found = [p.own_inner_steps() for p in [self, *self.parts()]]
        return max([s for s in found if s is not None], default=0)

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
        :func:`metalearn.pieces.implicit_diff.implicit_solution`'s ``report``). The
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


class Pieces(Piece):
    """Pieces held together as one (a learner's adapter, task initialisers and head):
    what the whole needs is asked of its parts, as for any composite piece
    (:attr:`capabilities`, :attr:`gradient_metrics`, :meth:`task_paths`,
    :attr:`meta_variables`, :meth:`bind`). Iterating gives the pieces as given.

    Example::

        learner.pieces.capabilities.custom_gradient   # some part differentiates itself
        learner.pieces.gradient_metrics               # backward-pass figures by name
    """

    def __init__(self, pieces: Sequence[Piece] = ()):
        super().__init__(name="pieces")
        pieces = tuple(pieces)
        for piece in pieces:
            if not isinstance(piece, Piece):
                raise TypeError(f"Pieces holds metalearn pieces, got {piece!r}")
        self.members = pieces

    def own_capabilities(self) -> Capabilities:
        return Capabilities(step_prefix=True)  # a holder: its pieces say the rest

    def __iter__(self):
        return iter(self.members)

    def __len__(self) -> int:
        return len(self.members)

    def __add__(self, other: Sequence[Piece]) -> "Pieces":
        return Pieces([*self.members, *other])

