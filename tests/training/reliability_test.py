"""Lose no work, never report a wrong number: damaged checkpoints, a lost config.gin,
two processes on one workdir, an unwritable evaluation output, skipped steps, sweeps of
a key given twice, and checkpoints of other pieces (issue 18). The kill tests (SIGTERM,
a damaged latest checkpoint resumed by a new process) are in
tests/training/resume_test.py."""

import json
import re
import os
import shutil
import socket
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

import metalearn
from metalearn.adapters import GradientDescent
from metalearn.models import mlp
from metalearn.runs import validation
from metalearn.runs.lock import WorkdirLock, WorkdirLockedError
from metalearn.runs.workdir import Workdir
from metalearn.studies import sweeps
from metalearn.tasks import Sinusoid
from metalearn.training import (Experiment, Loop, build_experiment, evaluate, parse_config,
                                restore, train)
from metalearn.training.checkpoint import (DamagedCheckpointError, UnmatchedCheckpointError,
                                           find_checkpoint)
from metalearn.repository import ROOT
from tests import forked

# Its tests share a module-scoped fixture: one worker runs them (tests/conftest.py).
pytestmark = pytest.mark.xdist_group(__name__)

MAML = os.path.join(ROOT, "experiments", "sinusoid", "maml.gin")
METASGD = os.path.join(ROOT, "experiments", "sinusoid", "metasgd.gin")
SMALL = ["Loop.num_steps = 30", "Loop.log_every = 10",
         "Loop.checkpoint_every = 10", "Experiment.meta_batch_size = 2",
         "mlp.hidden = (4,)", "evaluate.num_tasks = 4", "evaluate.batch_size = 2",
         "evaluate.inner_steps = (1,)"]


