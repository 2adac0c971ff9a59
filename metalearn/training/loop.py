"""The compiled meta-step and the training loop: checkpoints, summaries, logs."""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import time
from typing import Callable, Dict, Optional

import gin
import tensorflow as tf
from absl import logging

from metalearn.learners import Learner
from metalearn.meta_optimizers import MetaOptimizer
from metalearn.tasks.episode import Episode
from metalearn.training import distribute, files, validation
from metalearn.training.experiment import CONFIG_FILE, Experiment

CHECKPOINT_DIR = "checkpoints"
OPERATIVE_CONFIG_FILE = "operative_config.gin"
METRICS_FILE = "metrics.json"

MetaStep = Callable[[Episode], Dict[str, tf.Tensor]]


def make_meta_step(learner: Learner, meta_optimizer: MetaOptimizer,
                   jit_compile: bool = False, skip_non_finite: bool = False) -> MetaStep:
    """The whole outer step (inner loops, meta-gradient, update) as one ``tf.function``,
    on one device.

    Returns a function of a batch of episodes giving the batch's mean metrics
    (``{"loss": ..., ...}``) before the update. Each call advances
    ``learner.meta_step`` by one after the update (what schedules over meta-training,
    such as MAML++'s annealing, read). With ``skip_non_finite`` a step whose meta-loss
    or a meta-gradient is NaN or infinite changes nothing but ``learner.meta_step``,
    and the result also holds ``"non_finite"`` (see
    :func:`~metalearn.training.distribute.make_distributed_meta_step`). For several
    devices see :func:`metalearn.training.distribute.make_distributed_meta_step`.
    """
    meta_optimizer.build(learner)

    def meta_step(episodes: Episode) -> Dict[str, tf.Tensor]:
        flags = None
        if skip_non_finite:
            metrics, flags = meta_optimizer.finite_step(learner, episodes)
        else:
            metrics = meta_optimizer.step(learner, episodes)
        with tf.control_dependencies(tf.nest.flatten(metrics)):
            learner.meta_step.assign_add(1)
        means = {name: tf.reduce_mean(value) for name, value in metrics.items()}
        if flags is not None:
            means[distribute.NON_FINITE] = flags
        return means

    return tf.function(meta_step, jit_compile=jit_compile)


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


def _non_finite_error(flags, step: int, learner: Learner, checkpoint_dir: str
                      ) -> FloatingPointError:
    culprits = []
    if flags[0]:
        culprits.append("meta-loss")
    bad = [v.path for v, flag in zip(learner.meta_variables, flags[1:]) if flag]
    if bad:
        shown = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        culprits.append(f"meta-gradient of {shown}")
    latest = tf.train.latest_checkpoint(checkpoint_dir)
    kept = (f"the latest checkpoint, {latest}, is from before it (rerunning resumes "
            "from there)") if latest else "there is no checkpoint yet"
    return FloatingPointError(
        f"non-finite (NaN or infinite) {' and '.join(culprits)} at step {step}; its "
        f"update was not applied and {kept}. Experiment.on_non_finite = 'skip' "
        "would skip such steps instead")


