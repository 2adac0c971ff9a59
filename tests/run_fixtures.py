"""Workdirs and file systems for the entry points' tests: a saved run (config.gin and
one checkpoint, no training), a disk that fills while a named file is written, a file
system with no free space, a package that is not installed, the small evaluation
the tests run on them, a sweep's run folder in each state a report tells apart, and what
a process imported."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import sys

import pytest
import tensorflow as tf

from metalearn.training import build_experiment, parse_config


def imported_packages(importtime: str) -> set:
    """The top-level packages a process imported, from its ``-X importtime`` lines."""
    return {name.split(".")[0] for name in re.findall(
        r"^import time:\s*\d+ \|\s*\d+ \|\s*(\S+)\s*$", importtime, re.M)}


def saved_run(folder, gin_file="experiments/sinusoid/maml.gin", params=(), step=0):
    """A workdir with config.gin and one checkpoint (of ``step``; ``ckpt-1`` for step
    0), no training."""
    from metalearn.training.checkpoint import checkpoint_for
    os.makedirs(folder, exist_ok=True)
    parse_config([gin_file], ["mlp.hidden = (4,)", *params])
    experiment = build_experiment()
    with open(os.path.join(folder, "config.gin"), "w") as f:
        f.write(experiment.config)
    experiment.learner.meta_step.assign(step)
    checkpoint = checkpoint_for(experiment, experiment.learner.meta_step)
    tf.train.CheckpointManager(checkpoint, os.path.join(folder, "checkpoints"),
                               max_to_keep=3).save(checkpoint_number=step or 1)
    return os.path.join(folder, "checkpoints", f"ckpt-{step or 1}")


@contextlib.contextmanager
def full_disk(name: str):
    """Inside, writing a file called ``name`` fails as on a disk that fills: the bytes
    seem written, then the flush to disk (``os.fsync`` of ``files.write_text``'s
    temporary file) reports ``ENOSPC``. Other files are written as usual."""
    real_fsync = os.fsync

    def fsync(fd):
        target = os.readlink(f"/proc/self/fd/{fd}") if os.path.isdir("/proc/self/fd") \
            else ""
        if os.path.basename(target).startswith(f".{name}."):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_fsync(fd)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "fsync", fsync)
        yield


@contextlib.contextmanager
def no_free_space():
    """Inside, every file system reports 0 bytes free (``os.statvfs``)."""
    real = os.statvfs

    class Full:
        def __init__(self, found):
            self.f_frsize, self.f_blocks, self.f_bavail = found.f_frsize, found.f_blocks, 0

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "statvfs", lambda path: Full(real(path)))
        yield


@contextlib.contextmanager
def not_installed(package: str):
    """Inside, ``import package`` fails as when it is not installed (``ImportError``):
    its modules, and Gymnasium's MuJoCo environments already imported (which import
    ``mujoco`` when imported again), leave ``sys.modules`` until the end."""
    with pytest.MonkeyPatch.context() as patch:
        for name in list(sys.modules):
            if name == package or name.startswith(package + ".") or \
                    name.startswith("gymnasium.envs.mujoco"):
                patch.delitem(sys.modules, name)
        patch.setitem(sys.modules, package, None)
        try:
            yield
        finally:
            for name in list(sys.modules):  # imported inside, half-way: not kept
                if name.startswith("gymnasium.envs.mujoco"):
                    patch.delitem(sys.modules, name, raising=False)


EVALUATE_SMALL = ["evaluate.num_tasks = 4", "evaluate.batch_size = 2",
                  "evaluate.inner_steps = (1,)"]


def sweep_run(root, name, lr, seed, status="finished", evaluate=False, outcome=None):
    """A run folder of a sweep of 100 steps: ``finished`` (metrics.json at step 100),
    ``unfinished`` (config.gin and a checkpoint at step 40), ``failed`` (the same and
    the sweep's record of its process's error)."""
    workdir = os.path.join(root, name)
    os.makedirs(workdir)
    record = {"name": name, "bindings": {"GradientDescent.learning_rate": lr,
                                         "Runtime.seed": seed},
              "num_steps": 100, "evaluate": evaluate}
    if status == "failed":
        record["outcome"] = {"status": "failed", "exit_code": 1}
    with open(os.path.join(workdir, "sweep_run.json"), "w") as f:
        json.dump(record, f)
    with open(os.path.join(workdir, "config.gin"), "w") as f:
        f.write(f"GradientDescent.learning_rate = {lr}\nRuntime.seed = {seed}\n")
    if status == "finished":
        with open(os.path.join(workdir, "metrics.json"), "w") as f:
            json.dump({"loss": 1.0 + float(seed), "step": 100, "replicas": 1}, f)
        if evaluate:
            with open(os.path.join(workdir, "eval.json"), "w") as f:
                json.dump({"checkpoint_step": 100, "results": {
                    "1": {"loss": {"mean": 0.5, "ci95": 0.1, "std": 1.0}}}}, f)
    else:
        os.makedirs(os.path.join(workdir, "checkpoints"))
        with open(os.path.join(workdir, "checkpoints", "checkpoint"), "w") as f:
            f.write('model_checkpoint_path: "ckpt-40"\n')
    return workdir
