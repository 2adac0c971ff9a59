"""How a batch of tasks is run: the one place that chooses between a compiled loop
over tasks (``tf.map_fn``) and one copy of the work per task (unrolled). Learners and
Reptile alike go through :func:`per_task`; the ``"batched"`` formulation (every layer
run once with a task axis) is the learner's own, since it needs batched layer rules.
"""

from __future__ import annotations

from typing import Any, Callable

import tensorflow as tf

from metalearn.tasks.episode import Episode

MODES = ("map_fn", "unrolled", "batched")


def per_task(learner: Any, one_task: Callable[[Episode], Any], episodes: Episode,
             signature: Any) -> Any:
    """``one_task`` applied to every task of ``episodes``, results stacked on a leading
    task axis.

    Unrolled when the learner asks for it (``task_batching="unrolled"``) or when any of
    its pieces computes a ``tf.custom_gradient`` (TensorFlow ignores those inside
    ``tf.map_fn``'s loop); otherwise ``tf.map_fn`` with the learner's
    ``parallel_iterations``.

    Args:
      learner: a :class:`~metalearn.Learner` (its ``task_batching``,
        ``capabilities`` and ``parallel_iterations``).
      one_task: a function of one episode (no task axis) to a nest of tensors.
      episodes: episodes with a leading task axis.
      signature: the nest of ``tf.TensorSpec`` that ``one_task`` returns.
    """
    if learner.task_batching == "unrolled" or learner.capabilities.custom_gradient:
        results = [one_task(episodes.task(i)) for i in range(episodes.num_tasks)]
        return tf.nest.map_structure(lambda *t: tf.stack(t), *results)
    return tf.map_fn(one_task, episodes, fn_output_signature=signature,
                     parallel_iterations=learner.parallel_iterations)
