"""Inner-loop updates as small differentiable transforms with explicit state.

As in optax, an update is a pair of pure functions over the adapted weights::

    state = update.init(weights)                               # before inner step 0
    updates, state = update.update(grads, state, weights, info)  # each inner step
    weights = weights + updates

with ``grads``, ``weights`` and ``updates`` dicts by path and ``state`` any nest of
tensors (momentum, Adam's moments) that the loop carries from step to step. Every
operation is a TensorFlow op, so the meta-gradient flows through the updates and the
state to every order (nothing is a constant unless a transform says so, as
:class:`FirstOrder` does). :class:`Chain` composes transforms left to right.

A transform may also

* restrict which weights the loop adapts (:meth:`Update.select`; :class:`Mask` is ANIL),
* own meta-learned variables created in :meth:`Update.build` (:class:`LearnedRates`:
  Meta-SGD and MAML++'s LSLR),
* read the learner's outer-step counter (:class:`AnnealOrder`, MAML++'s
  derivative-order annealing), through ``self.meta_step``.

Today's options, as pieces: ``GradientDescent(steps, learning_rate, first_order)`` is
``GradientDescent(steps, update=[FirstOrder(), GradientStep(learning_rate)])``; ANIL is
``update=[Mask(("head",)), GradientStep(lr)]``; Meta-SGD ``update=LearnedRates("element")``.
"""

from __future__ import annotations

from typing import Any, List, NamedTuple, Optional, Sequence, Tuple, Union

import gin
import tensorflow as tf

from metalearn.adapters.hyperparameters import HyperparameterSet, Learned, Value
from metalearn.functional import Weights
from metalearn.pieces import (POSITIVE, STEPS, Capabilities, Piece, Range, check_patterns,
                              check_range, select_paths)

State = Any
"""A transform's state between inner steps: any nest of tensors (``()`` for none)."""


class StepInfo(NamedTuple):
    """Where the loop is, for transforms that depend on it.

    Attributes:
      step: the inner step, from 0: a Python int where the inner loop is unrolled (the
        default), a scalar int32 tensor where its steps run in a ``tf.while_loop``
        (:class:`~metalearn.adapters.wrappers.WhileLoop`); index with
        :func:`~metalearn.pieces.clamp_step` to take both.
      steps: the number of inner steps the transform was built for.
    """

    step: Any
    steps: int


class Update(Piece):
    """A differentiable transform of inner-loop gradients into weight updates.

    Subclass it and implement :meth:`update` (and :meth:`init` if the transform keeps
    state between inner steps, :meth:`build` if it meta-learns variables). Updates are
    added to the weights. Elementwise transforms work on a task axis (the default
    capability); say ``Capabilities(task_axis=False)`` in :meth:`own_capabilities`
    otherwise.
    """

    _suffixes = {"learning_rate": "lr"}  # variable-name suffixes of learned ones

    def __init__(self, name: Optional[str] = None):
        super().__init__(name=name)
        self.hyperparameters = HyperparameterSet()

    def hyperparameter(self, name: str, value: Value, allowed: Range) -> Value:
        """Declares hyperparameter ``name``: a number in ``allowed``, or :class:`Learned`
        with its initial value in it (then :meth:`build` creates its variables); out of
        range, a :class:`~metalearn.pieces.HyperparameterRangeError` names this piece's
        class, the hyperparameter, the value and the range. Returns the checked value."""
        return self.hyperparameters.declare(type(self).__name__, name, value, allowed)

    def hp(self, name: str, path: str, info: "StepInfo", dtype: tf.DType) -> tf.Tensor:
        """The value of hyperparameter ``name`` for weight ``path`` at this inner step."""
        return self.hyperparameters.value(name, path, info.step, dtype)

    def own_meta_variables(self):
        return self.hyperparameters.meta_variables

    def select(self, paths: Sequence[str]) -> List[str]:
        """Which of ``paths`` the loop adapts (default: all of them)."""
        return list(paths)

    def build(self, weights: Weights, steps: int) -> None:
        """Creates meta-learned state for the adapted ``weights`` (one task's shapes) and
        a loop of ``steps`` inner steps (the learned hyperparameters' variables). Called
        once, by the loop's build; an override calls ``super().build``."""
        self.hyperparameters.build(weights, steps, self._suffixes)

    def init(self, weights: Weights) -> State:
        """The state before the first inner step (default: none)."""
        return ()

    def update(self, grads: Weights, state: State, weights: Weights, info: StepInfo
               ) -> Tuple[Weights, State]:
        """``(updates, new state)``: ``updates`` by path, added to ``weights``."""
        raise NotImplementedError


