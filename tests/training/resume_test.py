"""Crash safety and determinism, with real processes: training SIGKILLed after a step,
inside a checkpoint save and right after one, resumed each time, ends bit-identical to
an uninterrupted run (a supervised run, a meta-RL run whose rollouts happen inside
the compiled step, and one whose trajectories a MuJoCo simulator gives outside it);
and two runs of the same config and seed are identical."""

import json
import os
import resource
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from metalearn.repository import ROOT
from tests import forked

# Its tests share a module-scoped fixture: one worker runs them (tests/conftest.py).
pytestmark = pytest.mark.xdist_group(__name__)

SINUSOID = os.path.join(ROOT, "experiments", "sinusoid", "maml.gin")
# 40 steps; log windows of 8 and checkpoints every 5 do not line up, so resumed runs
# start mid-window (the window's sums must come back from the checkpoint).
PARAMS = ["Loop.num_steps = 40", "Loop.log_every = 8",
          "Loop.checkpoint_every = 5", "Experiment.meta_batch_size = 4",
          "mlp.hidden = (8,)"]
# Meta-RL on 2D navigation, rollouts in-graph (the environment inside the compiled
# step), shrunk to seconds: horizon 5, 2 rollouts of 2 tasks, 10 steps, checkpoints
# every 3 and log windows of 4 (the resumed run starts mid-window here too).
POINT_NAV = os.path.join(ROOT, "experiments", "rl", "point_nav_maml.gin")
RL_PARAMS = ["Loop.num_steps = 10", "Loop.log_every = 4", "Loop.checkpoint_every = 3",
             "Experiment.meta_batch_size = 2", "PolicyLearner.rollouts = 2",
             "PointNavigation.horizon = 5", "mlp.hidden = (8,)"]
# Meta-RL on HalfCheetah velocity (MuJoCo, a Python environment: trajectories collected
# outside the step by the sampler's collection), shrunk the same way.
HALF_CHEETAH = os.path.join(ROOT, "experiments", "rl", "half_cheetah_vel_maml.gin")
CHEETAH_PARAMS = ["Loop.num_steps = 5", "Loop.log_every = 2", "Loop.checkpoint_every = 2",
                  "Experiment.meta_batch_size = 2", "GymCollector.rollouts = 2",
                  "HalfCheetahVelocity.horizon = 10", "mlp.hidden = (8,)"]
KILLED = -9  # returncode of a process ended by SIGKILL
TERMINATED = 128 + 15  # metalearn.train's exit status after a SIGTERM (checkpoint saved)
OUT_OF_CPU = 128 + 24  # ... after SIGXCPU: its CPU-time limit reached (checkpoint saved)


def _start(workdir, crash_at=None, gin_file=SINUSOID, params=PARAMS):
    """``metalearn.train`` (through tests/crash_driver.py) on ``workdir``."""
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("CRASH_AT", None)
    if crash_at:
        env["CRASH_AT"] = crash_at
    command = [sys.executable, "-m", "tests.crash_driver", f"--gin_file={gin_file}",
               f"--workdir={workdir}", "--deterministic", "--alsologtostderr",
               *[f"--gin_param={p}" for p in params]]
    return forked.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT, text=True)


def _finish(process, expected_code):
    output, _ = process.communicate(timeout=300)
    assert process.returncode == expected_code, output[-3000:]
    return output


def _latest(workdir):
    return tf.train.latest_checkpoint(os.path.join(workdir, "checkpoints"))


def _tensors(workdir):
    """Every tensor of the latest checkpoint (weights, adapter state, optimizer slots
    and iteration count, step, the loop's progress) by name."""
    reader = tf.train.load_checkpoint(_latest(workdir))
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
            if name != "_CHECKPOINTABLE_OBJECT_GRAPH"}


def _assert_identical(expected, workdir):
    """Every checkpoint tensor and the final metrics of ``workdir`` equal ``expected``'s
    bit for bit."""
    uninterrupted, resumed = _tensors(expected), _tensors(workdir)
    assert sorted(uninterrupted) == sorted(resumed)
    for name, value in uninterrupted.items():
        assert np.array_equal(value, resumed[name]), name
    assert _metrics(workdir) == _metrics(expected)


def _metrics(workdir):
    with open(os.path.join(workdir, "metrics.json")) as f:
        metrics = json.load(f)
    metrics.pop("tasks_per_second")  # wall-clock time
    return metrics


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """An uninterrupted run, and a second run of the same config and seed killed three
    times, resumed each time; a copy of its workdir as the kill after ckpt-35 left it."""
    root = tmp_path_factory.mktemp("resume")
    workdirs = {name: str(root / name) for name in ("a", "killed", "after_save_35")}
    logs = {}
    first = _start(workdirs["a"])
    killed = workdirs["killed"]
    steps = {}
    for crash_at in ("step:13", "mid_save:25", "after_save:35", None):
        logs[crash_at] = _finish(_start(killed, crash_at), KILLED if crash_at else 0)
        steps[crash_at] = _latest(killed)
        if crash_at == "mid_save:25":  # the files of ckpt-25 were written, not recorded
            steps["written"] = sorted(os.listdir(os.path.join(killed, "checkpoints")))
        if crash_at == "after_save:35":
            shutil.copytree(killed, workdirs["after_save_35"])
        if crash_at == "step:13":
            logs["a"] = _finish(first, 0)  # ran beside the first killed process
    return workdirs, logs, steps


