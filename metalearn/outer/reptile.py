"""Reptile (Nichol et al., 2018): batched and serial, as two outer rules."""

from __future__ import annotations

from typing import Optional

import gin
import keras
import tensorflow as tf

from metalearn import configurables
from metalearn.learners.learner import Learner
from metalearn.outer.rule import OptimizerRule
from metalearn.pieces import COUNT, check_range


@gin.configurable
@configurables.moved_keywords({
    "clipnorm": "a guard: ClipDirections(Reptile(optimizer), max_norm) (metalearn.outer)"})
class Reptile(OptimizerRule):
    """Reptile (Nichol et al., 2018): move the initial weights towards the adapted ones.

    No outer gradient is taken: for each task the learner's adapter runs ``inner_steps``
    steps from the initial weights ``theta`` to ``phi_i``, and the outer optimizer is
    given ``theta - phi_i`` as the direction, so plain SGD with learning rate
    ``epsilon`` gives Reptile's update, once per meta-batch with the mean over its tasks:
    ``theta <- theta + epsilon * (mean_i phi_i - theta)``. :class:`SerialReptile` updates
    after every task instead. The tasks run as the formulation runs them
    (:meth:`~metalearn.execution.Formulation.adapted`).

    Reported metrics are each task's figures of its run
    (:meth:`~metalearn.Learner.run_task`, the learner's objective), before the update.

    Args:
      optimizer: the outer Keras optimizer; defaults to ``SGD(learning_rate=1.0)``
        (epsilon = 1; anneal it with a schedule, as the paper does).
      inner_steps: inner steps per task; defaults to the adapter's ``steps``.
      serial: must be ``False``; serial Reptile is :class:`SerialReptile` (metalearn
        0.2), and ``True`` says so instead of running another algorithm.
    """

    def __init__(self, optimizer: Optional[keras.optimizers.Optimizer] = None,
                 inner_steps: Optional[int] = None, serial: bool = False):
        if serial and not isinstance(self, SerialReptile):
            raise TypeError("Reptile(serial=True) is its own outer rule since metalearn "
                            "0.2: use SerialReptile(...) (gin: @SerialReptile())")
        super().__init__(optimizer)
        self.inner_steps = None if inner_steps is None else \
            check_range(type(self).__name__, "inner_steps", inner_steps, COUNT)

    @classmethod
    def configured_class(cls) -> type:
        return Reptile

    @staticmethod
    def default() -> keras.optimizers.Optimizer:
        return keras.optimizers.SGD(learning_rate=1.0)

    @staticmethod
    def check(learner: Learner) -> None:
        """Raises ``ValueError`` if the learner has meta-variables Reptile cannot move:
        pieces' meta-learned state or generated weights (task_init weights restart every
        task: nothing to move, nothing to train)."""
        learned = [v.path for piece in learner.pieces for v in piece.meta_variables]
        generated = list(learner.adapter.task_paths(learner.initial_weights()))
        if learned or generated:
            raise ValueError(
                "Reptile moves the model's initial weights only; the learner's pieces "
                f"have meta-learned state {learned} or generate weights {generated} "
                "that it cannot train")

    def directions(self, learner, episodes, formulation):
        """Reptile's direction ``theta - mean_i phi_i`` (not a gradient of any loss),
        one entry per :attr:`Learner.meta_variables`, and per-task metrics."""
        self.check(learner)
        adapted, metrics = formulation.adapted(learner, episodes, steps=self.inner_steps,
                                               weights=learner.initial_weights())
        directions = [tf.convert_to_tensor(v) - tf.reduce_mean(adapted[v.path], axis=0)
                      for v in learner.meta_variables]
        return directions, metrics


@gin.configurable
class SerialReptile(Reptile):
    """Reptile with an update after every task: the tasks of a meta-batch one after
    another, each adapted from the weights the previous task's update left,
    ``theta <- theta + epsilon * (phi_i - theta)``.

    Guarded (:class:`~metalearn.outer.guards.SkipNonFinite`), each task's update is
    applied only if it and every earlier task's are finite, so the tasks of the batch
    before the first non-finite one keep their updates. Cannot run under several
    replicas (each update depends on the previous task's). Arguments as for
    :class:`Reptile`.
    """

    interleaves_updates = True

    def __init__(self, optimizer: Optional[keras.optimizers.Optimizer] = None,
                 inner_steps: Optional[int] = None):
        super().__init__(optimizer, inner_steps=inner_steps, serial=True)

    def step(self, learner, episodes, formulation, apply=None, jit_compile=False):
        """Directions and ``apply`` once per task, in turn; the figures a guard adds
        to one update are handed to the next (they add up over the step)."""
        if tf.distribute.get_replica_context() is not None and \
                tf.distribute.get_replica_context().num_replicas_in_sync > 1:
            raise ValueError("serial Reptile updates after each task in turn, which "
                             f"{tf.distribute.get_replica_context().num_replicas_in_sync}"
                             " replicas cannot share; use Reptile (batched) under a "
                             "distribution strategy")
        apply = apply or self.apply
        directions_of = self.compiled_directions(jit_compile)
        per_task, carried = [], {}
        for i in range(episodes.num_tasks):
            one = tf.nest.map_structure(lambda t: t[i:i + 1], episodes)  # [1, ...]
            directions, metrics = directions_of(learner, one, formulation)
            given = set(metrics)
            result = apply(learner, directions, {**metrics, **carried})
            carried = {k: v for k, v in result.items() if k not in given}
            per_task.append({k: result[k] for k in given})
        return {**{k: tf.concat([m[k] for m in per_task], axis=0) for k in per_task[0]},
                **carried}
