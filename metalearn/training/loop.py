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
from metalearn.training import distribute, validation
from metalearn.training.experiment import CONFIG_FILE, Experiment

CHECKPOINT_DIR = "checkpoints"
OPERATIVE_CONFIG_FILE = "operative_config.gin"
METRICS_FILE = "metrics.json"

MetaStep = Callable[[Episode], Dict[str, tf.Tensor]]


def make_meta_step(learner: Learner, meta_optimizer: MetaOptimizer,
                   jit_compile: bool = False) -> MetaStep:
    """The whole outer step (inner loops, meta-gradient, update) as one ``tf.function``,
    on one device.

    Returns a function of a batch of episodes giving the batch's mean metrics
    (``{"loss": ..., ...}``) before the update. Each call advances
    ``learner.meta_step`` by one after the update (what schedules over meta-training,
    such as MAML++'s annealing, read). For several devices see
    :func:`metalearn.training.distribute.make_distributed_meta_step`.
    """
    meta_optimizer.build(learner)

    def meta_step(episodes: Episode) -> Dict[str, tf.Tensor]:
        metrics = meta_optimizer.step(learner, episodes)
        with tf.control_dependencies(tf.nest.flatten(metrics)):
            learner.meta_step.assign_add(1)
        return {name: tf.reduce_mean(value) for name, value in metrics.items()}

    return tf.function(meta_step, jit_compile=jit_compile)


def checkpoint_for(experiment: Experiment, step: tf.Variable) -> tf.train.Checkpoint:
    """What a run checkpoints: the step, the learner (model and adapter state) and the
    meta-optimizer's slots."""
    return tf.train.Checkpoint(step=step, learner=experiment.learner,
                               optimizer=experiment.meta_optimizer.optimizer)


def _write_json(path: str, value) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(value, f, indent=2, sort_keys=True)
    os.replace(tmp, path)  # never a half-written file


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
    summaries under ``train/`` and ``metrics.json`` (the final metrics).

    Before anything else (and before any file in ``workdir`` is written) the run is
    checked by :func:`metalearn.training.validation.check_before_training`: a workdir
    holding a run of another config raises unless ``allow_config_change``; bad tasks,
    data or model outputs raise.

    Returns:
      The final metrics: mean over the last logging window (or, with
      ``Experiment.log_average="running"``, over all steps of this run) of each per-task
      metric, plus ``step`` and ``tasks_per_second`` (of the last window).

    Raises:
      FloatingPointError: the meta-loss became NaN or infinite (the latest checkpoint
        from before that point is kept).
    """
    # --- validation before any work (issue 9); see training/validation.py ---
    validation.check_before_training(experiment, workdir, allow_config_change)
    strategy = strategy or tf.distribute.get_strategy()
    chief = distribute.is_chief(strategy)
    learner, meta_optimizer = experiment.learner, experiment.meta_optimizer
    distribute.tasks_per_replica(experiment.meta_batch_size, strategy)  # fail early
    meta_step = distribute.make_distributed_meta_step(strategy, learner, meta_optimizer,
                                                      experiment.jit_compile)
    step = learner.meta_step  # advanced by meta_step(); saved as "step"
    checkpoint = checkpoint_for(experiment, step)
    checkpoint_dir = os.path.join(workdir, CHECKPOINT_DIR)
    # Every worker takes part in saving (collectives); only the chief's copy is kept.
    write_dir = checkpoint_dir if chief else tempfile.mkdtemp(prefix="metalearn_ckpt_")
    manager = tf.train.CheckpointManager(checkpoint, write_dir,
                                         max_to_keep=experiment.keep_checkpoints)
    latest = tf.train.latest_checkpoint(checkpoint_dir)
    if latest:
        checkpoint.restore(latest).assert_existing_objects_matched()
        logging.info("resumed from %s at step %d", latest, int(step.numpy()))
    start = int(step.numpy())
    if chief:
        os.makedirs(workdir, exist_ok=True)
        # config.gin: every binding of the run (evaluation's too), parsed by restore();
        # operative_config.gin: the values the run actually used, defaults included.
        with open(os.path.join(workdir, CONFIG_FILE), "w") as f:
            f.write(experiment.config or gin.config_str())
        with open(os.path.join(workdir, OPERATIVE_CONFIG_FILE), "w") as f:
            f.write(gin.operative_config_str())
    writer = tf.summary.create_file_writer(os.path.join(workdir, "train")) if chief else \
        tf.summary.create_noop_writer()
    episodes = distribute.episode_stream(
        strategy, experiment.sampler, experiment.meta_batch_size, seed=experiment.seed,
        split="train", start_step=start, num_steps=max(experiment.num_steps - start, 0))
    window: list = []
    running_totals: Dict[str, tf.Tensor] = {}  # sums since this run started
    running_count = 0
    final: Dict[str, float] = {}
    window_start = time.perf_counter()
    for batch in episodes:
        window.append(meta_step(batch))
        if experiment.log_average == "running":
            running_totals = {k: running_totals.get(k, 0.0) + v for k, v in window[-1].items()}
            running_count += 1
        current = int(step.numpy())
        done = current >= experiment.num_steps
        if current % experiment.log_every == 0 or done:
            elapsed = time.perf_counter() - window_start
            if experiment.log_average == "running":
                final = {k: float(v) / running_count for k, v in running_totals.items()}
            else:
                final = {k: float(tf.reduce_mean([m[k] for m in window])) for k in window[0]}
            if not all(math.isfinite(v) for v in final.values()):
                raise FloatingPointError(
                    f"non-finite meta-metrics {final} at step {current}; the latest "
                    f"checkpoint {manager.latest_checkpoint} is from before it")
            final["tasks_per_second"] = len(window) * experiment.meta_batch_size / elapsed
            logging.info("step %d/%d  meta-loss %.5f%s  %s  %.0f tasks/s", current,
                         experiment.num_steps, final["loss"],
                         " (running mean)" if experiment.log_average == "running" else "",
                         "  ".join(f"{k} {v:.4f}" for k, v in final.items()
                                   if k not in ("loss", "tasks_per_second")),
                         final["tasks_per_second"])
            with writer.as_default(step=current):
                for name, value in final.items():
                    tf.summary.scalar(name if name == "tasks_per_second" else f"meta_{name}",
                                      value)
            window, window_start = [], time.perf_counter()
        if current % experiment.checkpoint_every == 0 or done:
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
        _write_json(metrics_path, final)
    with open(metrics_path) as f:
        return json.load(f)