def test_killed_anywhere_resumes_bit_identical(runs):
    workdirs, logs, steps = runs
    assert steps["step:13"].endswith("ckpt-10")
    assert "resumed from" in logs["mid_save:25"] and "ckpt-10 at step 10" in logs["mid_save:25"]
    # killed inside the save of ckpt-25: its data and index are on disk, but the latest
    # checkpoint is still ckpt-20, and the resumed run starts there
    assert "ckpt-25.index" in steps["written"]
    assert any(f.startswith("ckpt-25.data") for f in steps["written"])
    assert steps["mid_save:25"].endswith("ckpt-20")
    assert "ckpt-20 at step 20" in logs["after_save:35"]
    assert steps["after_save:35"].endswith("ckpt-35")
    assert "ckpt-35 at step 35" in logs[None]

    _assert_identical(workdirs["a"], workdirs["killed"])
    assert any(name.startswith("optimizer/_iterations") for name in _tensors(workdirs["killed"]))
    assert _metrics(workdirs["a"])["step"] == 40


def test_sigterm_saves_a_checkpoint_and_resumes_bit_identical(runs, tmp_path):
    workdirs, _, _ = runs
    workdir = str(tmp_path / "terminated")
    output = _finish(_start(workdir, "sigterm:13"), TERMINATED)
    assert _latest(workdir).endswith("ckpt-13")  # not ckpt-10: no step lost
    assert "stopped by SIGTERM at step 13" in output
    assert "Traceback" not in output
    resumed = _finish(_start(workdir), 0)
    assert "ckpt-13 at step 13" in resumed
    uninterrupted, final = _tensors(workdirs["a"]), _tensors(workdir)
    assert sorted(uninterrupted) == sorted(final)
    for name, value in uninterrupted.items():
        if name.startswith("save_counter"):  # counts saves: one more, ckpt-13's
            assert final[name] == value + 1
            continue
        assert np.array_equal(value, final[name]), name
    assert _metrics(workdir) == _metrics(workdirs["a"])


def test_a_cpu_time_limit_ends_training_with_a_checkpoint(tmp_path):
    """A soft RLIMIT_CPU (``prlimit --cpu``) is a training budget in CPU seconds: past
    it the kernel sends SIGXCPU, the step under way finishes, its checkpoint is saved
    and the process exits 152; the run resumes from there."""
    workdir = str(tmp_path / "cpu_budget")
    params = PARAMS[1:] + ["Loop.num_steps = 1000000", "Loop.checkpoint_every = 1000000"]
    process = _start(workdir, params=params)
    lines = []
    try:
        for line in process.stdout:  # until the first step has run (import, trace)
            lines.append(line)
            if "the first step" in line:
                break
        assert "the first step" in "".join(lines), "".join(lines)[-3000:]
        # the budget spent, as `prlimit --pid PID --cpu=1:121` sets it: the kernel
        # sends SIGXCPU at its next tick, mid-training (no time spent waiting for it)
        resource.prlimit(process.pid, resource.RLIMIT_CPU, (1, 121))
        output = "".join(lines) + _finish(process, OUT_OF_CPU)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert "Traceback" not in output
    step = int(_latest(workdir).rsplit("-", 1)[1])
    assert step > 0 and f"stopped by SIGXCPU at step {step}" in output
    assert "resumed from" not in output


