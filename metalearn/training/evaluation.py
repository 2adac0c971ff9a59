"""Evaluation on held-out tasks with 95% confidence intervals
(:func:`metalearn.statistics.mean_and_interval`)."""

from __future__ import annotations

import datetime
import hashlib
import math
import time
from typing import Dict, Optional, Sequence, Union

import gin
import numpy as np
import tensorflow as tf
from absl import logging

from metalearn.execution import Formulation
from metalearn.learners.learner import Learner
from metalearn.runs import validation
from metalearn.statistics import mean_and_interval
from metalearn.tasks.base import TaskSampler


@gin.configurable(denylist=["learner", "sampler"])
def evaluate(learner: Learner, sampler: TaskSampler, num_tasks: int = 600,
             inner_steps: Optional[Sequence[int]] = None, batch_size: int = 25,
             seed: int = 0, split: str = "test",
             formulation: Optional[Formulation] = None,
             log_every_seconds: float = 15.0) -> Dict[str, object]:
    """Adapts to ``num_tasks`` held-out tasks and measures every metric on their queries.

    Args:
      learner: the (trained) learner.
      sampler: where tasks come from.
      num_tasks: tasks evaluated (600 by default, as papers report).
      inner_steps: inner-step counts to evaluate after (whole numbers); defaults to the
        adapter's own.
      batch_size: tasks run at once.
      seed, split: the task stream (``"test"`` tasks never appear in meta-training).
      formulation: how a batch of tasks runs (:mod:`metalearn.execution`): the run's
        (``Experiment.formulation``) at the entry points, as it answers
        :meth:`~metalearn.execution.Formulation.for_evaluation` (``Unrolled``: ``MapFn``);
        ``None``: ``Auto()``, resolved as the meta-step resolves it.
      log_every_seconds: a progress line (the part under way, elapsed time, ETA) at
        most this often while sampling and evaluating; an evaluation that ends sooner
        logs none. ``0``: none.

    Every count is measured in one traced function (:meth:`~metalearn.Learner.
    meta_metrics` given the counts): where the learner's pieces allow it
    (``pieces.capabilities.step_prefix``, :meth:`~metalearn.Learner.run_task`) each
    task adapts once, for the most steps, and is measured after each count on the way
    (1, 5, 10: 10 inner steps, not 16), with the figures of evaluating each count on
    its own. A sampler whose batches are made outside the step
    (:meth:`~metalearn.tasks.TaskSampler.collection`: a Python environment) has every
    batch collected for each number of inner steps, with the learner's weights, and
    each count traced and run on its own, unless the collection's batches do not
    depend on the count (:attr:`~metalearn.tasks.Collection.depends_on_steps`: RL²'s
    trials): then each batch is collected once and every count measured on it.

    Returns:
      ``{"num_tasks", "split", "seed", "tasks" (:func:`task_description`: the sampler,
      ways, shots, queries), "inner_steps", "episodes" (a digest of the episodes),
      "results": {steps: {metric: {"mean", "ci95", "std"}}}, "per_task": {steps:
      {metric: [value per episode]}}}``.
    """
    if int(num_tasks) < 2:
        raise ValueError(f"num_tasks must be >= 2, got {num_tasks}")
    if int(batch_size) < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if inner_steps is None:
        inner_steps = [learner.adapter.inner_steps]
    if isinstance(inner_steps, (int, np.integer)):
        inner_steps = [inner_steps]
    bad = [s for s in inner_steps if isinstance(s, bool) or not isinstance(
        s, (int, float, np.integer, np.floating)) or int(s) != s]
    if bad:
        raise TypeError(f"evaluate.inner_steps must be whole numbers of inner steps, got "
                        f"{tuple(inner_steps)} ({', '.join(map(repr, bad))} not); e.g. "
                        "evaluate.inner_steps = (1, 5, 10)")
    inner_steps = [int(s) for s in inner_steps]
    if any(s < 0 for s in inner_steps):
        raise ValueError(f"inner_steps must be >= 0, got {inner_steps}")
    if formulation is not None:
        formulation = formulation.for_evaluation()
    batches = math.ceil(int(num_tasks) / int(batch_size))
    progress = _Progress(batches * 2, float(log_every_seconds))
    episodes = []
    for batch in sampler.dataset(int(batch_size), seed=seed, split=split,
                                 num_steps=batches):  # decoding, for image data
        episodes.append(batch)
        progress.advance(f"sampling the {split} tasks: batch {len(episodes)}/{batches}")
    validation.check_outputs(learner, episodes[0].task(0), sampler, split)  # ways != outputs
    validation.check_loss_and_metrics(learner, episodes[0].task(0))  # e.g. accuracy on MSE
    results: Dict[str, Dict[str, Dict[str, float]]] = {}
    per_episode: Dict[str, Dict[str, list]] = {}
    # A sampler whose batches are made outside the step (a Python environment's
    # trajectories, collected with the weights after each number of inner steps).
    collection = sampler.collection(learner)
    counts = list(dict.fromkeys(inner_steps))
    # one pass over the batches for every count, or one per count where a batch is
    # collected with the weights after each
    passes = [counts] if collection is None or not collection.depends_on_steps \
        else [[steps] for steps in counts]
    progress.total = batches * (1 + len(passes))
    per_task: Dict[int, Dict[str, list]] = {steps: {} for steps in counts}
    try:
        for part in passes:
            run = tf.function(lambda batch, part=tuple(part): learner.meta_metrics(
                batch, part, formulation=formulation))
            what = ", ".join(map(str, part))
            for index, batch in enumerate(episodes, 1):
                if collection is not None:
                    batch = collection(batch, part[0])
                figures = run(batch)
                for steps in part:
                    for name, values in figures[steps].items():
                        per_task[steps].setdefault(name, []).extend(values.numpy().tolist())
                progress.advance(f"{what} inner steps: batch {index}/{batches}")
    finally:
        if collection is not None:
            collection.close()
    for steps in inner_steps:
        results[str(steps)] = {name: mean_and_interval(values[:num_tasks])
                               for name, values in per_task[steps].items()}
        per_episode[str(steps)] = {name: values[:num_tasks]
                                   for name, values in per_task[steps].items()}
    # Per-episode values and a digest of the episodes, so that two runs evaluated on
    # the same episodes can be compared pair by pair (metalearn.studies.results.compare_runs).
    # (Labels, and each example's mean rounded to 5 decimals: the same on any machine.)
    digest = hashlib.sha256()
    for batch in episodes:
        for part in tf.nest.flatten(batch):
            values = np.asarray(part.numpy(), np.float64)
            if values.ndim > 2 and values.size:
                values = values.reshape(values.shape[:2] + (-1,)).mean(axis=-1)
            digest.update(np.round(values, 5).tobytes())
    return {"num_tasks": int(num_tasks), "split": split, "seed": int(seed),
            "tasks": task_description(sampler, split), "inner_steps": inner_steps,
            "episodes": digest.hexdigest()[:16], "results": results,
            "per_task": per_episode}


