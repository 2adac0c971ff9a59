"""How a batch of tasks is run: the one place that chooses between a compiled loop
over tasks (``tf.map_fn``) and one copy of the work per task (unrolled). Learners and
Reptile alike go through :func:`per_task`; the ``"batched"`` formulation (every layer
run once with a task axis) is the learner's own, since it needs batched layer rules.

``"accumulate"`` differs in where the outer tape is: :func:`accumulate` computes each
task's meta-gradient inside a ``tf.while_loop`` over the tasks and sums them, so only
the activations of the tasks in flight (``parallel_iterations``) are alive at once, and
memory stays flat in the number of tasks. Because each task's tape lives inside the loop
body, custom gradients (implicit differentiation, recomputed steps) are honoured too.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Sequence, Tuple

import tensorflow as tf

from metalearn.tasks.episode import Episode

MODES = ("map_fn", "unrolled", "batched", "accumulate")


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


def gradient_metrics(learner: Any, sums: Dict[str, Any], tasks: tf.Tensor
                     ) -> Dict[str, tf.Tensor]:
    """Per-task metrics (``[tasks]`` each, every entry the mean over the tasks) from the
    gradients of the meta-loss with respect to the learner's gradient-metric handles
    (``sums``: each piece's backward pass sets its handle's gradient to its figure of
    the task, so the gradient is the sum over tasks). Handles no gradient reached (no
    backward pass used them) give no metric."""
    return {name: tf.fill([tasks], tf.cast(total, learner.metric_dtype)
                          / tf.cast(tasks, learner.metric_dtype))
            for name, total in sums.items() if total is not None}


def accumulate(learner: Any, episodes: Episode, variables: Sequence[tf.Variable]
               ) -> Tuple[List[tf.Tensor], Dict[str, tf.Tensor]]:
    """The meta-gradient of the mean query loss over ``episodes`` with respect to
    ``variables``, as the sum of every task's own meta-gradient (divided by the number of
    tasks), computed one task (or ``learner.parallel_iterations`` tasks) at a time.

    Returns:
      The gradients (one per variable, in order) and the per-task metrics (``[tasks]``
      each), as a tape around :meth:`Learner.meta_metrics` would give them.

    Raises:
      ValueError: no meta-gradient reaches some of ``variables``.
    """
    variables = list(variables)
    tasks = tf.shape(tf.nest.flatten(episodes)[0])[0]
    scale = 1.0 / tf.cast(tasks, learner.metric_dtype)
    handles = learner.gradient_metrics
    names = learner.metric_names + list(handles)
    missing: List[str] = []

    def body(i, totals, arrays):
        episode = tf.nest.map_structure(lambda t: tf.gather(t, i), episodes)
        with tf.GradientTape() as tape:
            metrics = learner.episode_metrics(episode)
            loss = metrics["loss"] * scale
        grads = tape.gradient(loss, variables + list(handles.values()))
        grads, measured = grads[:len(variables)], grads[len(variables):]
        metrics = {**metrics, **{name: tf.cast(g, learner.metric_dtype)
                                 if g is not None else tf.constant(math.nan, learner.metric_dtype)
                                 for name, g in zip(handles, measured)}}
        missing[:] = [v.path for v, g in zip(variables, grads) if g is None]
        grads = [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g)
                 for v, g in zip(variables, grads)]
        totals = [t + tf.cast(g, t.dtype) for t, g in zip(totals, grads)]
        arrays = [a.write(i, metrics[k]) for a, k in zip(arrays, names)]
        return i + 1, totals, arrays

    totals = [tf.zeros(v.shape, v.dtype) for v in variables]
    arrays = [tf.TensorArray(learner.metric_dtype, size=tasks, element_shape=[])
              for _ in names]
    _, totals, arrays = tf.while_loop(lambda i, *_: i < tasks, body,
                                      [tf.constant(0), totals, arrays],
                                      parallel_iterations=learner.parallel_iterations)
    if missing:
        raise ValueError(f"no meta-gradient reaches {missing}: the meta-loss does not "
                         "depend on them (is the graph disconnected?)")
    return totals, {k: a.stack() for k, a in zip(names, arrays)}