def as_update(update: Union["Update", Sequence["Update"], None]) -> Optional["Update"]:
    """A transform from a transform, a list of them (chained) or ``None``."""
    if update is None or isinstance(update, Update):
        return update
    if isinstance(update, (list, tuple)):
        return Chain(*update)
    raise TypeError(f"an inner update must be a metalearn.adapters.updates.Update or a "
                    f"list of them, got {update!r}")


def update_or_rate(owner: str, learning_rate: Optional[float],
                   update: Union["Update", Sequence["Update"], None]) -> "Update":
    """An inner loop's update from its arguments: ``update`` (a transform or a list of
    them, chained) or a plain ``GradientStep(learning_rate)`` (0.01 when neither is
    given); ``owner`` (the loop's name) is named in the error when both are."""
    update = as_update(update)
    if learning_rate is not None:
        learning_rate = check_range(owner, "learning_rate", learning_rate, POSITIVE)
    if update is not None and learning_rate is not None:
        raise ValueError(f"give {owner} either learning_rate ({learning_rate}) or update "
                         f"({update.name}), not both: put the rate in the update, e.g. "
                         "update=[..., GradientStep(rate)]")
    if update is None:  # name given: a base file's gin binding of GradientStep is not ours
        update = GradientStep(0.01 if learning_rate is None else learning_rate, name=None)
    return update


@gin.configurable
class Chain(Update):
    """Transforms applied left to right: each sees the previous one's updates as its
    gradients. Selections compose (each restricts the paths the previous allowed), and
    so do builds, states and capabilities."""

    def __init__(self, *transforms: Update, name: Optional[str] = None):
        super().__init__(name=name)
        for t in transforms:
            if not isinstance(t, Update):
                raise TypeError(f"Chain takes Update transforms, got {t!r}")
        self.transforms = list(transforms)

    def own_capabilities(self) -> Capabilities:
        return Capabilities(step_prefix=True)  # a chain: its transforms say the rest

    def select(self, paths: Sequence[str]) -> List[str]:
        for t in self.transforms:
            paths = t.select(paths)
        return list(paths)

    def build(self, weights: Weights, steps: int) -> None:
        for t in self.transforms:
            t.build(weights, steps)

    def init(self, weights: Weights) -> State:
        return tuple(t.init(weights) for t in self.transforms)

    def update(self, grads, state, weights, info):
        states = []
        for t, s in zip(self.transforms, state):
            grads, s = t.update(grads, s, weights, info)
            states.append(s)
        return grads, tuple(states)


@gin.configurable
class GradientStep(Update):
    """Plain gradient steps: ``updates = -learning_rate * grads``; the rate (``> 0``) may
    be :class:`Learned` (per element: Meta-SGD; per layer and step: LSLR)."""

    def __init__(self, learning_rate: Value = 0.01, name: Optional[str] = None):
        super().__init__(name=name)
        self.learning_rate = self.hyperparameter("learning_rate", learning_rate, POSITIVE)

    def own_capabilities(self) -> Capabilities:
        return Capabilities(step_prefix=True)  # a rate per step index at most

    def update(self, grads, state, weights, info):
        return {p: -self.hp("learning_rate", p, info, g.dtype) * g
                for p, g in grads.items()}, state


