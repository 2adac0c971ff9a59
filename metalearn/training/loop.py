"""The compiled meta-step and the training loop: checkpoints, summaries, logs."""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import tempfile
import threading
import time
from typing import Dict, Iterator, Optional, Tuple

import gin
import tensorflow as tf
from absl import logging

from metalearn.learners.learner import Learner
from metalearn.runs import files, modules, validation
from metalearn.runs.experiment import Experiment
from metalearn.training import distribute
from metalearn.runs.lock import WorkdirLock
from metalearn.runs.workdir import Workdir
from metalearn.training.checkpoint import (Progress, checkpoint_for,
                                           find_checkpoint, load, record_checkpoints,
                                           saved_config, saved_step)
from metalearn.outer.guards import NON_FINITE
from metalearn.tasks.base import Collection
from metalearn.training.step import make_meta_step


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
        f"update was not applied and {kept}. Loop.on_non_finite = 'skip' "
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
    the run used), ``modules.json`` (the user's modules the config was parsed with, if
    any: ``parse_config(modules=...)``, ``--module``), ``checkpoints/``, TensorBoard
    summaries under ``train/`` and ``metrics.json`` (the final metrics); the files
    atomically, and a run killed at any moment (even mid-checkpoint) resumes from its
    latest complete checkpoint to the same result as an uninterrupted run.

    A sampler whose batches are made outside the step
    (:meth:`metalearn.tasks.TaskSampler.collection`: a Python environment's
    trajectories, collected with the current weights, :class:`metalearn.rl.GymCollection`)
    has every batch made just before its step, from the episodes (seeds) the task
    stream gives that step: a resumed run collects what an uninterrupted one would. It
    runs on one replica. As the batch is a function of the episodes and the weights,
    nothing is lost by abandoning it: a stop signal during the collection (a hung
    simulator) ends it at once, and a collection that raises (a simulator's
    ``SimulatorError``, its time limit included) does so after a checkpoint of the
    step reached is saved.

    Every step checks that the meta-loss and every meta-gradient are finite (inside the
    compiled step: a step that is not applies no update); ``experiment.loop.on_non_finite``
    says whether such a step stops the run or is skipped (counted as
    ``skipped_steps`` in the summaries and results).

    Before anything else (and before any file in ``workdir`` is written) the run is
    checked by :func:`metalearn.runs.validation.check_before_training`: a workdir
    holding a run of another config raises unless ``allow_config_change``; bad tasks,
    data or model outputs raise.

    Returns:
      The final metrics: mean over the last logging window (or, with
      ``Loop.log_average="running"``, over all steps of the run) of each per-task
      metric over the finite steps, plus ``step``, ``tasks_per_second`` (of the last
      window) and, when skipping, ``skipped_steps``.

    Raises:
      metalearn.runs.validation.RunLengthError: ``Loop.num_steps`` is below the step of
        the checkpoint the run would resume from (a finished run resumed with the same
        length runs no step and returns its metrics); raised before anything is
        written.
      FloatingPointError: with ``on_non_finite="raise"``, the meta-loss or a
        meta-gradient became NaN or infinite; the message names the step and what was
        not finite. That step's update was not applied and the latest checkpoint is
        from before it.
    """
    checkpoint_dir = Workdir(workdir).checkpoints
    # Read only: the newest intact checkpoint, and the config it carries (which the
    # config-change check uses when config.gin is lost).
    search = find_checkpoint(checkpoint_dir)
    carried = saved_config(search.path) if search.path else None
    validation.check_run_length(experiment.loop.num_steps, search.path,
                                saved_step(search.path) if search.path else None)
    # --- validation before any work (issue 9); see runs/validation.py ---
    validation.check_before_training(experiment, workdir, allow_config_change,
                                     saved_config=carried)
    strategy = strategy or tf.distribute.get_strategy()
    chief = distribute.is_chief(strategy)
    lock = WorkdirLock(workdir).acquire() if chief else None
    collection = None
    try:
        collection = _collection(experiment, strategy)
        with _StopSignals() as stop:
            return _train(experiment, workdir, strategy, chief, checkpoint_dir, stop,
                          collection)
    finally:
        if collection is not None:
            collection.close()
        if lock is not None:
            lock.release()


def _collection(experiment: Experiment, strategy: tf.distribute.Strategy
                ) -> Optional[Collection]:
    """The sampler's :class:`~metalearn.tasks.base.Collection` for the learner (``None``:
    the sampled batches are what the step takes); it collects in this process, on the
    whole meta-batch, so one replica only."""
    collection = experiment.sampler.collection(experiment.learner)
    if collection is not None and strategy.num_replicas_in_sync > 1:
        collection.close()
        raise ValueError(
            f"{type(experiment.sampler).__name__} makes its batches outside the step "
            f"(collected in this process: TaskSampler.collection), on one replica, not "
            f"{strategy.num_replicas_in_sync}: train it without a strategy "
            "(--strategy=default)")
    return collection


class TrainingInterrupted(Exception):
    """Training stopped on a signal (``SIGTERM``, ``SIGINT``, or ``SIGXCPU``: the
    process reached its CPU-time limit) after saving a checkpoint of the step it had
    reached.

    Attributes:
      signal_number: the signal.
      step: the step saved.
      checkpoint: the checkpoint written.
    """

    def __init__(self, signal_number: int, step: int, checkpoint: Optional[str]):
        self.signal_number, self.step, self.checkpoint = signal_number, step, checkpoint
        super().__init__(f"stopped by {signal.Signals(signal_number).name} at step {step}; "
                         f"checkpoint {checkpoint} saved: rerun the same command to resume")


class _StopNow(BaseException):
    """A stop signal inside :meth:`_StopSignals.interruptible` work (a ``BaseException``,
    so that no ``except Exception`` in a simulator swallows it)."""


class _StopSignals:
    """While active (main thread only), ``SIGTERM``, ``SIGXCPU`` and the first ``SIGINT``
    only set ``received``: the loop saves a checkpoint after the step it is in and stops.
    A second ``SIGINT`` interrupts at once (``KeyboardInterrupt``). Inside
    :meth:`interruptible` work (the collection of a batch outside the step, which a
    hung simulator can make endless) a stop signal also raises :class:`_StopNow` at once.

    ``SIGXCPU`` is what the kernel sends a process past its soft CPU-time limit
    (``prlimit --cpu=SOFT:HARD``, ``resource.RLIMIT_CPU``), then again every second until
    the hard limit kills it: a budget of CPU seconds, which other jobs on the machine do
    not shrink as they shrink a wall-clock budget (``timeout``). Leave the hard limit
    room for one step and a checkpoint."""

    SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGXCPU")
                    if hasattr(signal, name))

    def __init__(self):
        self.received: Optional[int] = None
        self._previous = {}
        self._interruptible = False

    def _handle(self, number, frame):
        if self.received is not None and number == signal.SIGINT:
            raise KeyboardInterrupt
        self.received = number
        if self._interruptible:
            self._interruptible = False  # raised once
            logging.warning("received %s while collecting the next batch: abandoning it, "
                            "saving a checkpoint of the step reached, then stopping",
                            signal.Signals(number).name)
            raise _StopNow()
        logging.warning("received %s: saving a checkpoint after this step, then stopping",
                        signal.Signals(number).name)

    @contextlib.contextmanager
    def interruptible(self) -> Iterator[None]:
        """Work that a stop signal ends at once (:class:`_StopNow`): work that changes no
        state the checkpoint holds, and is redone on resume. (A signal handler runs
        between Python bytecodes: code in a C extension that never returns to Python
        is not interrupted.)"""
        self._interruptible = True
        try:
            yield
        finally:
            self._interruptible = False

    def __enter__(self) -> "_StopSignals":
        if threading.current_thread() is threading.main_thread():
            for number in self.SIGNALS:
                self._previous[number] = signal.signal(number, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for number, handler in self._previous.items():
            if number == getattr(signal, "SIGXCPU", None) and self.received == number:
                # past the soft CPU limit the kernel repeats SIGXCPU every second, whose
                # default action would kill the process while it ends cleanly (metrics,
                # exit status 152); the hard limit still bounds it
                handler = signal.SIG_IGN
            signal.signal(number, handler)


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _train(experiment: Experiment, workdir: str, strategy: tf.distribute.Strategy,
           chief: bool, checkpoint_dir: str, stop: _StopSignals,
           collection: Optional[Collection]) -> Dict[str, float]:
    learner = experiment.learner
    skip = experiment.loop.on_non_finite == "skip"
    distribute.tasks_per_replica(experiment.meta_batch_size, strategy)  # fail early
    meta_step = make_meta_step(learner, experiment.outer_rule, experiment.formulation,
                               experiment.runtime.jit_compile, skip_non_finite=True,
                               strategy=strategy)
    step = learner.meta_step  # advanced by meta_step(); saved as "step"
    progress = Progress()
    checkpoint = checkpoint_for(experiment, step, progress)
    # Every worker takes part in saving (collectives); only the chief's copy is kept.
    write_dir = checkpoint_dir if chief else tempfile.mkdtemp(prefix="metalearn_ckpt_")
    search = find_checkpoint(checkpoint_dir)
    if search.skipped or search.state_problem not in (None, "missing"):
        logging.warning("checkpoints in %s: %s; resuming from %s", checkpoint_dir,
                        search.describe(), search.path)
        if chief and search.path:
            # The manager rotates what the state file records: record the intact ones
            # only, so that nothing is deleted before a newer intact one replaces it.
            record_checkpoints(checkpoint_dir, search.intact)
    if search.path:
        load(experiment, step, search.path, progress, into=checkpoint)
        checkpoint.config.assign(experiment.config)  # this run's, from now on
        progress.load(search.path)
        logging.info("resumed from %s at step %d", search.path, int(step.numpy()))
    elif experiment.warm_start is not None:  # a new run: start from another run's weights
        experiment.warm_start(experiment.learner)
    # The manager writes a checkpoint's files, then records it in the `checkpoint`
    # state file (itself replaced atomically): a save cut short is never the latest.
    manager = tf.train.CheckpointManager(checkpoint, write_dir,
                                         max_to_keep=experiment.loop.keep_checkpoints)
    start = int(step.numpy())
    if chief:
        os.makedirs(workdir, exist_ok=True)
        # config.gin: every binding of the run (evaluation's too), parsed by restore();
        # operative_config.gin: the values the run actually used, defaults included.
        files.write_text(Workdir(workdir).config,
                         experiment.config or gin.config_str())
        files.write_text(Workdir(workdir).operative_config,
                         gin.operative_config_str())
        modules.write_record(workdir)  # the user's modules the config binds (--module)
    writer = tf.summary.create_file_writer(Workdir(workdir).summaries) if chief else \
        tf.summary.create_noop_writer()
    episodes = distribute.episode_stream(
        strategy, experiment.sampler, experiment.meta_batch_size, seed=experiment.seed,
        split="train", start_step=start, num_steps=max(experiment.loop.num_steps - start, 0))
    running = experiment.loop.log_average == "running"
    final: Dict[str, float] = {}
    timed_steps, window_start = 0, time.perf_counter()
    run_start, current = time.perf_counter(), start
    # More skipped steps than this and the run fails: its numbers would not mean much.
    max_skipped = experiment.loop.max_skipped_fraction * experiment.loop.num_steps
    saved_at: Optional[Tuple[int, str]] = (start, search.path) if search.path else None

    def save_reached() -> Optional[str]:
        """A checkpoint of the step reached (the one saved already if it is that)."""
        nonlocal saved_at
        if saved_at is None or saved_at[0] != current:
            progress.store()
            saved_at = (current, manager.save(checkpoint_number=current))
        writer.flush()
        return saved_at[1]

    for batch in episodes:
        if collection is not None:  # made outside the step with the current weights
            # a function of the episodes and the weights: abandoning it loses nothing
            try:
                with stop.interruptible():
                    batch = collection(batch)
            except _StopNow:
                saved = save_reached()
                logging.warning("stopped by %s while collecting the batch of step %d: "
                                "saved %s; rerun the same command to resume",
                                signal.Signals(stop.received).name, current + 1, saved)
                raise TrainingInterrupted(stop.received, current, saved) from None
            except Exception:
                saved = save_reached()
                logging.error("collecting the batch of step %d failed; the run reached "
                              "step %d, saved in %s", current + 1, current, saved)
                raise
        metrics = meta_step(batch)
        flags = metrics.pop(NON_FINITE).numpy()
        current = int(step.numpy())
        timed_steps += 1
        if flags.any():
            if not skip:
                raise _non_finite_error(flags, current, learner, checkpoint_dir)
            progress.skipped_steps += 1
            logging.warning("skipped step %d (its update was not applied; %d of %d steps "
                            "skipped so far, at most %.0f%% allowed by "
                            "Loop.max_skipped_fraction): %s", current,
                            progress.skipped_steps, experiment.loop.num_steps,
                            100 * experiment.loop.max_skipped_fraction,
                            _non_finite_error(flags, current, learner, checkpoint_dir))
            if progress.skipped_steps > max_skipped:
                raise FloatingPointError(
                    f"{progress.skipped_steps} of {experiment.loop.num_steps} steps skipped "
                    f"(non-finite meta-loss or meta-gradient; the latest at step "
                    f"{current}): more than Loop.max_skipped_fraction = "
                    f"{experiment.loop.max_skipped_fraction} of the run, whose metrics would "
                    "not mean much. Lower the learning rates, or raise "
                    "Loop.max_skipped_fraction to carry on.")
        else:
            progress.add({name: float(value) for name, value in metrics.items()})
        done = current >= experiment.loop.num_steps
        if current == start + 1 and current % experiment.loop.log_every and not done:
            # a sign of life at once (the step's trace took the time): the window's
            # figures and summaries stay every log_every steps'
            logging.info("step %d/%d  meta-loss %.5f  the first step, %s after the start "
                         "(tracing included); the next line at step %d", current,
                         experiment.loop.num_steps, float(metrics.get("loss", math.nan)),
                         _duration(time.perf_counter() - run_start),
                         min(experiment.loop.num_steps, (current // experiment.loop.log_every
                                                         + 1) * experiment.loop.log_every))
        if current % experiment.loop.log_every == 0 or done:
            elapsed = time.perf_counter() - window_start
            final = progress.means(running)
            final["tasks_per_second"] = timed_steps * experiment.meta_batch_size / elapsed
            if skip:
                final["skipped_steps"] = progress.skipped_steps
            so_far = time.perf_counter() - run_start
            per_step = so_far / max(current - start, 1)
            logging.info("step %d/%d  meta-loss %.5f%s  %s  %.0f tasks/s  elapsed %s  "
                         "ETA %s", current, experiment.loop.num_steps,
                         final.get("loss", math.nan), " (running mean)" if running else "",
                         "  ".join(f"{k} {v:.4f}" for k, v in final.items()
                                   if k not in ("loss", "tasks_per_second")),
                         final["tasks_per_second"], _duration(so_far),
                         _duration(per_step * (experiment.loop.num_steps - current)))
            with writer.as_default(step=current):
                for name, value in final.items():
                    tf.summary.scalar(name if name in ("tasks_per_second", "skipped_steps")
                                      else f"meta_{name}", value)
            progress.end_window()
            timed_steps, window_start = 0, time.perf_counter()
        if current % experiment.loop.checkpoint_every == 0 or done or stop.received:
            saved = save_reached()  # the summaries flushed with it
            if stop.received and not done:
                logging.warning("stopped by %s at step %d: saved %s; rerun the same "
                                "command to resume", signal.Signals(stop.received).name,
                                current, saved)
                raise TrainingInterrupted(stop.received, current, saved)
        if done:
            # Never ask the stream for its end: reaching it waited ~20 s after a
            # 3,000-step sinusoid run (the silence before "final metrics").
            break
    writer.flush()
    if not chief:
        shutil.rmtree(write_dir, ignore_errors=True)
        final["step"] = int(step.numpy())
        return final
    metrics_path = Workdir(workdir).metrics
    if start < experiment.loop.num_steps or not os.path.exists(metrics_path):
        final["step"] = int(step.numpy())
        final["replicas"] = strategy.num_replicas_in_sync
        files.write_json_results(metrics_path, final, json.dumps(final, sort_keys=True),
                                 "final meta-training metrics")  # logged first, whole
    return files.read_json(metrics_path, "the final metrics of the run (a finished run "
                           "resumed runs no step and reads them back)")
