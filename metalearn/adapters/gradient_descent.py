"""Functional gradient descent in the inner loop: the loop only.

What each step does with the gradients is an update transform
(:mod:`metalearn.adapters.updates`: plain steps, first order, learned rates, masks,
order annealing, chains of them); how the steps run is a list of wrappers
(:mod:`metalearn.adapters.wrappers`: per-step weights, recomputation, mini-batches, the
steps in a ``tf.while_loop``).
The loop asks them which weights to adapt, what they need and what they learn.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple, Union

import gin
import keras
import tensorflow as tf

from metalearn import configurables
from metalearn.adapters.base import Adapter
from metalearn.adapters.updates import (Chain, FirstOrder, GradientStep, StepInfo,
                                        Update, update_or_rate)
from metalearn.adapters.wrappers import StepWrapper
from metalearn.functional import Weights
from metalearn.pieces import STEPS, Capabilities, LossFn, check_range

MOVED = {
    "adapt": "update=[Mask(patterns), GradientStep(learning_rate)]",
    "first_order_steps": "update=[AnnealOrder(first_order_steps), GradientStep(learning_rate)]",
    "per_step": "wrappers=[PerStepWeights(patterns)]",
    "recompute": "wrappers=[Recompute()]",
    "batch_size": "wrappers=[MiniBatches(batch_size)]",
}
"""Options of metalearn 0.1 that became pieces, with the piece that replaced each."""

MOVED_MESSAGE = ("{owner}({name}=...) is a piece since metalearn 0.2: use {owner}({new}) "
                 "(metalearn.adapters; CHANGELOG.md, 'Migration')")


@gin.configurable
@configurables.moved_keywords(MOVED, MOVED_MESSAGE)
class GradientDescent(Adapter):
    """``steps`` gradient steps on the support loss, differentiable end to end.

    Second order (the default) backpropagates through every inner step, Hessian terms
    included; ``first_order=True`` treats each inner gradient as a constant (FOMAML).

    The one-line front door is ``GradientDescent(steps, learning_rate, first_order)``.
    Everything else is a piece::

        GradientDescent(2, update=[Mask(("head",)), GradientStep(0.1)])             # ANIL
        GradientDescent(5, update=[AnnealOrder(1000), LearnedRates("layer_step", 0.1)],
                        wrappers=[PerStepWeights(("bn",))])                # MAML++
        GradientDescent(5, 0.1, wrappers=[Recompute(), MiniBatches(10)])
        GradientDescent(20, 0.1, wrappers=[WhileLoop()])     # graph flat in the steps

    Args:
      steps: inner steps during meta-training (a whole number ``>= 0``).
      learning_rate: the inner step size of the default update, ``GradientStep(learning_rate)``
        (``> 0``; 0.01 when not given). Give either this or ``update``.
      first_order: drop second-order terms from the meta-gradient: a
        :class:`~metalearn.adapters.updates.FirstOrder` put before the update.
      update: an update transform, or a list of them (chained), from the incoming
        gradients to the weight updates; also says which weights are adapted.
      wrappers: step wrappers (:mod:`metalearn.adapters.wrappers`), each wrapping the
        step built so far.
    """

    def __init__(self, steps: int = 1, learning_rate: Optional[float] = None,
                 first_order: bool = False,
                 update: Union[Update, Sequence[Update], None] = None,
                 wrappers: Sequence[StepWrapper] = (), name: Optional[str] = None):
        super().__init__(name=name)
        steps = check_range("GradientDescent", "steps", steps, STEPS)
        update = update_or_rate("GradientDescent", learning_rate, update)
        if first_order:
            update = Chain(FirstOrder(), update)
        for wrapper in wrappers:
            if not isinstance(wrapper, StepWrapper):
                raise TypeError(f"wrappers must be metalearn.adapters.wrappers.StepWrapper "
                                f"pieces, got {wrapper!r}")
        loops = [w for w in wrappers if w.runs_steps]
        if len(loops) > 1:
            raise ValueError(f"at most one wrapper may run the inner steps, got "
                             f"{[type(w).__name__ for w in loops]}")
        custom = [type(p).__name__ for p in [update, *wrappers]
                  if p.capabilities.custom_gradient]
        if loops and custom:
            raise ValueError(
                f"{type(loops[0]).__name__} cannot run steps that hold a tf.custom_gradient "
                f"({', '.join(custom)}): TensorFlow 2.21's while-loop gradient fails on a "
                f"custom gradient that reads variables; drop {type(loops[0]).__name__} or "
                f"{', '.join(custom)}")
        self.steps = int(steps)
        self.first_order = bool(first_order)
        self.update = update
        self.wrappers = list(wrappers)

    @property
    def learning_rate(self) -> Optional[float]:
        """The rate of a plain ``GradientStep`` update (``None`` for any other update)."""
        plain = [p for p in [self.update, *self.update.parts()] if isinstance(p, GradientStep)]
        return plain[0].learning_rate if len(plain) == 1 else None

    def own_capabilities(self) -> Capabilities:
        # elementwise steps, numbered from 0 whatever their count; the parts say the rest
        return Capabilities(step_prefix=True)

    def own_inner_steps(self) -> int:
        return self.steps

    # --- which weights ----------------------------------------------------------

    def adapted_paths(self, weights: Weights) -> List[str]:
        """Paths of the weights the inner loop changes: what the update selects, minus
        what any part sets per task (per-step copies)."""
        fixed = set(self.task_paths(weights))
        return self.update.select([p for p in weights if p not in fixed])

    # --- meta-learned state -----------------------------------------------------

    def build(self, model: keras.Model, weights: Weights) -> None:
        for wrapper in self.wrappers:
            wrapper.build(weights, self.steps)
        paths = self.adapted_paths(weights)
        self.update.build({p: weights[p] for p in paths}, self.steps)
        super().build(model, weights)

    # --- the inner loop ---------------------------------------------------------

    def adapt_trajectory(self, weights: Weights, support_x: Any, support_y: Any,
                         loss_fn: LossFn, steps: Optional[int] = None) -> List[Weights]:
        return self._run(weights, support_x, support_y, loss_fn, steps, keep_all=True)

    def adapt(self, weights: Weights, support_x: Any, support_y: Any, loss_fn: LossFn,
              steps: Optional[int] = None) -> Weights:
        return self._run(weights, support_x, support_y, loss_fn, steps, keep_all=False)[-1]

    def begin(self, weights: Weights) -> Tuple[Weights, Any]:
        """Where the loop starts: ``weights`` as every wrapper starts them
        (:meth:`~metalearn.adapters.wrappers.StepWrapper.start`) and the update's state
        before inner step 0 (what :meth:`run_steps` continues from)."""
        paths = self.adapted_paths(weights)
        weights = dict(weights)
        for wrapper in self.wrappers:
            weights = wrapper.start(weights)
        return weights, self.update.init({p: weights[p] for p in paths})

    def resume(self, weights: Weights, step: Any) -> Weights:
        """``weights`` as every wrapper continues them before inner step ``step``
        (:meth:`~metalearn.adapters.wrappers.StepWrapper.resume`; ``PerStepWeights``:
        copy ``step``): a carried trajectory's adapted weights made whole again for a
        segment numbered from ``step``."""
        weights = dict(weights)
        for wrapper in self.wrappers:
            weights = wrapper.resume(weights, step)
        return weights

    def run_steps(self, weights: Weights, state: Any, support_x: Any, support_y: Any,
                  loss_fn: LossFn, start: Any, steps: int, trajectory: bool = False
                  ) -> Tuple[Union[Weights, List[Weights]], Any]:
        """``steps`` inner steps from ``weights`` and the update's ``state`` (as
        :meth:`begin` gives them, as an earlier call left them, or carried and made
        whole by :meth:`resume`), numbered ``start,
        start + 1, ...`` (``start`` an int or a scalar int32 tensor): the weights and
        the state after them. A segment of the loop, for an outer rule that carries
        the inner trajectory across outer steps (:mod:`metalearn.outer.truncated`);
        ``begin`` then ``run_steps(..., 0, self.steps)`` is :meth:`adapt`.

        With ``trajectory=True`` the first result is the list of weights before the
        segment and after each of its steps (as :meth:`adapt_trajectory`'s), for a
        learner whose objective weighs every step; not with a wrapper that runs the
        steps in one loop (``WhileLoop``), which keeps only the last.
        """
        steps = check_range("GradientDescent", "steps", steps, STEPS)
        if trajectory:
            loops = [type(w).__name__ for w in self.wrappers if w.runs_steps]
            if loops:
                raise ValueError(f"GradientDescent.run_steps(trajectory=True) keeps every "
                                 f"step's weights, which {loops[0]} (the steps in one loop) "
                                 "does not: drop it for a learner that records its "
                                 "trajectory (MAML++'s multi-step loss)")
        return self._steps(weights, state, support_x, support_y, loss_fn, start, steps,
                           keep_all=trajectory, with_state=True)

    def _run(self, weights: Weights, support_x: Any, support_y: Any, loss_fn: LossFn,
             steps: Optional[int], keep_all: bool) -> List[Weights]:
        """The weights before the first step and after each (after the last only, beside
        the first, when not ``keep_all`` and a wrapper runs the steps)."""
        steps = self.steps if steps is None else \
            check_range("GradientDescent", "steps", steps, STEPS)
        weights, state = self.begin(weights)
        return self._steps(weights, state, support_x, support_y, loss_fn, 0, steps,
                           keep_all, with_state=False)

    def _steps(self, weights: Weights, state: Any, support_x: Any, support_y: Any,
               loss_fn: LossFn, start: Any, steps: int, keep_all: bool, with_state: bool):
        """The trajectory (or, ``with_state``, the final weights and state) of ``steps``
        steps numbered from ``start``."""
        paths = self.adapted_paths(weights)

        def step_fn(weights, state, step, x, y):
            with tf.GradientTape(watch_accessed_variables=False) as tape:
                tape.watch([weights[p] for p in paths])
                loss = loss_fn(weights, x, y)
            grads = tape.gradient(loss, [weights[p] for p in paths],
                                  unconnected_gradients=tf.UnconnectedGradients.ZERO)
            updates, state = self.update.update(
                dict(zip(paths, grads)), state, {p: weights[p] for p in paths},
                StepInfo(step, self.steps))
            weights = dict(weights)
            for p in paths:
                weights[p] = weights[p] + updates[p]
            return weights, state

        for wrapper in self.wrappers:
            step_fn = wrapper.wrap(step_fn)

        def one_step(weights, state, step):
            step = step + start if not (isinstance(start, int) and start == 0) else step
            x, y = support_x, support_y
            for wrapper in self.wrappers:
                x, y = wrapper.batch(x, y, step)
            return step_fn(weights, state, step, x, y)

        for wrapper in self.wrappers:
            if wrapper.runs_steps:
                if not with_state:
                    return wrapper.iterate(one_step, weights, state, steps, keep_all)
                # the update's state rides in the loop's weights, under keys no path has
                leaves = tf.nest.flatten(state)
                keys = [f"\x00state/{i}" for i in range(len(leaves))]

                def packed_step(packed, _, step):
                    inner = tf.nest.pack_sequence_as(state, [packed[k] for k in keys])
                    after, inner = one_step({p: packed[p] for p in weights}, inner, step)
                    return {**after, **dict(zip(keys, tf.nest.flatten(inner)))}, ()

                final = wrapper.iterate(packed_step, {**weights, **dict(zip(keys, leaves))},
                                        (), steps, keep_all=False)[-1]
                return ({p: final[p] for p in weights},
                        tf.nest.pack_sequence_as(state, [final[k] for k in keys]))
        trajectory = [weights]
        for step in range(steps):
            weights, state = one_step(weights, state, step)
            trajectory.append(weights)
        if with_state:
            return (trajectory if keep_all else weights), state
        return trajectory
