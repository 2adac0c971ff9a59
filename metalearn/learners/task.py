"""One task's run, as one result: what :meth:`Learner.run_task` gives every caller.

A task runs *split → task start → adapt → query data → predict → measure → objective*,
once, in :meth:`~metalearn.Learner.run_task`; the formulations, the outer rules
(Reptile, the carried-trajectory rules, the trust-region rules), evaluation and the
checks before training all take this result instead of writing the pipeline again, so a
learner's overrides are honoured by every one of them.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, NamedTuple, Optional

import tensorflow as tf

from metalearn.functional import Weights


class Adapted(NamedTuple):
    """What adaptation gives for one task, whatever the learner: what
    :meth:`~metalearn.Learner.adapt` returns and :meth:`~metalearn.Learner.predict`
    takes (from :meth:`~metalearn.Learner.run_tasks`, every tensor with a leading task
    axis).

    Attributes:
      weights: the model's weights by path after the inner loop (as they were for a
        learner without one: a neural process, Prototypical Networks).
      state: everything else the task's solution holds, by name, never inside the
        weights: a head's fit (``"head"``: prototypes, a ridge solution), an adapter's
        encoded support set (``"context"``: :meth:`~metalearn.adapters.Adapter.task_state`),
        a sampled latent. Empty for a plain inner loop.
    """

    weights: Weights
    state: Dict[str, Any]

    @classmethod
    def of(cls, value: Any, who: str = "predict") -> "Adapted":
        """``value`` as an :class:`Adapted`: an ``Adapted`` as it is, weights by path
        as ``Adapted(weights, {})`` (predictions with weights alone, e.g. before any
        adaptation).

        Raises:
          TypeError: anything else, naming ``who``.
        """
        if isinstance(value, Adapted):
            return value
        if isinstance(value, Mapping):
            return cls(dict(value), {})
        raise TypeError(f"{who} needs what adapt() returns (metalearn.learners.Adapted: "
                        f"weights and the task's state) or weights by path, got "
                        f"{type(value).__name__}")


class Resume(NamedTuple):
    """A carried inner trajectory to continue for ``steps`` inner steps (what the
    carried-trajectory outer rules of :mod:`metalearn.outer.truncated` hand
    :meth:`~metalearn.Learner.run_task`).

    Attributes:
      weights: the carried adapted weights (the paths the inner loop changes);
        ``None``: the trajectory's start (the adapter's loop begun from the learner's
        weights, :meth:`start_of`).
      state: the inner update's carried state (momenta, a learned optimizer's
        accumulators); ``None`` with ``weights``.
      start: the index of the segment's first inner step (an int or a scalar int32
        tensor); at 0 (or where ``fresh``) the trajectory starts from the learner's
        weights instead of the carried ones, so gradients and perturbations reach them.
      steps: inner steps to run.
      horizon: inner steps of the whole trajectory (what a learner whose objective
        weighs every step, MAML++'s, needs to place the segment in it).
      fresh: a boolean (tensor): the horizon's first segment.
    """

    weights: Optional[Dict[str, tf.Tensor]]
    state: Any
    start: Any
    steps: int
    horizon: int
    fresh: Any

    @classmethod
    def start_of(cls, horizon: int, steps: int = 0) -> "Resume":
        """The trajectory's start: ``steps`` inner steps from step 0 (with ``steps=0``,
        a run whose ``adapted`` and ``inner_state`` are where the trajectory begins: what a
        carried-trajectory rule lays its variables out from)."""
        return cls(None, None, 0, steps, horizon, True)


class Trajectory(NamedTuple):
    """The weights after each inner step of a run, where the learner records them
    (:attr:`~metalearn.Learner.records_trajectory`).

    Attributes:
      weights: the weights after each step of this run, in order (after the last one
        they are the run's adapted weights); empty for a run of no steps.
      start: the index of the first of those steps in the whole trajectory (0 for a
        run from the start; a carried segment's start).
      horizon: inner steps of the whole trajectory.
    """

    weights: List[Weights]
    start: Any
    horizon: int


class TaskRun(NamedTuple):
    """One task's run (no task axis; from :meth:`~metalearn.Learner.run_tasks` every
    field has a leading task axis).

    Attributes:
      adapted: what the learner's adaptation gives (:class:`Adapted`: the adapted
        weights, and the task's state: a head's fit, an encoded context).
      support_x, support_y: the support set the inner loop saw.
      query_x, query_y: the query set measured (after
        :meth:`~metalearn.Learner.query_data`).
      predictions: the learner's predictions on ``query_x`` with ``adapted``.
      metrics: the task's figures by name (:meth:`~metalearn.Learner.objective_of`'s:
        ``"loss"`` is what the outer step minimises).
      steps: the inner steps asked for (``None``: the adapter's own).
      trajectory: the weights after every inner step, where the learner records them
        (:class:`Trajectory`), else ``None``.
      inner_state: a carried run's inner-update state after its last step (momenta, a
        learned optimizer's accumulators: what the next segment continues from;
        ``None`` for a run that was not resumed).
    """

    adapted: Adapted
    support_x: Any
    support_y: Any
    query_x: Any
    query_y: Any
    predictions: Any
    metrics: Dict[str, tf.Tensor]
    steps: Optional[int] = None
    trajectory: Optional[Trajectory] = None
    inner_state: Any = None
