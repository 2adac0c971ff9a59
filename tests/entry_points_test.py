"""The command lines as a newcomer meets them: ``--help`` lists the flags a user needs,
``--gin_file`` resolves from any working directory as gin's includes do, TensorFlow's
GPU probe stays out of their output, and evaluation says what it evaluated."""

import glob
import os
import re
import subprocess
import sys

import gin
import pytest

from metalearn import _quiet
from metalearn.flags import gin_file_candidates, resolve_gin_files
from metalearn.repository import ROOT
from metalearn.training.evaluation import report_figures, task_description
from tests.run_fixtures import imported_packages

pytestmark = pytest.mark.xdist_group(__name__)

# Every module under metalearn/ that runs as `python -m metalearn.<name>`.
ENTRY_POINTS = sorted(
    os.path.basename(p)[:-3] for p in glob.glob(os.path.join(ROOT, "metalearn", "*.py"))
    if re.search(r"^if __name__ == \"__main__\":\n\s+app\.run\(", open(p).read(), re.M))
GIN_FLAGS = ("--gin_file", "--gin_param", "--module", "--deterministic")
# report reads finished runs' files: it parses no gin, so it has no gin flags
# export restores a run as evaluate does (gin flags), and has nothing to make deterministic
OWN_FLAGS = {"report": ("--output_dir", "--metrics", "--paired"),
             "export": ("--gin_file", "--gin_param", "--module", "--workdir", "--output",
                        "--format", "--inner_steps", "--version", "--overwrite",
                        "--support_size", "--query_size", "--select_tf_ops")}