def _clock(seconds: float) -> str:
    return str(datetime.timedelta(seconds=int(round(seconds))))


class _Progress:
    """Logs ``evaluation 40% (<part>)  elapsed 0:00:30  ETA 0:00:45`` at most every
    ``every`` seconds, over ``total`` units of work (the ETA: the rest at the mean
    pace so far)."""

    def __init__(self, total: int, every: float):
        self.total, self.every, self.done = max(int(total), 1), every, 0
        self.start = self.last = time.perf_counter()

    def advance(self, part: str) -> None:
        self.done += 1
        now = time.perf_counter()
        if self.every <= 0 or now - self.last < self.every or self.done >= self.total:
            return
        self.last = now
        elapsed = now - self.start
        logging.info("evaluation %d%% (%s)  elapsed %s  ETA %s",
                     100 * self.done // self.total, part, _clock(elapsed),
                     _clock(elapsed / self.done * (self.total - self.done)))


def write_summaries(report: Dict[str, object], logdir: str) -> None:
    """An evaluation report's means as TensorBoard scalars in ``logdir``, at the
    report's ``checkpoint_step``: ``<metric>/<steps>_inner_steps`` (its 95% interval's
    half-width as ``<metric>_ci95/<steps>_inner_steps``), so that evaluations of a
    run's checkpoints draw a curve over meta-training."""
    writer = tf.summary.create_file_writer(logdir)
    try:
        with writer.as_default(step=int(report.get("checkpoint_step") or 0)):
            for steps, metrics in report["results"].items():
                for name, figure in metrics.items():
                    tf.summary.scalar(f"{name}/{steps}_inner_steps", figure["mean"])
                    tf.summary.scalar(f"{name}_ci95/{steps}_inner_steps", figure["ci95"])
    finally:
        writer.close()


