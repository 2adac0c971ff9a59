"""Sweeps: axes, names, validation before any run, parallel runs, kill and resume."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from metalearn.runs.workdir import Workdir
from metalearn.studies import sweeps
from metalearn.repository import ROOT
from tests import forked

# Its tests share a module-scoped fixture: one worker runs them (tests/conftest.py).
pytestmark = pytest.mark.xdist_group(__name__)

TINY = ["Loop.num_steps = 30", "Loop.log_every = 3",
        "Loop.checkpoint_every = 3", "Experiment.meta_batch_size = 2",
        "mlp.hidden = (4,)", "evaluate.num_tasks = 4", "evaluate.batch_size = 2",
        "evaluate.inner_steps = (1, 2)"]
AXES = ["--axis=GradientDescent.learning_rate=[0.01, 0.1]", "--axis=Runtime.seed=[0, 1]"]


def test_parse_axis_splits_at_top_level_commas():
    assert sweeps.parse_axis("mlp.hidden=[(40, 40), (8,)]") == ("mlp.hidden",
                                                                ["(40, 40)", "(8,)"])
    assert sweeps.parse_axis("Learner.adapter = [@GradientDescent(), 'a,b']") == (
        "Learner.adapter", ["@GradientDescent()", "'a,b'"])
    assert sweeps.parse_axis("scope/mlp.activation=['relu']") == (
        "scope/mlp.activation", ["'relu'"])
    for bad, message in [("mlp.hidden=(1, 2)", "must look like"),
                         ("mlp.hidden=[]", "no values"),
                         ("hidden=[1]", "not a gin binding key"),
                         ("mlp.hidden=[(1, 2]", "unbalanced")]:
        with pytest.raises(sweeps.SweepError, match=message):
            sweeps.parse_axis(bad)


def test_product_and_zipped_axes():
    spec = sweeps.SweepSpec(axes={"A.a": ["1", "2"], "B.b": ["3"]},
                            zipped=[{"C.c": ["4", "5"], "D.d": ["6", "7"]}])
    assert spec.combinations() == [
        (("A.a", "1"), ("B.b", "3"), ("C.c", "4"), ("D.d", "6")),
        (("A.a", "1"), ("B.b", "3"), ("C.c", "5"), ("D.d", "7")),
        (("A.a", "2"), ("B.b", "3"), ("C.c", "4"), ("D.d", "6")),
        (("A.a", "2"), ("B.b", "3"), ("C.c", "5"), ("D.d", "7"))]
    runs = spec.runs("/tmp/sweep")
    assert runs[0].workdir == "/tmp/sweep/A.a=1,B.b=3,C.c=4,D.d=6"
    assert sweeps.run_name([("mlp.hidden", "(40, 40)"), ("x.y", "'a/b'")]) == \
        "mlp.hidden=_40,_40_,x.y=_a_b"
    with pytest.raises(sweeps.SweepError, match="equal lengths"):
        sweeps.SweepSpec(zipped=[{"C.c": ["4", "5"], "D.d": ["6"]}]).combinations()
    with pytest.raises(sweeps.SweepError, match="given twice"):
        sweeps.SweepSpec(axes={"A.a": ["1"]}, zipped=[{"A.a": ["2"]}]).combinations()


def test_sweep_file_declares_axes(tmp_path):
    path = tmp_path / "s.gin"
    path.write_text("sweep.gin_files = ['sinusoid/maml.gin']\n"
                    "sweep.axes = {'GradientDescent.learning_rate': [0.01, 0.1],\n"
                    "              'Learner.adapter': ['@GradientDescent()']}\n"
                    "sweep.zipped = [{'mlp.hidden': [(8,), (4, 4)],"
                    " 'mlp.activation': ['relu', 'tanh']}]\n")
    spec = sweeps.load_sweep_file(str(path))
    assert spec.gin_files == ["sinusoid/maml.gin"]
    assert spec.axes == {"GradientDescent.learning_rate": ["0.01", "0.1"],
                         "Learner.adapter": ["@GradientDescent()"]}
    assert spec.zipped == [{"mlp.hidden": ["(8,)", "(4, 4)"],
                            "mlp.activation": ["'relu'", "'tanh'"]}]
    runs = sweeps.validate(spec, spec.runs(str(tmp_path / "root")))
    assert len(runs) == 4 and all(r.num_steps == 70000 for r in runs)


def test_bad_binding_fails_before_any_run_starts(tmp_path):
    spec = sweeps.SweepSpec(gin_files=["sinusoid/maml.gin"], gin_params=TINY,
                            axes={"GradientDescent.learning_rate": ["0.01", "0.1"],
                                  "mlp.activation": ["'relu'", "'no_such_activation'"]})
    root = tmp_path / "root"
    with pytest.raises(sweeps.SweepError,
                       match="binding \"mlp.activation = 'no_such_activation'\""):
        sweeps.run_sweep(spec, str(root))
    assert not root.exists()  # nothing ran, not even the good runs
    spec.axes = {"GradientDescent.learing_rate": ["0.01"]}
    with pytest.raises(sweeps.SweepError, match="GradientDescent.learing_rate"):
        sweeps.run_sweep(spec, str(root))


def test_a_sweep_checks_every_run_s_outputs_before_any_run_starts(tmp_path):
    spec = sweeps.SweepSpec(gin_files=["sinusoid/maml.gin"],
                            gin_params=["Loop.num_steps = 2"],
                            axes={"mlp.outputs": ["1", "3"]})
    root = tmp_path / "root"
    with pytest.raises(sweeps.SweepError) as info:
        sweeps.run_sweep(spec, str(root))
    assert "binding 'mlp.outputs = 3'" in str(info.value)
    assert "predicts shape [10, 3]" in str(info.value)
    assert not root.exists()


def _finished(root):
    return {name for name in os.listdir(root) if os.path.isfile(
        os.path.join(root, name, "metrics.json"))} if os.path.isdir(root) else set()


def _checkpointed_unfinished(root):
    return {name for name in os.listdir(root)
            if os.path.isfile(os.path.join(root, name, "checkpoints", "checkpoint"))
            and not os.path.isfile(os.path.join(root, name, "metrics.json"))} \
        if os.path.isdir(root) else set()


@pytest.fixture(scope="module")
def killed_and_resumed_sweep(tmp_path_factory):
    """A sweep of 2 rates x 2 seeds (4 runs, 2 at once, evaluated), killed midway with
    its processes (runs finished, runs checkpointed and unfinished), then started again."""
    root = str(tmp_path_factory.mktemp("sweep") / "root")
    env = dict(os.environ, PYTHONPATH=ROOT)
    command = [sys.executable, "-m", "metalearn.sweep", "--gin_file=sinusoid/maml.gin",
               *[f"--gin_param={p}" for p in TINY], *AXES, f"--root={root}",
               "--parallel=2", "--evaluate"]
    process = forked.Popen(command, env=env, cwd=ROOT, start_new_session=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.time() + 240
    while time.time() < deadline and process.poll() is None:
        if len(_finished(root)) >= 2 and _checkpointed_unfinished(root) or \
                len(_finished(root)) >= 3:
            break
        time.sleep(0.05)
    assert process.poll() is None, process.stdout.read().decode()[-3000:]
    os.killpg(process.pid, signal.SIGKILL)  # the sweep and its runs, as a dead machine
    process.wait()
    interrupted = _checkpointed_unfinished(root)
    before = {}
    for name in _finished(root):
        with open(os.path.join(root, name, "metrics.json")) as f:
            before[name] = (json.load(f), os.path.getmtime(os.path.join(root, name,
                                                                        "metrics.json")))
    time.sleep(0.5)  # let the killed processes release their locks
    spec = sweeps.SweepSpec(["sinusoid/maml.gin"], list(TINY), {
        "GradientDescent.learning_rate": ["0.01", "0.1"], "Runtime.seed": ["0", "1"]})
    results = sweeps.run_sweep(spec, root, parallel=2, evaluate=True, log=lambda _: None)
    return root, before, interrupted, results


def test_killed_sweep_resumes_without_rerunning_finished_runs(killed_and_resumed_sweep):
    root, before, interrupted, results = killed_and_resumed_sweep
    assert len(results) == 4 and all(r["status"] in ("done", "ran") for r in results)
    names = sorted(os.listdir(root))
    assert len([n for n in names if os.path.isdir(os.path.join(root, n))]) == 4
    assert "GradientDescent.learning_rate=0.1,Runtime.seed=1" in names
    for name in names:
        workdir = os.path.join(root, name)
        if not os.path.isdir(workdir):
            continue
        for file in ("config.gin", "operative_config.gin", "sweep_run.json", "eval.json",
                     "checkpoints/checkpoint"):
            assert os.path.isfile(os.path.join(workdir, file)), (name, file)
        with open(os.path.join(workdir, "metrics.json")) as f:
            assert json.load(f)["step"] == 30
        with open(os.path.join(workdir, "operative_config.gin")) as f:
            operative = f.read()
        bindings = dict(json.load(open(os.path.join(workdir, "sweep_run.json")))["bindings"])
        assert f"GradientDescent.learning_rate = {bindings['GradientDescent.learning_rate']}" \
            in operative
        with open(os.path.join(workdir, "eval.json")) as f:
            assert json.load(f)["checkpoint_step"] == 30
    assert before, "the sweep was killed before any run finished"
    for name, (metrics, mtime) in before.items():  # finished runs were not run again
        path = os.path.join(root, name, "metrics.json")
        assert os.path.getmtime(path) == mtime
        with open(path) as f:
            assert json.load(f) == metrics
        with open(os.path.join(root, name, "train.log")) as f:
            assert f.read().count("final metrics") == 1
    status = {r["name"]: r["status"] for r in results}
    for name in before:
        assert status[name] in ("done", "ran")  # "ran": only its evaluation was missing
    for name in interrupted:  # killed midway: resumed from its checkpoint
        with open(os.path.join(root, name, "train.log")) as f:
            assert "resumed from" in f.read(), name


def test_a_locked_run_is_not_started_twice(tmp_path):
    run = dict(name="r", bindings=[], workdir=str(tmp_path / "r"), num_steps=5,
               gin_files=[], gin_params=[], evaluate=False, eval_params=[])
    os.makedirs(run["workdir"])
    import fcntl
    with open(Workdir(run["workdir"]).sweep_lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        assert sweeps.execute_run(run)["status"] == "locked"


def _fake_run_process(files, exit_code):
    """A stand-in for a run's process: writes ``files`` into the workdir, then exits
    with ``exit_code`` (e.g. -15: killed by the sweep's SIGTERM after its last write)."""
    def call(args, log_path, pass_fds=()):
        workdir = os.path.dirname(log_path)
        for name, content in files.items():
            with open(os.path.join(workdir, name), "w") as f:
                json.dump(content, f)
        return exit_code
    return call


@pytest.mark.parametrize("evaluate", [False, True])
def test_a_run_whose_files_are_complete_is_finished_whatever_its_exit_code(
        tmp_path, monkeypatch, evaluate):
    from metalearn.studies import results
    run = dict(name="r", bindings=[], workdir=str(tmp_path / "r"), num_steps=5,
               gin_files=[], gin_params=[], evaluate=evaluate, eval_params=[])
    files = {"metrics.json": {"step": 5, "loss": 0.5}}
    if evaluate:
        files["eval.json"] = {"checkpoint_step": 5, "results": {"1": {"loss": 0.4}}}
    monkeypatch.setattr(sweeps, "_call", _fake_run_process(files, -15))
    result = sweeps.execute_run(run)
    assert result["status"] == "ran", result  # stopped after its results: finished
    with open(Workdir(run["workdir"]).sweep_run) as f:
        outcome = json.load(f)["outcome"]
    assert outcome == {"status": "ran", "exit_code": -15}
    assert results.run_state(run["workdir"]).status == "finished"
    assert sweeps.execute_run(run)["status"] == "done"  # and a rerun skips it


def test_a_run_whose_files_are_incomplete_failed_whatever_its_exit_code(tmp_path,
                                                                        monkeypatch):
    from metalearn.studies import results
    run = dict(name="r", bindings=[], workdir=str(tmp_path / "r"), num_steps=5,
               gin_files=[], gin_params=[], evaluate=True, eval_params=[])
    # trained, not evaluated, though the process says it succeeded
    monkeypatch.setattr(sweeps, "_call", _fake_run_process(
        {"metrics.json": {"step": 5, "loss": 0.5}}, 0))
    assert sweeps.execute_run(run)["status"] == "failed"
    state = results.run_state(run["workdir"])
    assert state.status == "failed" and "trained, not evaluated" in state.detail
    assert not results.is_finished(run["workdir"], 5, evaluate=True)
    assert results.is_finished(run["workdir"], 5, evaluate=False)


@pytest.mark.parametrize("where", ["axes", "zipped"])
def test_a_gin_param_on_a_swept_key_is_refused_before_any_run_starts(tmp_path, where):
    swept = {"GradientDescent.learning_rate": ["0.01", "0.1"]}
    spec = sweeps.SweepSpec(gin_files=["sinusoid/maml.gin"],
                            gin_params=TINY + ["GradientDescent.learning_rate=0.1"],
                            **({"axes": swept} if where == "axes" else {"zipped": [swept]}))
    root = tmp_path / "root"
    with pytest.raises(sweeps.SweepError) as info:
        sweeps.run_sweep(spec, str(root))
    message = str(info.value)
    assert "GradientDescent.learning_rate" in message
    assert "'GradientDescent.learning_rate=0.1'" in message  # the --gin_param
    assert "['0.01', '0.1']" in message  # the axis and its values
    assert not root.exists()  # nothing ran


def test_sweep_entry_point_refuses_a_gin_param_on_a_swept_key(tmp_path):
    root = tmp_path / "root"
    result = forked.run(
        [sys.executable, "-m", "metalearn.sweep", "--gin_file=sinusoid/maml.gin",
         *[f"--gin_param={p}" for p in TINY], "--gin_param=GradientDescent.learning_rate=0.1",
         "--axis=GradientDescent.learning_rate=[0.01, 0.1]", f"--root={root}"],
        env=dict(os.environ, PYTHONPATH=ROOT), cwd=str(tmp_path), capture_output=True,
        text=True, timeout=300)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "sweep error: GradientDescent.learning_rate is both swept and bound" in \
        result.stderr
    assert "--gin_param (or sweep.gin_params) 'GradientDescent.learning_rate=0.1'" in \
        result.stderr and "(--axis or sweep.axes)" in result.stderr
    assert not root.exists()
