"""Auto's choice and its memory model: which formulation runs a meta-batch, a pure
function of the meta-batch, the inner steps and order, the device and the memory budget
(:func:`choose`), and :class:`Auto`, the formulation that asks it when the step is
traced."""

from __future__ import annotations

import weakref
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import gin
import tensorflow as tf

from metalearn.execution.formulations import (Accumulate, Batched, Formulation, MapFn,
                                              Unrolled, check_parallel)
from metalearn.functional import memory
from metalearn.functional.memory import parse_memory  # noqa: F401  (one parser for budgets)


# Calibrated on benchmarks/README.md's map_fn rows (Omniglot net, 5 support and 75 query
# images per task): per task, a second-order inner step keeps about five times the
# support set's forward activations (forward, inner backward, and what the outer
# backward through it holds), a first-order one about one time; the query set's forward
# activations are kept once.
INNER_STEP_FACTOR = {True: 5.0, False: 1.0}   # by second_order
# The batched formulation holds convolutions' patches: 1.8-2.2x map_fn's step memory in
# benchmarks/README.md (B = 8 and 32, 1 and 5 inner steps).
BATCHED_FACTOR = 2.0


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
    """The formulation :class:`Auto` runs (a pure function).

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
      batched_available: whether :class:`Batched` can run the learner.
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


# --- what Auto asks of a learner: its model, its pieces, batched or not ---------------

def _examples(x: Any) -> Tuple[Optional[int], Optional[Sequence[int]]]:
    """Examples per task and one example's shape, from a batch with a task axis."""
    first = tf.nest.flatten(x)[0]
    shape = list(first.shape)
    return (shape[1] if len(shape) > 1 else None), shape[2:]


@gin.configurable
class Auto(Formulation):
    """The formulation :func:`choose` picks for a learner and a batch, when the step is
    traced: on a CPU :class:`Accumulate`; on a GPU :class:`Batched` where available,
    then :class:`MapFn`, while the estimated activations fit ``memory_budget``, else
    :class:`Accumulate`. Training, evaluation and :meth:`Learner.meta_metrics` resolve
    it by the same rule.

    Args:
      memory_budget: what the step's activations may take: bytes, or a size such as
        ``"2GiB"``. Read on a GPU only; ``None``: no memory check.
      parallel_iterations: tasks in flight for the formulation chosen.
    """

    name = "auto"

    def __init__(self, memory_budget: Optional[Union[int, str]] = None,
                 parallel_iterations: int = 2):
        self.memory_budget = parse_memory(memory_budget)
        self.parallel_iterations = check_parallel(parallel_iterations, "Auto")
        # one example's activation bytes by (model, example shape): measured once, as
        # every trace of a step (and of each evaluation) resolves again
        self._activation_bytes: "weakref.WeakKeyDictionary[Any, Dict[Any, Optional[int]]]" = \
            weakref.WeakKeyDictionary()

    def choice(self, learner: Any, episodes: Any, steps: Optional[int] = None) -> Choice:
        """What :func:`choose` decides for ``learner`` on ``episodes`` (leading task
        axis), and why: the model's activations from its shapes, the batch's sizes from
        the episodes' static shapes."""
        support_x, query_x = episodes.support_x, episodes.query_x
        tasks = tf.nest.flatten(episodes)[0].shape[0]
        support, example = _examples(support_x)
        query, _ = _examples(query_x)
        device = "gpu" if tf.config.list_logical_devices("GPU") else "cpu"
        pieces = learner.pieces
        inner = int(steps) if steps is not None and not tf.is_tensor(steps) \
            else pieces.inner_steps
        second = not pieces.capabilities.first_order
        task_bytes = None
        shape = None if example is None else tuple(example)
        measured = self._activation_bytes.setdefault(learner.model, {})
        if shape not in measured:
            measured[shape] = memory.activation_bytes(learner.model, shape)
        per_example = measured[shape]
        if None not in (per_example, support, query, tasks):
            task_bytes = estimate_step_bytes(per_example, support, query, inner, second)
        return choose(tasks if tasks is not None else 1, inner, second, device,
                      self.memory_budget, task_bytes,
                      device != "cpu" and pieces.capabilities.task_axis,
                      self.parallel_iterations)

    def resolve(self, learner, episodes, steps=None):
        mode = self.choice(learner, episodes, steps).mode
        return {"accumulate": lambda: Accumulate(self.parallel_iterations),
                "map_fn": lambda: MapFn(self.parallel_iterations),
                "batched": Batched}[mode]()

    def per_task(self, learner, fn, episodes, signature=None):
        return self.resolve(learner, episodes).per_task(learner, fn, episodes, signature)

    def metrics(self, learner, episodes, steps=None, weights=None):
        return self.resolve(learner, episodes, steps).metrics(learner, episodes, steps, weights)

    def metrics_by_steps(self, learner, episodes, counts, weights=None):
        # each count as metrics(steps=count) would resolve it (the choice weighs the
        # inner steps): the counts of one resolution run together
        groups: Dict[str, List[int]] = {}
        for count in dict.fromkeys(counts):
            groups.setdefault(self.choice(learner, episodes, count).mode, []).append(count)
        found: Dict[int, Dict[str, tf.Tensor]] = {}
        for group in groups.values():
            found.update(self.resolve(learner, episodes, group[0]).metrics_by_steps(
                learner, episodes, group, weights))
        return {k: found[k] for k in dict.fromkeys(counts)}

    def adapted(self, learner, episodes, steps=None, weights=None):
        return self.resolve(learner, episodes, steps).adapted(learner, episodes, steps, weights)

    def gradients(self, learner, episodes, variables, steps=None):
        return self.resolve(learner, episodes, steps).gradients(learner, episodes,
                                                                variables, steps)

    def task_gradients(self, learner, episodes, variables, steps=None):
        return self.resolve(learner, episodes, steps).task_gradients(learner, episodes,
                                                                     variables, steps)

    def __repr__(self) -> str:
        return (f"Auto(memory_budget={self.memory_budget}, "
                f"parallel_iterations={self.parallel_iterations})")


FORMULATIONS = {cls.name: cls for cls in (MapFn, Unrolled, Batched, Accumulate, Auto)}


def formulation(value: Union[None, str, Formulation]) -> Formulation:
    """``value`` as a :class:`Formulation`: ``None`` is :class:`Auto`; a name
    (``"map_fn"``, ``"unrolled"``, ``"batched"``, ``"accumulate"``, ``"auto"``) its
    class with default options.

    Raises:
      ValueError: an unknown name; TypeError: anything else.
    """
    if value is None:
        return Auto()
    if isinstance(value, Formulation):
        return value
    if isinstance(value, str):
        if value not in FORMULATIONS:
            raise ValueError(f"unknown formulation {value!r}: one of {sorted(FORMULATIONS)}"
                             " or an object such as metalearn.execution.MapFn()")
        return FORMULATIONS[value]()
    raise TypeError(f"formulation must be a metalearn.execution.Formulation (MapFn(), "
                    f"Unrolled(), Batched(), Accumulate(), Auto()) or its name, got {value!r}")
