"""How a meta-batch runs: the formulations, Auto's choice, and the runtime.

A **formulation** says how the tasks of a batch are run; it is the only place where one
is chosen or interpreted. Outer rules, evaluation and :meth:`Learner.meta_metrics` all
ask one (:class:`Formulation`'s methods), so :class:`Auto` resolves the same way in
training and in evaluation. Every formulation runs the learner's one task run
(:meth:`Learner.run_task`, or :meth:`Learner.run_tasks` for all tasks at once) and reads
nothing else of the learner but the five members :class:`TaskLearner` writes down.

* :class:`MapFn`: a compiled loop over tasks (``tf.map_fn``), graph flat in the tasks;
  unrolled where a piece has a ``tf.custom_gradient`` (TensorFlow ignores those inside
  ``tf.map_fn``).
* :class:`Unrolled`: one copy of the work per task in the graph.
* :class:`Batched`: every layer run once for all tasks, with a task axis on inputs and
  adapted weights (:meth:`Learner.run_tasks`, :mod:`metalearn.functional.batched`).
* :class:`Accumulate`: each task's meta-gradient computed and summed inside a
  ``tf.while_loop``; only ``parallel_iterations`` tasks' activations alive at once, so
  memory is flat in the meta-batch; custom gradients honoured.
* :class:`Auto` (the default): resolved when the step is traced by :func:`choose`, a
  pure function of the meta-batch, inner steps, order, device and memory budget (on a
  CPU always ``Accumulate``).

Modules by job: :mod:`~metalearn.execution.formulations` (the formulations over the
:class:`TaskLearner` protocol), :mod:`~metalearn.execution.auto` (Auto's choice and
memory model, the registry of names), :mod:`~metalearn.execution.runtime` (seed, XLA,
dtype policy, op determinism and thread pools: :class:`Runtime`, which needs no learner).
"""

from metalearn.execution.auto import (BATCHED_FACTOR, FORMULATIONS, INNER_STEP_FACTOR,
                                      Auto, Choice, choose, estimate_step_bytes,
                                      formulation, parse_memory)
from metalearn.execution.formulations import (Accumulate, Batched, Formulation, InFlight,
                                              MapFn, TaskLearner, Unrolled,
                                              figures_signature, gradient_metrics,
                                              num_tasks, signature)
from metalearn.execution.runtime import (Runtime, check_threads, enable_determinism,
                                         set_threads)

__all__ = ["Accumulate", "Auto", "Batched", "Choice", "Formulation", "InFlight", "MapFn", "Runtime",
           "TaskLearner", "Unrolled", "check_threads", "choose", "enable_determinism",
           "estimate_step_bytes", "figures_signature", "formulation", "gradient_metrics", "num_tasks",
           "parse_memory", "set_threads", "signature"]
