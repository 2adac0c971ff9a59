"""``python -m metalearn.export`` end to end: a tiny trained sinusoid MAML run exported,
the SavedModel's predictions those of the restored learner's task run; a neural
process's run (Gaussian predictions, its encoded context cached); the MAML run written
for LiteRT with Select TF ops at the set sizes given; a meta-RL run and a non-empty
version folder refused with their names."""

import json
import os
import sys

import numpy as np
import pytest
import tensorflow as tf
from ai_edge_litert.interpreter import Interpreter

from metalearn import tasks
from metalearn.repository import ROOT
from metalearn.export import run as export_run
from metalearn.serving import METADATA, UnsupportedExport
from metalearn.tasks import Episode
from metalearn.training import build_experiment, parse_config, restore, train
from tests.run_fixtures import imported_packages, saved_run
from tests import forked

pytestmark = pytest.mark.xdist_group(__name__)

TINY = ["Loop.num_steps = 2", "Loop.log_every = 1", "Loop.checkpoint_every = 2",
        "Experiment.meta_batch_size = 2", "mlp.hidden = (8,)"]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A sinusoid MAML run trained for two meta-steps (one inner step, as trained)."""
    folder = str(tmp_path_factory.mktemp("run"))
    parse_config(["experiments/sinusoid/maml.gin"], TINY)
    train(build_experiment(), folder)
    return folder


def export(*args, importtime=False):
    """``python -m metalearn.export`` with ``args`` (``importtime``: with ``-X
    importtime``, its imports listed on stderr)."""
    timing = ["-X", "importtime"] if importtime else []
    return forked.run([sys.executable, *timing, "-m", "metalearn.export", *args],
                      capture_output=True, text=True, timeout=300, cwd=ROOT,
                      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
                      PYTHONPATH=os.pathsep.join(
                      [ROOT, os.environ.get("PYTHONPATH", "")])))


def test_a_trained_run_exports_its_task_run(workdir, tmp_path):
    out = export(f"--workdir={workdir}", f"--output={tmp_path / 'served'}",
                 "--inner_steps=2", "--version=3")
    assert out.returncode == 0, out.stderr[-3000:]
    path = str(tmp_path / "served" / "3")
    assert f"exported to {path}" in out.stdout
    metadata = json.load(open(os.path.join(path, METADATA)))
    assert (metadata["inner_steps"], metadata["inner_steps_trained"]) == (2, 1)
    assert metadata["meta_step"] == 2
    assert metadata["inputs"]["query_x"] == {"shape": [None, 1], "dtype": "float32"}
    served = tf.saved_model.load(path).signatures["serving_default"]
    learner = restore(workdir).learner
    for shots, queries in ((5, 10), (10, 4)):
        episode = Episode(*[t[0] for t in tasks.Sinusoid(shots=shots, queries=queries)
                            .sample(tf.constant([shots, 2]), 1)])
        predictions = served(support_x=episode.support_x, support_y=episode.support_y,
                             query_x=episode.query_x)["predictions"]
        expected = learner.run_task(episode, steps=2, measure=False).predictions
        np.testing.assert_allclose(predictions, expected, rtol=0, atol=1e-5)


def test_maml_goes_to_litert_with_select_tf_ops_at_the_sizes_given(workdir, tmp_path):
    """(Its refusal by ONNX, and by LiteRT without Select TF ops, is
    tests/serving/bad_export_test.py's: the check the command runs after the restore.)"""
    out = export(f"--workdir={workdir}", f"--output={tmp_path / 'm'}", "--format=litert",
                 "--select_tf_ops", "--support_size=4", "--query_size=6")
    assert out.returncode == 0, out.stderr[-3000:]
    path = str(tmp_path / "m" / "1")
    assert f"exported to {path}" in out.stdout
    metadata = json.load(open(os.path.join(path, METADATA)))
    assert metadata["set_sizes"] == {"support": 4, "query": 6}
    assert metadata["inputs"]["query_x"] == {"shape": [6, 1], "dtype": "float32"}
    assert "ReluGrad" in metadata["select_tf_ops"], metadata  # the inner loop's gradient
    # the documented limit: the ai-edge-litert interpreter has no Flex delegate to run it
    runner = Interpreter(model_path=os.path.join(path, "model.tflite")
                         ).get_signature_runner()
    with pytest.raises(RuntimeError, match=r"Select TensorFlow op\(s\)"):
        runner(support_x=np.zeros([4, 1], np.float32), support_y=np.zeros([4, 1], np.float32),
               query_x=np.zeros([6, 1], np.float32))


def test_a_non_empty_version_folder_is_refused_unless_overwritten(workdir, tmp_path):
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "1" / "keep.txt").write_text("an earlier model")
    out = export(f"--workdir={workdir}", f"--output={tmp_path / 'm'}", importtime=True)
    assert out.returncode == 1
    assert "m/1 exists and is not empty" in out.stderr, out.stderr[-2000:]
    assert "tensorflow" not in imported_packages(out.stderr)  # refused before it loads
    assert (tmp_path / "m" / "1" / "keep.txt").exists()
    out = export(f"--workdir={workdir}", f"--output={tmp_path / 'm'}", "--overwrite")
    assert out.returncode == 0, out.stderr[-3000:]
    assert not (tmp_path / "m" / "1" / "keep.txt").exists()
    assert (tmp_path / "m" / "1" / "saved_model.pb").exists()


def test_a_neural_process_run_exports_its_gaussian_predictions(tmp_path):
    """A conditional neural process's run (no inner loop, Gaussian predictions): one
    output per part of the Gaussian, and adapt/predict with the encoded context."""
    run = str(tmp_path / "cnp")
    saved_run(run, "experiments/gaussian_process/cnp.gin")
    out = export(f"--workdir={run}", f"--output={tmp_path / 'm'}")
    assert out.returncode == 0, out.stderr[-3000:]
    path = str(tmp_path / "m" / "1")
    metadata = json.load(open(os.path.join(path, METADATA)))
    assert (metadata["learner"], metadata["adapter"]) == ("Learner",
                                                          "ConditionalNeuralProcess")
    assert sorted(metadata["solution"]) == ["state_context_representation"]
    experiment = restore(run)
    episode = Episode(*[t[0] for t in next(iter(experiment.sampler.dataset(
        1, seed=1, split="test", num_steps=1)))])
    signatures = tf.saved_model.load(path).signatures
    served = signatures["serving_default"](support_x=episode.support_x,
                                           support_y=episode.support_y,
                                           query_x=episode.query_x)
    solution = signatures["adapt"](support_x=episode.support_x,
                                   support_y=episode.support_y)
    cached = signatures["predict"](query_x=episode.query_x, **solution)
    expected = experiment.learner.run_task(episode, measure=False).predictions
    for part in ("mean", "scale"):
        np.testing.assert_allclose(served[f"predictions_{part}"], getattr(expected, part),
                                   rtol=0, atol=1e-5)
        np.testing.assert_allclose(cached[f"predictions_{part}"], getattr(expected, part),
                                   rtol=0, atol=1e-5)


def test_a_meta_rl_run_is_refused_naming_the_learner(tmp_path):
    run = str(tmp_path / "rl")
    saved_run(run, "experiments/rl/point_nav_maml.gin", ["PointNavigation.horizon = 3",
                                                          "PolicyLearner.rollouts = 2"])
    with pytest.raises(UnsupportedExport, match="PolicyLearner overrides query_data"):
        export_run(run, str(tmp_path / "m"))
    assert not (tmp_path / "m").exists()
