"""Meta-training a learned optimizer over a horizon longer than one backpropagation:
truncated backpropagation through segments of a learner's inner loop.

:func:`rule_unroll` writes a learner whose inner update is a
:class:`~metalearn.adapters.LearnedRule` as an explicit unroll of
:mod:`metalearn.outer.persistent` (``step(state, theta, t) -> (state, loss)``): the
state is every task's adapted weights and the rule's accumulators, ``theta`` the
rule's network (in :func:`rule_theta`'s order), the loss of a step the mean query loss
over the tasks after it. :func:`train_truncated` meta-trains the rule on a task sampler
through horizons of ``horizon`` inner steps in segments of ``truncation`` steps: each
outer step backpropagates through one segment (``truncated_gradient``, the carried
state a constant) and updates the rule; every ``horizon / truncation`` outer steps a
new meta-batch starts from the initial weights. The objective is the query loss summed
over the horizon's steps, as learned optimizers are meta-trained (Metz et al. 2019),
not only the loss at the end.

The rule's other parts (a ``Mask`` in front, wrappers) are not run here: the unroll
adapts the paths the rule was built for with plain gradients of the support loss.
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import keras
import tensorflow as tf

from metalearn.adapters.learned_optimizer import LearnedRule
from metalearn.outer.persistent import UnrollStep, check_truncation, truncated_gradient


def rule_theta(rule: LearnedRule) -> List[keras.Variable]:
    """The rule's network variables in the order the unroll's ``theta`` takes them."""
    return [rule.network[k] for k in sorted(rule.network)]


def rule_unroll(learner: Any, rule: LearnedRule, episodes: Any
                ) -> Tuple[UnrollStep, Any]:
    """``(step, initial state)`` of ``learner``'s inner loop with ``rule`` on a batch of
    ``episodes`` (leading task axis), each task from ``learner.task_initial_weights``.

    Raises:
      ValueError: ``rule`` is not built (it is built with the learner holding it).
    """
    if not rule.network:
        raise ValueError("rule_unroll needs a built LearnedRule: the one inside a Learner")
    keys = sorted(rule.network)
    paths = rule.paths
    tasks = [learner.split(episodes.task(i)) for i in range(episodes.num_tasks)]
    state = []
    for support_x, support_y, _, _ in tasks:
        weights = learner.task_initial_weights(learner.initial_weights(), support_x,
                                               support_y)
        state.append((weights, rule.init({p: weights[p] for p in paths})))

    def step(state, theta, t):
        network = dict(zip(keys, theta))
        new_state, losses = [], []
        for (weights, accumulators), (sx, sy, qx, qy) in zip(state, tasks):
            with tf.GradientTape(watch_accessed_variables=False) as tape:
                tape.watch([weights[p] for p in paths])
                loss = learner.support_loss(weights, sx, sy)
            grads = tape.gradient(loss, [weights[p] for p in paths],
                                  unconnected_gradients=tf.UnconnectedGradients.ZERO)
            weights, carried = dict(weights), {}
            for p, g in zip(paths, grads):
                update, carried[p] = rule.apply_one(g, weights[p], accumulators[p], t,
                                                    network)
                weights[p] = weights[p] + update
            new_state.append((weights, carried))
            losses.append(learner.task_loss(qy, learner.predict(weights, qx)))
        return new_state, tf.add_n(losses) / len(losses)

    return step, state


def train_truncated(learner: Any, rule: LearnedRule, sampler: Any,
                    optimizer: keras.optimizers.Optimizer, meta_steps: int, horizon: int,
                    truncation: int, meta_batch_size: int, seed: int = 0
                    ) -> List[Dict[str, float]]:
    """Meta-trains ``rule`` (inside ``learner``) by truncated backpropagation: one
    segment of ``truncation`` inner steps per outer step, horizons of ``horizon`` steps
    (``truncation`` must divide it), meta-batches of ``meta_batch_size`` training tasks
    from ``sampler`` (seeded). Returns the segments' losses (``{"step", "start",
    "loss"}``, the loss summed over the segment's steps).

    Raises:
      ValueError: a truncation longer than the horizon or not dividing it (named).
    """
    truncation, horizon = check_truncation(truncation, horizon)
    theta = rule_theta(rule)
    stream = iter(sampler.dataset(int(meta_batch_size), seed=int(seed)))
    segments: Dict[int, Any] = {}

    def segment_fn(start: int):
        if start not in segments:
            @tf.function
            def run(episodes, carried):
                step, initial = rule_unroll(learner, rule, episodes)
                state = initial if carried is None else carried
                return truncated_gradient(step, state, [tf.convert_to_tensor(v)
                                                        for v in theta], start, truncation)
            segments[start] = run
        return segments[start]

    history, state, episodes = [], None, None
    for outer_step in range(int(meta_steps)):
        start = (outer_step * truncation) % horizon
        if start == 0:
            episodes, state = next(stream), None
        grads, state, loss = segment_fn(start)(episodes, state)  # None: a horizon starts
        optimizer.apply_gradients(zip(grads, theta))
        history.append({"step": outer_step + 1, "start": start, "loss": float(loss)})
    return history

