"""Training loop and entry points: checkpoints, resuming, evaluation, configs."""

import glob
import json
import os
import re
import subprocess
import sys

import gin
import numpy as np
import pytest
import tensorflow as tf

import metalearn
from metalearn.training import build_experiment, evaluate, parse_config, restore, train
from metalearn.repository import ROOT
from tests import forked

SINUSOID = os.path.join(ROOT, "experiments", "sinusoid", "maml.gin")
SMALL = ["Loop.num_steps = 20", "Loop.log_every = 5",
         "Loop.checkpoint_every = 5", "Experiment.meta_batch_size = 4",
         "mlp.hidden = (8,)", "evaluate.num_tasks = 10", "evaluate.batch_size = 5"]

# Its tests share a module-scoped fixture: one worker runs them (tests/conftest.py).
pytestmark = pytest.mark.xdist_group(__name__)


def _final_weights(workdir):
    experiment = restore(workdir)
    return [v.numpy() for v in experiment.learner.meta_variables], experiment


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    """One uninterrupted run of SMALL: the run the next test inspects (it only reads it),
    the reference that the resumed run and a second run of the config must equal, and
    the run the command-line evaluation evaluates (it adds only its eval_5shot files)."""
    workdir = str(tmp_path_factory.mktemp("small") / "run")
    parse_config([SINUSOID], SMALL)
    metrics = train(build_experiment(), workdir)
    gin.clear_config()
    return workdir, metrics


def test_train_writes_everything_and_evaluates(small_run):
    workdir, metrics = small_run
    assert metrics["step"] == 20 and np.isfinite(metrics["loss"])
    for name in ("config.gin", "operative_config.gin", "metrics.json"):
        assert os.path.isfile(os.path.join(workdir, name)), name
    assert glob.glob(os.path.join(workdir, "train", "events.out.tfevents.*"))
    assert tf.train.latest_checkpoint(os.path.join(workdir, "checkpoints")).endswith("-20")

    experiment = restore(workdir, gin_params=["Sinusoid.shots = 5"])
    assert experiment.restored_step == 20 and experiment.sampler.shots == 5
    report = evaluate(experiment.learner, experiment.sampler)
    assert report["num_tasks"] == 10 and sorted(report["results"]) == ["1", "10", "5"]
    for steps in report["results"].values():
        assert steps["loss"]["ci95"] > 0


def test_killed_run_resumes_to_the_same_weights(small_run, tmp_path):
    uninterrupted, interrupted = small_run[0], str(tmp_path / "b")
    parse_config([SINUSOID], SMALL + ["Loop.num_steps = 10"])  # "dies" at step 10
    train(build_experiment(), interrupted)
    parse_config([SINUSOID], SMALL)
    train(build_experiment(), interrupted)                            # restarted
    with open(os.path.join(interrupted, "metrics.json")) as f:
        assert json.load(f)["step"] == 20
    for a, b in zip(_final_weights(uninterrupted)[0], _final_weights(interrupted)[0]):
        np.testing.assert_array_equal(a, b)


def test_same_config_same_result(small_run, tmp_path):
    parse_config([SINUSOID], SMALL)  # a second run, in this process, after other tests
    again = train(build_experiment(), str(tmp_path / "b"))
    assert again["loss"] == small_run[1]["loss"]
    assert again["step"] == small_run[1]["step"] == 20


def test_restore_rejects_a_non_run_directory(tmp_path):
    with pytest.raises(FileNotFoundError,
                       match="is not a run directory: it has neither config.gin"):
        restore(str(tmp_path))


def test_command_line_evaluate(small_run):
    # metalearn.evaluate on a SMALL run. The command line's training, metalearn.train's
    # main, runs in tests/training/resume_test.py (tests/crash_driver.py runs that main
    # as `python -m metalearn.train` does, on sinusoid runs killed and resumed) and in
    # distribute_test.py (`python -m metalearn.train` itself, multi-worker).
    workdir = small_run[0]
    env = dict(os.environ, PYTHONPATH=ROOT)
    evaluated = forked.run(
        [sys.executable, "-m", "metalearn.evaluate", f"--workdir={workdir}",
         "--gin_param=Sinusoid.shots=5", "--output=eval_5shot.json"],
        check=True, env=env, cwd=ROOT, capture_output=True, text=True)
    with open(os.path.join(workdir, "eval_5shot.json")) as f:
        report = json.load(f)
    assert report["checkpoint_step"] == 20 and "10" in report["results"]
    assert report["tasks"] == {"sampler": "Sinusoid", "shots": 5, "queries": 10}
    # it says what it evaluated; the per-task values are in the file, not the output
    assert evaluated.stdout.startswith("Sinusoid, 5-shot, 10 queries per task: "
                                       f"{report['num_tasks']} test tasks (seed 0)")
    assert "per_task" not in evaluated.stdout + evaluated.stderr
    assert os.path.join(workdir, "eval_5shot.json") in evaluated.stdout
    assert os.listdir(os.path.join(workdir, "eval", "eval_5shot"))  # TensorBoard


def test_command_line_names_a_missing_gin_file(tmp_path):
    result = forked.run(
        [sys.executable, "-m", "metalearn.train", "--gin_file=nope/missing.gin",
         f"--workdir={tmp_path}"], env=dict(os.environ, PYTHONPATH=ROOT), cwd=ROOT,
        capture_output=True, text=True)
    assert result.returncode != 0 and "nope/missing.gin" in result.stderr