def _train(workdir, gin_file=MAML, params=()):
    parse_config([gin_file], SMALL + list(params))
    return train(build_experiment(), str(workdir))


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished sinusoid run with checkpoints 10, 20 and 30."""
    import gin
    workdir = tmp_path_factory.mktemp("finished") / "run"
    _train(workdir)
    gin.clear_config()
    return workdir


def _copy(finished, tmp_path):
    workdir = tmp_path / "run"
    shutil.copytree(finished, workdir)
    return workdir


def _ckpt(workdir, name):
    return os.path.join(workdir, "checkpoints", name)


def _tensors(path):
    reader = tf.train.load_checkpoint(path)
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
            if name != "_CHECKPOINTABLE_OBJECT_GRAPH"}


def _flip_a_byte(path):
    with open(path, "r+b") as f:
        data = bytearray(f.read())
        data[len(data) // 2] ^= 0xFF
        f.seek(0)
        f.write(bytes(data))


DAMAGES = {  # name: (damage, newest intact step, what the skip message says)
    "missing index": (lambda w: os.remove(_ckpt(w, "ckpt-30.index")), 20,
                      "index file"),
    "truncated data": (lambda w: open(_ckpt(w, "ckpt-30.data-00000-of-00001"), "r+b")
                       .truncate(10), 20, "cannot be read"),
    "garbage data": (lambda w: open(_ckpt(w, "ckpt-30.data-00000-of-00001"), "wb")
                     .write(os.urandom(300)), 20, "cannot be read"),
    "checksum failure": (lambda w: _flip_a_byte(_ckpt(w, "ckpt-30.data-00000-of-00001")),
                         20, "cannot be read"),
    "empty state file": (lambda w: open(_ckpt(w, "checkpoint"), "w").close(), 30,
                         "state file is empty"),
    "garbled state file": (lambda w: open(_ckpt(w, "checkpoint"), "w").write("{garbled"),
                           30, "state file is garbled"),
}


@pytest.mark.parametrize("kind", sorted(DAMAGES))
def test_damaged_latest_checkpoint_falls_back_to_the_newest_intact_one(finished, tmp_path,
                                                                       kind):
    damage, intact, why = DAMAGES[kind]
    workdir = _copy(finished, tmp_path)
    damage(workdir)
    search = find_checkpoint(os.path.join(workdir, "checkpoints"))
    assert search.path.endswith(f"ckpt-{intact}")
    assert why in search.describe()
    experiment = restore(str(workdir))  # what evaluate uses too
    assert experiment.restored_step == intact
    assert experiment.restored_from.endswith(f"ckpt-{intact}")


def test_resume_from_a_damaged_latest_checkpoint_keeps_the_intact_ones(finished, tmp_path):
    workdir = _copy(finished, tmp_path)
    expected = _tensors(_ckpt(workdir, "ckpt-30"))
    os.remove(_ckpt(workdir, "ckpt-30.index"))
    with open(_ckpt(workdir, "checkpoint"), "w") as f:
        f.write("garbage")
    metrics = _train(workdir)  # resumes at 20 (not 0), trains 20 -> 30
    assert metrics["step"] == 30
    names = sorted(f for f in os.listdir(os.path.join(workdir, "checkpoints"))
                   if f.endswith(".index"))
    assert names == ["ckpt-10.index", "ckpt-20.index", "ckpt-30.index"]
    again = _tensors(_ckpt(workdir, "ckpt-30"))
    assert sorted(again) == sorted(expected)
    for name, value in expected.items():
        assert np.array_equal(again[name], value), name


def test_no_intact_checkpoint_stops_naming_the_files_and_deletes_nothing(finished,
                                                                        tmp_path):
    workdir = _copy(finished, tmp_path)
    for step in (10, 20, 30):
        os.remove(_ckpt(workdir, f"ckpt-{step}.index"))
    before = sorted(os.listdir(os.path.join(workdir, "checkpoints")))
    with pytest.raises(DamagedCheckpointError, match="ckpt-30.index is missing") as info:
        _train(workdir)
    assert "ckpt-10" in str(info.value) and "Nothing was deleted" in str(info.value)
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == before
    with pytest.raises(DamagedCheckpointError):
        restore(str(workdir))


def test_config_travels_in_the_checkpoint(finished, tmp_path):
    workdir = _copy(finished, tmp_path)
    os.remove(workdir / "config.gin")
    experiment = restore(str(workdir))  # the checkpoint's config
    assert experiment.restored_step == 30
    with pytest.raises(validation.ConfigChangeError,
                       match=r"the config its checkpoint carries \(config.gin is missing\)"
                       ) as info:
        _train(workdir, params=["GradientDescent.learning_rate = 0.5"])
    assert "GradientDescent.learning_rate: 0.01 in the workdir, 0.5 now" in str(info.value)
    assert not (workdir / "config.gin").exists()  # not rewritten
    _train(workdir, params=["Loop.num_steps = 40"])  # resumable change: goes ahead
    assert (workdir / "config.gin").exists()


# metalearn.runs.lock loaded by its path: the holder needs neither metalearn's package
# (Keras and TensorFlow, seconds of imports) nor anything else of it.
HOLD = textwrap.dedent("""
    import importlib.util, sys, time
    spec = importlib.util.spec_from_file_location("lock", sys.argv[2])
    lock = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lock)
    lock.WorkdirLock(sys.argv[1]).acquire()
    print("locked", flush=True)
    time.sleep(120)