def _count(value) -> Union[int, list]:
    """A sampler's count (an int, or a tuple of choices) as JSON keeps it."""
    if isinstance(value, (tuple, list)):
        values = [int(v) for v in value]
        return values[0] if len(values) == 1 else values
    return int(value)


def task_description(sampler: TaskSampler, split: str) -> Dict[str, object]:
    """What a task of ``sampler``'s ``split`` is: ``{"sampler": class name, "ways",
    "shots", "queries"}``, each count where the sampler has it (an int, or the list of
    choices a task draws from; a classification sampler's queries are per class, a
    regression sampler's per task). The shots are the split's (``train_shots`` for
    ``"train"`` where the sampler has them)."""
    description: Dict[str, object] = {"sampler": type(sampler).__name__}
    shots = "train_shots" if split == "train" and hasattr(sampler, "train_shots") \
        else "shots"
    for key, attribute in (("ways", "ways"), ("shots", shots), ("queries", "queries")):
        value = getattr(sampler, attribute, None)
        if isinstance(value, (int, np.integer, tuple, list)) and not isinstance(value, bool):
            try:
                description[key] = _count(value)
            except (TypeError, ValueError):  # not a count: leave it out
                pass
    return description


def _counted(value, unit: str) -> str:
    if isinstance(value, list):
        contiguous = value == list(range(value[0], value[0] + len(value)))
        value = f"{value[0]}-{value[-1]}" if contiguous and len(value) > 2 else \
            "/".join(map(str, value))
    return f"{value}-{unit}"


def describe(report: Dict[str, object]) -> str:
    """The first line of :func:`report_figures`: what was evaluated (the sampler, ways,
    shots and queries, how many tasks of which split, the inner steps, the checkpoint),
    e.g. ``Sinusoid, 5-shot, 10 queries per task: 600 test tasks (seed 0), after 1, 5,
    10 inner steps, checkpoint step 70000``."""
    tasks = dict(report.get("tasks") or {})
    shape = " ".join(([_counted(tasks["ways"], "way")] if "ways" in tasks else [])
                     + ([_counted(tasks["shots"], "shot")] if "shots" in tasks else []))
    parts = [part for part in (tasks.get("sampler"), shape) if part]
    if tasks.get("queries"):
        parts.append(f"{tasks['queries']} queries per " +
                     ("class" if "ways" in tasks else "task"))
    steps = report.get("inner_steps") or list(report["results"])
    return ((", ".join(parts) + ": " if parts else "")
            + f"{report.get('num_tasks')} {report.get('split')} tasks (seed "
            f"{report.get('seed')}), after {', '.join(map(str, steps))} inner steps, "
            f"checkpoint step {report.get('checkpoint_step')}")


def report_figures(report: Dict[str, object]) -> str:
    """An evaluation report's results as lines a person reads: what was evaluated
    (:func:`describe`), then ``<steps> inner steps: <metric> <mean> ± <ci95> ...``
    (the mean over the tasks and its 95% interval); the per-task values stay in the
    report's file. What the entry points log before they write the report
    (:func:`metalearn.runs.files.write_results`)."""
    lines = [describe(report)]
    for steps, metrics in report["results"].items():
        lines.append(f"{steps} inner steps: " + "  ".join(
            f"{name} {m['mean']:.4f} ± {m['ci95']:.4f}" for name, m in metrics.items()))
    return "\n".join(lines)