def _train_cli(tmp_path, *args) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3")
    return forked.run([sys.executable, "-m", "metalearn.train", *args],
                      cwd=str(tmp_path), env=env, capture_output=True, text=True,
                      timeout=300)


def test_train_entry_point_names_the_gin_file_and_line(tmp_path):
    bad = tmp_path / "typo.gin"
    bad.write_text("include 'experiments/sinusoid/maml.gin'\n\nExperiment.num_stepz = 10\n")
    result = _train_cli(tmp_path, f"--gin_file={bad}", f"--workdir={tmp_path / 'run'}")
    assert result.returncode != 0
    assert "doesn't have a parameter named 'num_stepz'" in result.stderr
    assert f'In file "{bad}", line 3' in result.stderr
    assert not (tmp_path / "run").exists()

    workdir = tmp_path / "old"
    workdir.mkdir()
    parse_config(["experiments/sinusoid/maml.gin"], ["Sinusoid.shots = 5"])
    (workdir / "config.gin").write_text(build_experiment().config)
    result = _train_cli(tmp_path, "--gin_file=sinusoid/maml.gin", f"--workdir={workdir}")
    assert result.returncode != 0
    assert "ConfigChangeError" in result.stderr
    assert "Sinusoid.shots: 5 in the workdir, 10 now" in result.stderr
    assert "--allow_config_change" in result.stderr


# experiments/ by role (experiments/README.md): setups/, learners/ and budgets/ are
# included by the runnable files, each of which is built here (budgets/smoke.gin, given
# after a runnable file, runs in tests/benchmark_configs_test.py); sweeps/ hold sweep
# files. tests/experiments_test.py checks the layout.
ROLES = ("setups", "learners", "budgets")
EXPERIMENT_FILES = sorted(glob.glob(os.path.join(ROOT, "experiments", "**", "*.gin"),
                                     recursive=True))
SWEEPS_DIR = os.path.join(ROOT, "experiments", "sweeps")


def _role(path):
    top = os.path.relpath(path, os.path.join(ROOT, "experiments")).split(os.sep)[0]
    return top if top in ROLES + ("sweeps",) else "runnable"


RUNNABLE_FILES = [p for p in EXPERIMENT_FILES if _role(p) == "runnable"]


def _header(path):
    """The leading comment block of a gin file."""
    lines = []
    with open(path) as f:
        for line in f:
            if not line.startswith("#"):
                break
            lines.append(line)
    return "".join(lines)


def _included(path):
    """The files ``path`` includes, transitively (as their paths from the root)."""
    found = []
    with open(path) as f:
        for name in re.findall(r"^include '([^']+)'", f.read(), flags=re.M):
            found += [name] + _included(os.path.join(ROOT, name))
    return found


@pytest.mark.parametrize("path", RUNNABLE_FILES, ids=lambda p: os.path.relpath(p, ROOT))
def test_every_experiment_config_builds(path):
    header = _header(path)
    assert header, "gin files start with a header comment"
    if "Not run on its own" in header:  # a base that the files beside it include
        name = os.path.relpath(path, ROOT)
        assert any(f"include '{name}'" in open(p).read() for p in EXPERIMENT_FILES), \
            f"{name} says it is not run on its own, but no experiment includes it"
        return
    assert "python -m metalearn.train" in header or "python benchmarks/" in header, \
        "the header gives the command that runs the file (python -m metalearn.train ..., " \
        "or a benchmarks/ script for a loop metalearn.train does not run)"
    parse_config([path], ["Loop.num_steps = 1"])
    experiment = build_experiment()
    assert isinstance(experiment.learner, metalearn.Learner)
    gin.clear_config()


def test_every_setup_learner_and_budget_is_built_by_a_runnable_file():
    used = {name for path in RUNNABLE_FILES for name in _included(path)}
    for path in EXPERIMENT_FILES:
        name = os.path.relpath(path, ROOT)
        if _role(path) in ROLES and name != "experiments/budgets/smoke.gin":
            assert _header(path), f"{name} starts with a header comment"
            assert name in used, f"no runnable file includes {name}: nothing builds it"


@pytest.mark.parametrize("path", [p for p in EXPERIMENT_FILES
                                  if p.startswith(SWEEPS_DIR + os.sep)],
                         ids=lambda p: os.path.relpath(p, ROOT))
def test_every_sweep_file_builds_every_run(path, tmp_path):
    from metalearn.studies import sweeps
    assert "python -m metalearn.sweep" in _header(path), \
        "a sweep file's header gives the command that runs it"
    spec = sweeps.load_sweep_file(path)
    runs = sweeps.validate(spec, spec.runs(str(tmp_path)))
    assert len(runs) >= 2 and all(run.num_steps > 0 for run in runs)


def test_mean_and_interval():
    result = metalearn.training.mean_and_interval([1.0, 2.0, 3.0, 4.0])
    assert result["mean"] == 2.5
    np.testing.assert_allclose(result["ci95"], 1.959963984540054 * np.std([1, 2, 3, 4],
                                                                          ddof=1) / 2)
    with pytest.raises(ValueError, match="at least 2 values"):
        metalearn.training.mean_and_interval([1.0])