@gin.configurable
class FirstOrder(Update):
    """First-order MAML: the incoming gradients are constants for the meta-gradient
    (same values; the second-order terms through them are dropped)."""

    def own_capabilities(self) -> Capabilities:
        return Capabilities(first_order=True, step_prefix=True)

    def update(self, grads, state, weights, info):
        return {p: tf.stop_gradient(g) for p, g in grads.items()}, state


@gin.configurable
class AnnealOrder(Update):
    """MAML++'s derivative-order annealing: first order while the learner's
    :attr:`meta_step` is below ``first_order_steps``, second order from then on
    (a ``tf.where``-style blend on the counter, so nothing retraces).
    ``first_order_steps``: a whole number ``>= 0``."""

    def __init__(self, first_order_steps: int = gin.REQUIRED, name: Optional[str] = None):
        super().__init__(name=name)
        if first_order_steps is gin.REQUIRED:
            raise ValueError("AnnealOrder needs first_order_steps (a whole number >= 0)")
        self.first_order_steps = check_range("AnnealOrder", "first_order_steps",
                                             first_order_steps, STEPS)

    def own_capabilities(self) -> Capabilities:
        return Capabilities(step_prefix=True)  # reads the outer step, not the inner count

    def update(self, grads, state, weights, info):
        if self.first_order_steps == 0:
            return grads, state
        if self.meta_step is None:
            raise RuntimeError("AnnealOrder needs the learner's meta-step counter: use the "
                               "adapter inside a metalearn.Learner (or call bind())")
        out = {}
        for p, g in grads.items():
            second = tf.cast(self.meta_step >= self.first_order_steps, g.dtype)
            constant = tf.stop_gradient(g)  # same value; derivative scaled by 0 or 1
            out[p] = constant + second * (g - constant)
        return out, state


@gin.configurable
class Mask(Update):
    """Adapt only the weights whose path a regular expression matches (``re.search``),
    e.g. ``Mask(("head",))`` for ANIL; the others keep their initial values in the inner
    loop (and no inner gradient is computed for them). ``invert=True`` adapts every
    weight *but* the matching ones: ``Mask(("head",), invert=True)`` is BOIL (Oh et al.,
    2021), the body adapted and the head frozen in the inner loop."""

    def __init__(self, patterns: Sequence[str] = gin.REQUIRED, invert: bool = False,
                 name: Optional[str] = None):
        super().__init__(name=name)
        self.patterns = check_patterns(patterns, "Mask")
        self.invert = bool(invert)

    def own_capabilities(self) -> Capabilities:
        return Capabilities(step_prefix=True)

    def select(self, paths):
        matched = select_paths(paths, self.patterns, "Mask")
        if not self.invert:
            return matched
        kept = [p for p in paths if p not in set(matched)]
        if not kept:
            raise ValueError(f"Mask(invert=True) of {self.patterns!r} leaves no weight to "
                             f"adapt among {list(paths)}")
        return kept

    def update(self, grads, state, weights, info):
        return grads, state


@gin.configurable
class ClipByGlobalNorm(Update):
    """Updates (or gradients, placed first in a chain) clipped to a global norm over all
    adapted weights of one task (``max_norm > 0``). Mixes values across weights, so no
    task axis."""

    def __init__(self, max_norm: float = gin.REQUIRED, name: Optional[str] = None):
        super().__init__(name=name)
        if max_norm is gin.REQUIRED:
            raise ValueError("ClipByGlobalNorm needs max_norm (> 0)")
        self.max_norm = check_range("ClipByGlobalNorm", "max_norm", max_norm, POSITIVE)

    def own_capabilities(self) -> Capabilities:
        return Capabilities(task_axis=False, step_prefix=True)

    def update(self, grads, state, weights, info):
        paths = list(grads)
        clipped, _ = tf.clip_by_global_norm([grads[p] for p in paths], self.max_norm)
        return dict(zip(paths, clipped)), state


