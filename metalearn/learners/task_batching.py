"""How a batch of tasks is run: the one place that chooses between a compiled loop
over tasks (``tf.map_fn``) and one copy of the work per task (unrolled). Learners and
Reptile alike go through :func:`per_task`; the ``"batched"`` formulation (every layer
run once with a task axis) is the learner's own, since it needs batched layer rules.

``"accumulate"`` differs in where the outer tape is: :func:`accumulate` computes each
task's meta-gradient inside a ``tf.while_loop`` over the tasks and sums them, so only
the activations of the tasks in flight (``parallel_iterations``) are alive at once, and
memory stays flat in the number of tasks. Because each task's tape lives inside the loop
body, custom gradients (implicit differentiation, recomputed steps) are honoured too.

``"auto"`` (the default) is resolved when the meta-step is traced, by :func:`choose`,
a pure function of the meta-batch, the inner steps, the derivative order, the device
kind and a memory budget (on a CPU always ``accumulate``), with the activations' size
estimated from the model's shapes (:func:`estimate_step_bytes`); :func:`resolve`
gathers those for a learner and a batch.
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import tensorflow as tf

from metalearn.adapters.updates import FirstOrder
from metalearn.tasks.episode import Episode

MODES = ("auto", "map_fn", "unrolled", "batched", "accumulate")

# Calibrated on benchmarks/README.md's map_fn rows (Omniglot net, 5 support and 75 query
# images per task): per task, a second-order inner step keeps about five times the
# support set's forward activations (forward, inner backward, and what the outer
# backward through it holds), a first-order one about one time; the query set's forward
# activations are kept once.
INNER_STEP_FACTOR = {True: 5.0, False: 1.0}   # by second_order
# The batched formulation holds convolutions' patches: 1.8-2.2x map_fn's step memory in
# benchmarks/README.md (B = 8 and 32, 1 and 5 inner steps).
BATCHED_FACTOR = 2.0
_UNITS = {"": 1, "b": 1, "kb": 10 ** 3, "mb": 10 ** 6, "gb": 10 ** 9, "tb": 10 ** 12,
          "kib": 2 ** 10, "mib": 2 ** 20, "gib": 2 ** 30, "tib": 2 ** 40}


def parse_memory(value: Union[int, float, str, None]) -> Optional[int]:
    """Bytes from ``value``: a number of bytes, or a string such as ``"2GiB"``,
    ``"512 MiB"``, ``"1.5GB"`` (``None`` stays ``None``).

    Raises:
      ValueError: not a positive size.
    """
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"memory_budget must be bytes or a size like '2GiB', got {value!r}")
    if isinstance(value, (int, float)):
        number, unit = float(value), ""
    else:
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(value))
        if match is None or match.group(2).lower() not in _UNITS:
            raise ValueError(f"memory_budget must be bytes or a size like '2GiB' "
                             f"(units: B, KB, MB, GB, TB, KiB, MiB, GiB, TiB), got {value!r}")
        number, unit = float(match.group(1)), match.group(2).lower()
    if not number > 0:
        raise ValueError(f"memory_budget must be > 0, got {value!r}")
    return int(number * _UNITS[unit])


def estimate_step_bytes(example_bytes: int, support: int, query: int, inner_steps: int,
                        second_order: bool) -> int:
    """Activation bytes one task keeps alive for its meta-gradient.

    ``example_bytes`` (one example's forward activations,
    :func:`metalearn.functional.memory.activation_bytes`) times the support examples,
    the inner steps and :data:`INNER_STEP_FACTOR`, plus the query examples once.
    """
    steps = max(int(inner_steps), 1)
    return int(example_bytes * (support * steps * INNER_STEP_FACTOR[bool(second_order)]
                                + query))


class Choice(NamedTuple):
    """What :func:`choose` decided, and why (``estimate``: the bytes it expects the
    chosen formulation's activations to take, ``None`` when unknown)."""
    mode: str
    reason: str
    estimate: Optional[int]


def choose(tasks: int, inner_steps: int, second_order: bool, device: str,
           memory_budget: Optional[int], task_bytes: Optional[int],
           batched_available: bool = False, parallel_iterations: int = 2) -> Choice:
    """The formulation ``task_batching="auto"`` runs (a pure function).

    The rule (measurements in benchmarks/README.md):

    1. On a CPU, ``accumulate`` whatever the budget: only ``parallel_iterations`` tasks'
       activations alive at once, so the leanest formulation (peak memory flat in the
       meta-batch), and on the Omniglot step measured on idle cores faster than or level
       with ``map_fn`` at every meta-batch from 4 to 32, at 1 and 5 inner steps, first
       and second order.
    2. On a GPU, the whole-batch formulation that is fastest there if its activations
       (``tasks x task_bytes``, twice that for ``batched``'s patches) fit in
       ``memory_budget``: ``batched`` where the learner allows it (one kernel per layer
       for all tasks instead of one per task; not measured yet), else ``map_fn``; with
       no budget or no estimate, that one without the memory check.
    3. Otherwise ``accumulate``.

    Args:
      tasks: the meta-batch (tasks on this replica).
      inner_steps: the adapter's inner steps (0 for no inner loop).
      second_order: whether the meta-gradient goes through the inner gradients.
      device: ``"cpu"`` or ``"gpu"`` (anything else is treated as a GPU).
      memory_budget: bytes the step's activations may take, or ``None``.
      task_bytes: :func:`estimate_step_bytes` for one task, or ``None``.
      batched_available: whether ``task_batching="batched"`` works for the learner.
      parallel_iterations: tasks in flight with ``accumulate``.
    """
    alive = min(tasks, max(int(parallel_iterations), 1)) * task_bytes \
        if task_bytes is not None else None
    if device == "cpu":
        return Choice("accumulate", "on a cpu: the leanest, and the fastest or level "
                                    "(benchmarks/README.md)", alive)
    fast = "batched" if batched_available else "map_fn"
    factor = BATCHED_FACTOR if fast == "batched" else 1.0
    if task_bytes is None or memory_budget is None:
        what = "no memory budget" if memory_budget is None else "no activation estimate"
        return Choice(fast, f"{what}: the fastest on {device}", None)
    whole = int(tasks * task_bytes * factor)
    if whole <= memory_budget:
        return Choice(fast, f"{tasks} tasks x {task_bytes} B = {whole} B fit in "
                            f"{memory_budget} B: the fastest on {device}", whole)
    if fast == "batched" and tasks * task_bytes <= memory_budget:
        return Choice("map_fn", f"batched's {whole} B exceed {memory_budget} B, "
                                f"map_fn's {tasks * task_bytes} B fit", tasks * task_bytes)
    return Choice("accumulate", f"{tasks} tasks x {task_bytes} B = {whole} B exceed "
                                f"{memory_budget} B: accumulate keeps {alive} B", alive)


def _inner_steps(learner: Any, steps: Optional[int]) -> int:
    if steps is not None:
        return int(steps)
    found = [getattr(p, "steps", None) for p in [learner.adapter, *learner.adapter.parts()]]
    return max([s for s in found if isinstance(s, int)], default=0)


def _second_order(learner: Any) -> bool:
    pieces = [p for piece in learner.pieces for p in [piece, *piece.parts()]]
    return not any(isinstance(p, FirstOrder) for p in pieces)


def _examples(x: Any) -> Tuple[Optional[int], Optional[Sequence[int]]]:
    """Examples per task and one example's shape, from a batch with a task axis."""
    first = tf.nest.flatten(x)[0]
    shape = list(first.shape)
    return (shape[1] if len(shape) > 1 else None), shape[2:]


def resolve(learner: Any, episodes: Episode, steps: Optional[int] = None) -> Choice:
    """:func:`choose` for ``learner`` on ``episodes`` (leading task axis): the model's
    activations from its shapes, the batch's sizes from the episodes' static shapes."""
    support_x, query_x = episodes.support_x, episodes.query_x
    tasks = tf.nest.flatten(episodes)[0].shape[0]
    support, example = _examples(support_x)
    query, _ = _examples(query_x)
    device = "gpu" if tf.config.list_logical_devices("GPU") else "cpu"
    budget = learner.memory_budget
    per_example = learner.activation_bytes(example)
    task_bytes = None
    if None not in (per_example, support, query, tasks):
        task_bytes = estimate_step_bytes(per_example, support, query,
                                         _inner_steps(learner, steps), _second_order(learner))
    return choose(tasks if tasks is not None else 1, _inner_steps(learner, steps),
                  _second_order(learner), device, budget, task_bytes,
                  learner.batched_available, learner.parallel_iterations)


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
    metrics = {k: a.stack() for k, a in zip(names, arrays)}
    # The one-tape formulations see only the sum of a figure over the tasks: report the
    # same here (each entry the mean), so every formulation gives the same metrics.
    metrics.update({name: tf.fill([tasks], tf.reduce_mean(metrics[name])) for name in handles})
    return totals, metrics