def train(experiment: Experiment, workdir: str,
          strategy: Optional[tf.distribute.Strategy] = None,
          allow_config_change: bool = False) -> Dict[str, float]:
    """Meta-trains ``experiment`` in ``workdir``, resuming from its latest checkpoint.

    Under a ``tf.distribute`` strategy (the experiment must have been built in its
    scope, see :func:`build_experiment`) each replica adapts its share of every
    meta-batch; only the chief writes checkpoints, summaries and results, and every
    worker restores from the chief's checkpoints when the job restarts.

    Writes ``config.gin`` (the run's gin bindings), ``operative_config.gin`` (every value
    the run used), ``checkpoints/``, TensorBoard
    summaries under ``train/`` and ``metrics.json`` (the final metrics); the files
    atomically, and a run killed at any moment (even mid-checkpoint) resumes from its
    latest complete checkpoint to the same result as an uninterrupted run.

    Every step checks that the meta-loss and every meta-gradient are finite (inside the
    compiled step: a step that is not applies no update); ``experiment.on_non_finite``
    says whether such a step stops the run or is skipped (counted as
    ``skipped_steps`` in the summaries and results).

    Before anything else (and before any file in ``workdir`` is written) the run is
    checked by :func:`metalearn.training.validation.check_before_training`: a workdir
    holding a run of another config raises unless ``allow_config_change``; bad tasks,
    data or model outputs raise.

    Returns:
      The final metrics: mean over the last logging window (or, with
      ``Experiment.log_average="running"``, over all steps of the run) of each per-task
      metric over the finite steps, plus ``step``, ``tasks_per_second`` (of the last
      window) and, when skipping, ``skipped_steps``.

    Raises:
      FloatingPointError: with ``on_non_finite="raise"``, the meta-loss or a
        meta-gradient became NaN or infinite; the message names the step and what was
        not finite. That step's update was not applied and the latest checkpoint is
        from before it.
    """
    # --- validation before any work (issue 9); see training/validation.py ---
    validation.check_before_training(experiment, workdir, allow_config_change)
    strategy = strategy or tf.distribute.get_strategy()
    chief = distribute.is_chief(strategy)
    learner, meta_optimizer = experiment.learner, experiment.meta_optimizer
    skip = experiment.on_non_finite == "skip"
    distribute.tasks_per_replica(experiment.meta_batch_size, strategy)  # fail early
    meta_step = distribute.make_distributed_meta_step(strategy, learner, meta_optimizer,
                                                      experiment.jit_compile,
                                                      skip_non_finite=True)
    step = learner.meta_step  # advanced by meta_step(); saved as "step"
    progress = Progress()
    checkpoint = checkpoint_for(experiment, step, progress)
    checkpoint_dir = os.path.join(workdir, CHECKPOINT_DIR)
    # Every worker takes part in saving (collectives); only the chief's copy is kept.
    write_dir = checkpoint_dir if chief else tempfile.mkdtemp(prefix="metalearn_ckpt_")
    # The manager writes a checkpoint's files, then records it in the `checkpoint`
    # state file (itself replaced atomically): a save cut short is never the latest.
    manager = tf.train.CheckpointManager(checkpoint, write_dir,
                                         max_to_keep=experiment.keep_checkpoints)
    latest = tf.train.latest_checkpoint(checkpoint_dir)
    if latest:
        saved = {name for name, _ in tf.train.list_variables(latest)}
        if any(name.startswith("progress/") for name in saved):
            checkpoint.restore(latest).assert_existing_objects_matched()
        else:  # written before the loop's progress was checkpointed
            checkpoint_for(experiment, step).restore(latest).assert_existing_objects_matched()
        progress.load()
        logging.info("resumed from %s at step %d", latest, int(step.numpy()))
    start = int(step.numpy())
    if chief:
        os.makedirs(workdir, exist_ok=True)
        # config.gin: every binding of the run (evaluation's too), parsed by restore();
        # operative_config.gin: the values the run actually used, defaults included.
        files.write_text(os.path.join(workdir, CONFIG_FILE),
                         experiment.config or gin.config_str())
        files.write_text(os.path.join(workdir, OPERATIVE_CONFIG_FILE),
                         gin.operative_config_str())
    writer = tf.summary.create_file_writer(os.path.join(workdir, "train")) if chief else \
        tf.summary.create_noop_writer()
    episodes = distribute.episode_stream(
        strategy, experiment.sampler, experiment.meta_batch_size, seed=experiment.seed,
        split="train", start_step=start, num_steps=max(experiment.num_steps - start, 0))
    running = experiment.log_average == "running"
    final: Dict[str, float] = {}
    timed_steps, window_start = 0, time.perf_counter()
    for batch in episodes:
        metrics = meta_step(batch)
        flags = metrics.pop(distribute.NON_FINITE).numpy()
        current = int(step.numpy())
        timed_steps += 1
        if flags.any():
            if not skip:
                raise _non_finite_error(flags, current, learner, checkpoint_dir)
            progress.skipped_steps += 1
            logging.warning("skipped step %d: %s", current,
                            _non_finite_error(flags, current, learner, checkpoint_dir))
        else:
            progress.add({name: float(value) for name, value in metrics.items()})
        done = current >= experiment.num_steps
        if current % experiment.log_every == 0 or done:
            elapsed = time.perf_counter() - window_start
            final = progress.means(running)
            final["tasks_per_second"] = timed_steps * experiment.meta_batch_size / elapsed
            if skip:
                final["skipped_steps"] = progress.skipped_steps
            logging.info("step %d/%d  meta-loss %.5f%s  %s  %.0f tasks/s", current,
                         experiment.num_steps, final.get("loss", math.nan),
                         " (running mean)" if running else "",
                         "  ".join(f"{k} {v:.4f}" for k, v in final.items()
                                   if k not in ("loss", "tasks_per_second")),
                         final["tasks_per_second"])
            with writer.as_default(step=current):
                for name, value in final.items():
                    tf.summary.scalar(name if name in ("tasks_per_second", "skipped_steps")
                                      else f"meta_{name}", value)
            progress.end_window()
            timed_steps, window_start = 0, time.perf_counter()
        if current % experiment.checkpoint_every == 0 or done:
            progress.store()
            manager.save(checkpoint_number=current)
    writer.flush()
    if not chief:
        shutil.rmtree(write_dir, ignore_errors=True)
        final["step"] = int(step.numpy())
        return final
    metrics_path = os.path.join(workdir, METRICS_FILE)
    if start < experiment.num_steps or not os.path.exists(metrics_path):
        final["step"] = int(step.numpy())
        final["replicas"] = strategy.num_replicas_in_sync
        files.write_json(metrics_path, final)  # never a half-written file
    with open(metrics_path) as f:
        return json.load(f)
