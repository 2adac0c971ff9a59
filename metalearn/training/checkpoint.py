"""What a run checkpoints, and a trained run restored from its workdir."""

from __future__ import annotations

import json
import math
import os
from typing import Dict, Optional, Sequence

import tensorflow as tf

from metalearn.runs.experiment import Experiment, build_experiment, parse_config

CHECKPOINT_DIR = "checkpoints"


class Progress:
    """The training loop's own state, checkpointed with the run so that a resumed run
    logs and reports exactly what an uninterrupted one would: the metric sums of the
    current logging window and of the whole run (float64, summed in step order), their
    step counts, and the number of skipped (non-finite) steps. Held as one JSON string
    variable (plain data: loading it runs no code)."""

    def __init__(self):
        with tf.device("/cpu:0"):  # host data, whatever the accelerator
            self.state = tf.Variable("", dtype=tf.string, trainable=False,
                                     name="progress")  # what the checkpoint holds
        self.reset()

    def reset(self) -> None:
        self.window: Dict[str, float] = {}
        self.window_steps = 0
        self.running: Dict[str, float] = {}
        self.running_steps = 0
        self.skipped_steps = 0

    def add(self, metrics: Dict[str, float]) -> None:
        """One finite step's metrics."""
        for totals in (self.window, self.running):
            for name, value in metrics.items():
                totals[name] = totals.get(name, 0.0) + value
        self.window_steps += 1
        self.running_steps += 1

    def means(self, running: bool) -> Dict[str, float]:
        totals, steps = (self.running, self.running_steps) if running else \
            (self.window, self.window_steps)
        return {name: (value / steps if steps else math.nan)
                for name, value in totals.items()}

    def end_window(self) -> None:
        self.window, self.window_steps = {}, 0

    def store(self) -> None:
        """Copies the Python-side state into the variable (before a save)."""
        self.state.assign(json.dumps({
            "window": self.window, "window_steps": self.window_steps,
            "running": self.running, "running_steps": self.running_steps,
            "skipped_steps": self.skipped_steps}))

    def load(self) -> None:
        """The state from the variable (after a restore); empty: from the start."""
        text = self.state.numpy().decode()
        self.reset()
        if text:
            saved = json.loads(text)
            self.window, self.window_steps = saved["window"], int(saved["window_steps"])
            self.running, self.running_steps = saved["running"], int(saved["running_steps"])
            self.skipped_steps = int(saved["skipped_steps"])


def checkpoint_for(experiment: Experiment, step: tf.Variable,
                   progress: Optional[Progress] = None) -> tf.train.Checkpoint:
    """What a run checkpoints: the step, the learner (model and adapter state), the
    meta-optimizer (its slots and iteration count) and, when given, the training
    loop's :class:`Progress`. Nothing else is needed to resume exactly: the task
    streams are a function of the run's seed and the step."""
    parts = dict(step=step, learner=experiment.learner,
                 optimizer=experiment.meta_optimizer.optimizer)
    if progress is not None:
        parts["progress"] = progress.state
    return tf.train.Checkpoint(**parts)


def restore(workdir: str, gin_params: Sequence[str] = (),
            checkpoint: Optional[str] = None) -> Experiment:
    """Rebuilds a run's experiment from its workdir and loads its latest checkpoint.

    Args:
      workdir: a directory written by ``metalearn.train``.
      gin_params: bindings applied on top of the run's saved config (e.g. a different
        number of shots for evaluation).
      checkpoint: a specific checkpoint path; defaults to the latest in the workdir.

    Returns:
      The experiment, whose ``.learner`` holds the trained weights and whose
      ``.sampler`` (and ``.config``) describe the data and preprocessing of the run.
    """
    parse_config(workdir=workdir, gin_params=gin_params)
    experiment = build_experiment()
    path = checkpoint or tf.train.latest_checkpoint(os.path.join(workdir, CHECKPOINT_DIR))
    if path is None:
        raise FileNotFoundError(f"no checkpoint in {os.path.join(workdir, CHECKPOINT_DIR)!r}")
    step = experiment.learner.meta_step
    status = checkpoint_for(experiment, step).restore(path)
    status.assert_existing_objects_matched()
    status.expect_partial()  # the training loop's progress is not needed here
    experiment.restored_step = int(step.numpy())
    return experiment