@gin.configurable
class Proximal(Update):
    """The gradient of a proximal term ``regularization / 2 * ||w - w_0||^2`` added to the
    incoming gradients, ``w_0`` the weights the inner loop started from:
    ``updates = grads + regularization * (w - w_0)``.

    Put it first in a chain (``[Proximal(lam), GradientStep(lr)]``): the loop then
    descends the proximally regularised support loss, iMAML's inner problem
    (:class:`~metalearn.adapters.ImplicitGradientDescent` builds its inner solve so).
    State: ``w_0``, the weights :meth:`init` saw (differentiable, as every state is).
    Elementwise: works on a task axis. ``regularization``: ``> 0``.
    """

    def __init__(self, regularization: float = gin.REQUIRED, name: Optional[str] = None):
        super().__init__(name=name)
        if regularization is gin.REQUIRED:
            raise ValueError("Proximal needs regularization (lambda, > 0)")
        self.regularization = check_range("Proximal", "regularization", regularization,
                                          POSITIVE)

    def own_capabilities(self) -> Capabilities:
        return Capabilities(step_prefix=True)  # w_0: where the loop started

    def init(self, weights):
        return dict(weights)

    def update(self, grads, state, weights, info):
        lam = self.regularization
        return {p: g + lam * (weights[p] - state[p]) for p, g in grads.items()}, state


RATES = ("element", "layer_step")


@gin.configurable
class LearnedRates(GradientStep):
    """Meta-learned inner learning rates: ``GradientStep(Learned(initial, per, ...))``.

    Args:
      per: ``"element"``, a rate for every element of every adapted weight (Meta-SGD,
        Li et al. 2017), or ``"layer_step"``, a scalar rate for every adapted weight
        tensor and inner step (MAML++'s LSLR, Antoniou et al. 2019; with more inner steps
        at test time than it was built for, the last step's rates are reused).
      initial: the rates' initial value (``> 0``).
      max_learning_rate: if set (``> 0``), the rates are kept in
        ``[-max_learning_rate, max_learning_rate]`` (:class:`Learned`'s ``low`` and
        ``high``: projected back after each outer update, clipped where used): a
        safeguard for regression losses whose inner loop diverges above a small rate.
      min_learning_rate: if set (at most ``initial``), the lower bound instead of
        ``-max_learning_rate`` (``0.0`` keeps rates from turning the inner loop into
        gradient ascent).
    """

    def __init__(self, per: str = "element", initial: float = 0.01,
                 max_learning_rate: Optional[float] = None,
                 min_learning_rate: Optional[float] = None, name: Optional[str] = None):
        if per not in RATES:
            raise ValueError(f"LearnedRates per must be one of {RATES}, got {per!r}")
        high = None if max_learning_rate is None else \
            check_range("LearnedRates", "max_learning_rate", max_learning_rate, POSITIVE)
        initial = check_range("LearnedRates", "initial", initial,
                              Range(0, high, low_open=True))  # > 0 (and <= the maximum)
        low = None if min_learning_rate is None else check_range(
            "LearnedRates", "min_learning_rate", min_learning_rate,
            Range(high=initial))  # at most the initial value, which is below the maximum
        if low is None and high is not None:
            low = -high
        super().__init__(Learned(initial, per, low=low, high=high), name=name)
        self.per = per
        self.initial = float(initial)
        self.max_learning_rate = high
        self.min_learning_rate = None if min_learning_rate is None else float(min_learning_rate)

    @property
    def learning_rates(self):
        """The learned rates by weight path (variables)."""
        return self.hyperparameters.by_path("learning_rate")

    def rate(self, path: str, dtype: tf.DType, step: int) -> tf.Tensor:
        """The (clipped) rate of ``path`` at inner step ``step``."""
        return self.hyperparameters.value("learning_rate", path, step, dtype)