@pytest.fixture(scope="module")
def helps():
    """Each entry point's ``--help`` (stdout, stderr, exit code), the processes run at
    once, from a folder outside the checkout."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)  # as a newcomer's shell has it
    procs = {name: subprocess.Popen([sys.executable, "-m", f"metalearn.{name}", "--help"],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, env=env, cwd=os.path.dirname(ROOT))
             for name in ENTRY_POINTS}
    return {name: (*proc.communicate(timeout=600), proc.returncode)
            for name, proc in procs.items()}


def test_the_entry_points_are_found():
    assert {"train", "evaluate", "sweep", "report", "export"} <= set(ENTRY_POINTS), \
        ENTRY_POINTS


@pytest.mark.parametrize("name", ENTRY_POINTS)
def test_help_lists_the_flags_a_user_needs(helps, name):
    out, err, _ = helps[name]  # absl's --help exits with 1
    help_text = out + err
    listed = set(re.findall(r"^\s+--(?:\[no\])?(\w+)", help_text, re.M))
    wanted = OWN_FLAGS.get(name, GIN_FLAGS)
    assert {f[2:] for f in wanted} <= listed, (name, sorted(listed))
    assert "--helpfull" in help_text


# What each entry point answers before it does any work: absl's exit status 1 and a
# line of its text; TensorFlow is not imported for any of them.
ANSWERS_BEFORE_WORK = [
    *[(name, ["--help"], "Try --helpfull") for name in ("train", "evaluate", "sweep",
                                                         "report", "export")],
    *[(name, ["--no_such_flag"], "Unknown command line flag 'no_such_flag'")
      for name in ("train", "evaluate", "sweep", "report", "export")],
    ("train", [], "Flag --workdir must have a value other than None"),
    ("evaluate", [], "Flag --workdir must have a value other than None"),
    ("export", ["--output=out"], "Flag --workdir must have a value other than None"),
    ("export", ["--workdir=runs/x", "--output=out", "--support_size=5"],
     "--support_size and --query_size apply to --format=litert and onnx"),
    ("train", ["--workdir=runs/x"], "give at least one --gin_file"),
    ("sweep", ["--gin_file=experiments/sinusoid/maml.gin"], "give --root"),
    ("report", [], "give run directories or sweep roots")]


@pytest.mark.parametrize("name, args, answer", ANSWERS_BEFORE_WORK,
                         ids=[f"{n} {' '.join(a) or '(no flags)'}"
                              for n, a, _ in ANSWERS_BEFORE_WORK])
def test_answers_before_work_import_no_tensorflow(name, args, answer):
    """``--help``, an unknown flag, a missing required flag and the usage errors ``main``
    raises before its work answer in about a second: the entry point defines its flags
    from light modules and imports TensorFlow and the configurables
    (``metalearn.import_all()``) only when it starts its work."""
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", f"metalearn.{name}",
                          *args], capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, PYTHONPATH=ROOT), cwd=ROOT)
    assert out.returncode == 1, (out.stdout, out.stderr[-3000:])
    assert answer in out.stdout + out.stderr, (out.stdout, out.stderr[-3000:])
    imported = imported_packages(out.stderr)
    assert "absl" in imported and "metalearn" in imported, sorted(imported)  # it reads
    heavy = {"tensorflow", "keras", "tf_keras"} & imported
    assert not heavy, (sorted(heavy), out.stdout[-2000:])


@pytest.mark.parametrize("name", ENTRY_POINTS)
def test_no_gpu_probe_noise(helps, name):
    out, err, _ = helps[name]
    for noise in ("cuInit", "Could not find cuda drivers", "absl::InitializeLog"):
        assert noise not in out + err, (name, err)


def test_probe_noise_filter_keeps_everything_else():
    lines = [
        "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n",
        "I0000 00:00:1796394022.739613    5542 cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will not be used.\n",
        "E0000 00:00:1796394036.745888    5542 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)\n",
        "E0000 00:00:1.0 1 some_kernel.cc:10] a real error\n",
        "UserWarning: something else\n"]
    assert _quiet.without_probe_noise(lines) == lines[3:]


@pytest.mark.parametrize("argv, expected", [
    (["python", "-m", "metalearn.train", "--help"], True),
    (["python", "-X", "faulthandler", "-m", "metalearn.evaluate"], True),
    (["python", "-mmetalearn.sweep"], True),
    (["python", "-m", "pytest", "tests"], False),
    (["python", "my_script.py", "-m", "metalearn.train"], False),
    (["python", "-c", "import metalearn"], False),
    (["python", "-W", "ignore", "-m", "metalearn.report"], True),
    (["python"], False)])
def test_is_entry_point(argv, expected):
    assert _quiet.is_entry_point(argv) is expected


def test_gin_file_resolves_from_any_working_directory(tmp_path, monkeypatch):
    shipped = os.path.join(ROOT, "experiments", "sinusoid", "maml.gin")
    monkeypatch.chdir(tmp_path)  # outside the checkout
    assert resolve_gin_files(["experiments/sinusoid/maml.gin"]) == [shipped]
    assert resolve_gin_files(["sinusoid/maml.gin"]) == [shipped]  # under experiments/
    (tmp_path / "mine.gin").write_text("include 'experiments/sinusoid/maml.gin'\n"
                                       "NUM_STEPS = 7\n")
    assert resolve_gin_files(["mine.gin"]) == ["mine.gin"]  # the working directory first
    # the file and its includes resolve alike: gin's include finds the same file
    gin.clear_config()
    try:
        gin.parse_config_files_and_bindings(resolve_gin_files(["mine.gin"]), [])
        assert gin.query_parameter("%NUM_STEPS") == 7
    finally:
        gin.clear_config()
    with pytest.raises(FileNotFoundError, match="experiments/experiments") as missing:
        resolve_gin_files(["experiments/nope.gin"])
    assert os.path.join(ROOT, "experiments", "nope.gin") in str(missing.value)
    assert gin_file_candidates("/abs/a.gin") == ["/abs/a.gin"]


class _Classification:
    ways, shots, train_shots, queries = (5,), (1,), (1, 5), 15


def test_evaluation_says_what_it_evaluated():
    from metalearn.tasks import Sinusoid
    assert task_description(Sinusoid(shots=5, queries=10), "test") == {
        "sampler": "Sinusoid", "shots": 5, "queries": 10}
    assert task_description(_Classification(), "train") == {
        "sampler": "_Classification", "ways": 5, "shots": [1, 5], "queries": 15}
    report = {"num_tasks": 600, "split": "test", "seed": 0, "checkpoint_step": 70000,
              "tasks": task_description(_Classification(), "test"),
              "inner_steps": [1, 10],
              "results": {"1": {"accuracy": {"mean": 0.5, "ci95": 0.01}},
                          "10": {"accuracy": {"mean": 0.9, "ci95": 0.02}}},
              "per_task": {"1": {"accuracy": [0.123456] * 600}}}
    figures = report_figures(report)
    assert figures.splitlines()[0] == (
        "_Classification, 5-way 1-shot, 15 queries per class: 600 test tasks (seed 0), "
        "after 1, 10 inner steps, checkpoint step 70000")
    assert "10 inner steps: accuracy 0.9000 ± 0.0200" in figures
    assert "0.123456" not in figures  # the per-task values stay in the file


def test_evaluation_logs_progress_and_writes_summaries(tmp_path, monkeypatch):
    import keras
    import tensorflow as tf
    from metalearn import Learner, tasks
    from metalearn.adapters import GradientDescent
    from metalearn.training import evaluation
    from metalearn.training.evaluation import evaluate, write_summaries
    logged = []
    monkeypatch.setattr(evaluation.logging, "info", lambda *a: logged.append(a[0] % a[1:]))
    monkeypatch.setattr(evaluation.time, "perf_counter", iter(range(0, 1000, 10)).__next__)
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    learner = Learner(model, GradientDescent(steps=1, learning_rate=0.01),
                      loss=keras.losses.MeanSquaredError())
    report = evaluate(learner, tasks.Sinusoid(shots=5), num_tasks=4, batch_size=2,
                      inner_steps=(0, 1), log_every_seconds=15)
    assert logged and all(line.startswith("evaluation ") and " ETA " in line
                          for line in logged), logged
    assert any("sampling the test tasks" in line for line in logged), logged
    assert report["inner_steps"] == [0, 1]
    report["checkpoint_step"] = 7
    write_summaries(report, str(tmp_path / "eval"))
    tags = set()
    for event_file in tf.io.gfile.glob(str(tmp_path / "eval" / "*")):
        for event in tf.compat.v1.train.summary_iterator(event_file):
            tags |= {(v.tag, event.step) for v in event.summary.value}
    assert {("loss/1_inner_steps", 7), ("loss_ci95/0_inner_steps", 7)} <= tags, tags


def test_entry_points_import_side_by_side():
    """A test or a notebook calls ``metalearn.evaluate.run`` and ``metalearn.export.run``
    in one process: the flags they share (``--workdir``, ``--gin_file``, ...) are defined
    once and key to each (absl refused the second definition, failing every test that
    imported the second module after the first on one xdist worker)."""
    code = ("import sys\nfrom absl import flags\n"
            "import metalearn.evaluate, metalearn.export, metalearn.train\n"
            "for name in ('evaluate', 'export', 'train'):\n"
            "    module = sys.modules['metalearn.' + name]\n"
            "    keys = {f.name for f in flags.FLAGS.get_key_flags_for_module(module)}\n"
            "    print(name, sorted(keys & {'workdir', 'gin_file', 'module', 'output'}))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=ROOT), timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines() == [
        "evaluate ['gin_file', 'module', 'output', 'workdir']",
        "export ['gin_file', 'module', 'output', 'workdir']",
        "train ['gin_file', 'module', 'workdir']"], out.stdout