def test_damaged_latest_checkpoint_resumes_from_the_newest_intact_one(runs, tmp_path):
    workdirs, _, _ = runs
    workdir = str(tmp_path / "damaged")
    shutil.copytree(workdirs["after_save_35"], workdir)  # killed after ckpt-35: 25, 30, 35
    folder = os.path.join(workdir, "checkpoints")
    data = os.path.join(folder, "ckpt-35.data-00000-of-00001")
    with open(data, "r+b") as f:  # truncated, as by a full disk
        f.truncate(os.path.getsize(data) // 2)
    with open(os.path.join(folder, "checkpoint"), "w") as f:
        f.write("\x00garbled{")  # and the state file garbled
    resumed = _finish(_start(workdir), 0)
    assert "skipped" in resumed and "ckpt-35" in resumed and "garbled" in resumed
    assert "ckpt-30 at step 30" in resumed
    # intact ones were deleted only as newer ones replaced them (3 kept)
    assert sorted(f for f in os.listdir(folder) if f.endswith(".index")) == \
        ["ckpt-30.index", "ckpt-35.index", "ckpt-40.index"]
    _assert_identical(workdirs["a"], workdir)


def test_same_config_and_seed_give_identical_runs(runs):
    # The killed run is a second run of the same config and seed (in four processes, one
    # of them beside the first run): bit-identical to it (above) because the config asks
    # for determinism, which its operative config records.
    workdirs, _, _ = runs
    for name in ("a", "killed"):
        with open(os.path.join(workdirs[name], "operative_config.gin")) as f:
            assert "Runtime.deterministic = True" in f.read()
    a, b = _tensors(workdirs["a"]), _tensors(workdirs["killed"])
    for name, value in a.items():
        assert np.array_equal(value, b[name]), name
    assert _metrics(workdirs["a"]) == _metrics(workdirs["killed"])
    assert np.isfinite(_metrics(workdirs["a"])["loss"])


def _killed_and_resumed(tmp_path, gin_file, params, kill_after, resumed_from):
    """An uninterrupted run and one SIGKILLed after step ``kill_after``, resumed from
    checkpoint ``resumed_from``: every checkpoint tensor and the final metrics equal.
    Returns the resumed run's workdir."""
    run = dict(gin_file=gin_file, params=params)
    expected, killed = str(tmp_path / "a"), str(tmp_path / "killed")
    first = _start(expected, **run)
    _finish(_start(killed, f"step:{kill_after}", **run), KILLED)
    assert _latest(killed).endswith(f"ckpt-{resumed_from}")
    _finish(first, 0)
    resumed = _finish(_start(killed, **run), 0)
    assert f"ckpt-{resumed_from} at step {resumed_from}" in resumed
    _assert_identical(expected, killed)
    return killed


def test_in_graph_environment_run_killed_resumes_bit_identical(tmp_path):
    # Rollouts are sampled inside the step with seeds drawn from the task stream and the
    # inner step; a resumed run must draw the same trajectories as an uninterrupted one.
    killed = _killed_and_resumed(tmp_path, POINT_NAV, RL_PARAMS, 5, 3)
    assert any(name.startswith("optimizer/_iterations") for name in _tensors(killed))
    metrics = _metrics(killed)
    assert metrics["step"] == 10 and np.isfinite(metrics["return"])


def test_python_environment_run_killed_resumes_bit_identical(tmp_path):
    # The trajectories are collected in Python (MuJoCo) before each step, with the
    # weights of that step and seeds from the task stream: a run killed after step 3
    # resumes from ckpt-2 and collects what the uninterrupted run collected, so every
    # checkpoint tensor and the final metrics are the same bit for bit (MuJoCo is
    # deterministic given the seeds, on one machine).
    killed = _killed_and_resumed(tmp_path, HALF_CHEETAH, CHEETAH_PARAMS, 3, 2)
    metrics = _metrics(killed)
    assert metrics["step"] == 5 and np.isfinite(metrics["return"])
    assert os.listdir(os.path.join(killed, "train"))  # TensorBoard summaries


def test_sigterm_ends_a_run_hung_in_a_python_simulator_with_a_checkpoint(tmp_path):
    # The simulator hangs (an hour's sleep in its task reward) while the batch of step 4
    # is collected, with no time limit near: SIGTERM abandons the collection at once,
    # saves ckpt-3 (the step reached; the last periodic one was ckpt-2) and exits 143.
    import signal
    import time
    workdir = str(tmp_path / "hung")
    process = _start(workdir, "hang:3", gin_file=HALF_CHEETAH, params=CHEETAH_PARAMS)
    lines = []
    try:
        for line in process.stdout:  # until the simulator hangs (or the process ends)
            lines.append(line)
            if "SIMULATOR HUNG" in line:
                break
        assert "SIMULATOR HUNG" in "".join(lines), "".join(lines)[-3000:]
        start = time.monotonic()
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == TERMINATED, output[-3000:]
    assert time.monotonic() - start < 30
    assert "stopped by SIGTERM while collecting the batch of step 4" in output
    assert _latest(workdir).endswith("ckpt-3")


def test_after_a_cpu_limit_stop_the_repeated_sigxcpu_cannot_kill_the_ending_process():
    """Past the soft limit the kernel repeats SIGXCPU every second; once training has
    stopped on it, the process ends cleanly (metrics, exit status 152) however long
    that takes, so the repeats are ignored rather than left to their default action
    (which killed a loaded CI run's process with -24 after its checkpoint)."""
    import signal
    import time

    from metalearn.training import loop
    previous = signal.getsignal(signal.SIGXCPU)
    try:
        with loop._StopSignals() as stops:
            os.kill(os.getpid(), signal.SIGXCPU)
            for _ in range(100):  # the Python handler runs between bytecodes
                if stops.received is not None:
                    break
                time.sleep(0.01)
            assert stops.received == signal.SIGXCPU
        assert signal.getsignal(signal.SIGXCPU) is signal.SIG_IGN
        os.kill(os.getpid(), signal.SIGXCPU)  # a repeat: ignored, this process lives on
        with loop._StopSignals():  # a later stop without SIGXCPU restores what it found
            pass
        assert signal.getsignal(signal.SIGXCPU) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGXCPU, previous)