""")


def test_a_second_process_on_a_workdir_stops_naming_the_holder(tmp_path):
    workdir = tmp_path / "run"
    holder = forked.Popen([sys.executable, "-c", HOLD, str(workdir),
                          os.path.join(ROOT, "metalearn", "runs", "lock.py")],
                          env=dict(os.environ, PYTHONPATH=ROOT), stdout=subprocess.PIPE,
                          text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(WorkdirLockedError) as info:
            _train(workdir, params=["Loop.num_steps = 2"])
        assert f"process {holder.pid} on host {socket.gethostname()!r}" in str(info.value)
        assert not (workdir / "checkpoints").exists()
    finally:
        holder.kill()
        holder.wait()
    # the holder died without releasing: its stale lock is taken over
    assert str(holder.pid) in (workdir / Workdir.TRAIN_LOCK).read_text()
    assert _train(workdir, params=["Loop.num_steps = 2"])["step"] == 2
    assert (workdir / Workdir.TRAIN_LOCK).read_text() == ""  # released


def test_one_process_one_lock(tmp_path):
    with WorkdirLock(str(tmp_path)):
        with pytest.raises(WorkdirLockedError, match=f"process {os.getpid()}"):
            WorkdirLock(str(tmp_path)).acquire()
    WorkdirLock(str(tmp_path)).acquire().release()


def test_evaluate_output_is_checked_before_the_work(finished, tmp_path, monkeypatch):
    from metalearn import evaluate as entry_point
    workdir = _copy(finished, tmp_path)
    report = entry_point.run(str(workdir), "results/eval.json")  # folder created
    assert json.loads((workdir / "results" / "eval.json").read_text())["num_tasks"] == 4
    monkeypatch.setattr("metalearn.training.restore", lambda *a, **k: pytest.fail("ran"))
    with pytest.raises(FileExistsError, match="cannot write the output .*nothing was run"):
        entry_point.run(str(workdir), "metrics.json/eval.json")  # a file as its folder
    with pytest.raises(ValueError, match="is a folder"):
        entry_point.run(str(workdir), "results")
    assert report["checkpoint_step"] == 30


def test_restore_names_the_objects_of_other_pieces(tmp_path):
    maml, metasgd = tmp_path / "maml", tmp_path / "metasgd"
    _train(maml, params=["Loop.num_steps = 2"])
    _train(metasgd, METASGD, params=["Loop.num_steps = 2"])
    with pytest.raises(UnmatchedCheckpointError,
                       match=r"the checkpoint holds \d+ variable\(s\) the config does not "
                       r"build \(adapter .*restoring would drop them"):
        restore(str(maml), checkpoint=str(metasgd / "checkpoints" / "ckpt-2"))
    with pytest.raises(UnmatchedCheckpointError,
                       match=r"the config builds \d+ variable\(s\) the checkpoint does not "
                       r"hold \(adapter variable .*keep their initial values"):
        restore(str(metasgd), checkpoint=str(maml / "checkpoints" / "ckpt-2"))


class AlwaysNaN(metalearn.Learner):
    def query_metrics(self, query_y, predictions):
        results = dict(super().query_metrics(query_y, predictions))
        results["loss"] = results["loss"] + np.nan
        return results


def _nan_experiment(**loop):
    keras.utils.set_random_seed(0)
    learner = AlwaysNaN(mlp(hidden=(4,)), adapter=GradientDescent(1, 0.01),
                        loss=keras.losses.MeanSquaredError())
    return Experiment(learner, Sinusoid(shots=5, queries=5), meta_batch_size=2,
                      loop=Loop(num_steps=8, log_every=4, checkpoint_every=4,
                                on_non_finite="skip", **loop))


def test_too_many_skipped_steps_fail_the_run(tmp_path):
    with pytest.raises(FloatingPointError, match=r"3 of 8 steps skipped .*more than "
                       r"Loop.max_skipped_fraction = 0.25"):
        train(_nan_experiment(), str(tmp_path / "a"))
    assert not (tmp_path / "a" / "metrics.json").exists()
    metrics = train(_nan_experiment(max_skipped_fraction=1.0), str(tmp_path / "b"))
    assert metrics["skipped_steps"] == 8
    with pytest.raises(ValueError, match="max_skipped_fraction must be a number in"):
        _nan_experiment(max_skipped_fraction=1.5)


@pytest.mark.parametrize("steps", [(1.9, 2.5), ("1",), (True,)])
def test_evaluate_rejects_inner_steps_that_are_not_whole(steps):
    parse_config([MAML], ["mlp.hidden = (4,)"])
    experiment = build_experiment()
    with pytest.raises(TypeError, match="evaluate.inner_steps must be whole numbers"):
        evaluate(experiment.learner, experiment.sampler, num_tasks=2, batch_size=2,
                 inner_steps=steps)


def test_a_sweep_axis_given_twice_is_an_error():
    with pytest.raises(sweeps.SweepError, match="--axis key 'Runtime.seed' is given twice"):
        sweeps.add_axes({}, ["Runtime.seed=[0, 1]", "Runtime.seed=[2]"])
    with pytest.raises(sweeps.SweepError, match="given twice"):
        sweeps.add_axes({}, ["Runtime.seed=[2]"], "--zip", taken=["Runtime.seed"])
    assert sweeps.add_axes({}, ["Runtime.seed=[0, 1]", "mlp.hidden=[(4,)]"]) == {
        "Runtime.seed": ["0", "1"], "mlp.hidden": ["(4,)"]}


def test_log_line_has_elapsed_time_and_eta(tmp_path, caplog):
    import logging
    caplog.set_level(logging.INFO)
    _train(tmp_path / "run", params=["Loop.num_steps = 4", "Loop.log_every = 2"])
    lines = [r.getMessage() for r in caplog.records if "meta-loss" in r.getMessage()]
    assert len(lines) == 3, lines
    # the first step says the run is alive at once (its trace took the time), then
    # every log_every steps
    assert re.fullmatch(r"step 1/4  meta-loss [\d.]+  the first step, \d+:\d\d:\d\d "
                        r"after the start \(tracing included\); the next line at step 2",
                        lines[0]), lines[0]
    assert all(re.search(r"elapsed \d+:\d\d:\d\d  ETA \d+:\d\d:\d\d$", line)
               for line in lines[1:]), lines
    assert lines[1].startswith("step 2/4") and lines[-1].endswith("ETA 0:00:00")


def test_tensorflow_info_chatter_is_filtered_ours_is_not():
    import logging
    quiet = metalearn._QuietTensorFlow()
    record = lambda path, level: logging.LogRecord("absl", level, path, 1, "m", (), None)
    tf_file = os.path.join(os.path.dirname(tf.__file__), "python", "checkpoint", "x.py")
    assert not quiet.filter(record(tf_file, logging.INFO))
    assert quiet.filter(record(tf_file, logging.WARNING))
    assert quiet.filter(record(os.path.join(ROOT, "metalearn", "training", "loop.py"),
                               logging.INFO))


# issue 32: resuming, restoring and evaluating a workdir (the library's cases)


def _snapshot(workdir):
    return {str(p.relative_to(workdir)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(workdir.rglob("*")) if p.is_file()}


def test_resuming_with_fewer_steps_than_the_checkpoint_is_an_error_before_any_write(
        finished, tmp_path):
    workdir = _copy(finished, tmp_path)
    before = _snapshot(workdir)
    with pytest.raises(validation.RunLengthError) as info:
        _train(workdir, params=["Loop.num_steps = 20"])
    message = str(info.value)
    assert "Loop.num_steps = 20" in message and "step 30" in message, message
    assert "ckpt-30" in message, message
    assert _snapshot(workdir) == before  # config.gin, metrics, checkpoints untouched
    # the same length: the finished run's metrics read back, as before
    assert _train(workdir)["step"] == 30


def test_restore_and_evaluate_refuse_a_config_edited_after_training(finished, tmp_path):
    """config.gin edited (an activation changed): restore and evaluate refuse, naming
    the binding and both values, as train does; nothing is written."""
    from metalearn import evaluate as entry_point
    workdir = _copy(finished, tmp_path)
    config = workdir / "config.gin"
    config.write_text(config.read_text().replace("mlp.activation = 'relu'",
                                                 "mlp.activation = 'tanh'"))
    for attempt in (lambda: restore(str(workdir)), lambda: entry_point.run(str(workdir))):
        with pytest.raises(validation.ConfigChangeError) as info:
            attempt()
        message = str(info.value)
        assert "mlp.activation: 'relu' in the checkpoint, 'tanh' in" in message, message
        assert str(config) in message, message
    assert not (workdir / "eval.json").exists()
    # what may change on resumption (evaluation settings, the loop) may change here too
    config.write_text(config.read_text().replace("'tanh'", "'relu'").replace(
        "evaluate.num_tasks = 4", "evaluate.num_tasks = 6"))
    assert restore(str(workdir)).restored_step == 30


def test_restore_into_another_architecture_names_the_layers_and_shapes(finished):
    with pytest.raises(UnmatchedCheckpointError) as info:
        restore(str(finished), gin_params=["mlp.hidden = (8,)"])
    message = str(info.value)
    assert "shape" in message and "(1, 4)" in message and "(1, 8)" in message, message
    assert "_CHECKPOINTABLE" not in message and ".ATTRIBUTES" not in message, message
    with pytest.raises(UnmatchedCheckpointError) as info:
        restore(str(finished), gin_params=["mlp.hidden = (4, 4)"])
    message = str(info.value)
    assert "layer" in message, message
    assert "learner/model/" not in message, message
