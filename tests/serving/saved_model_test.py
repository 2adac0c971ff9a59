"""metalearn.serving.saved_model: a learner's adapt-then-predict exported as a SavedModel
gives, in a fresh process that never imports metalearn, the predictions of the library's
own task run at any support and query set size."""

import json
import logging
import os
import re
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import metalearn
from metalearn import models, tasks
from metalearn.adapters import GradientDescent
from metalearn.serving import (METADATA, UnsupportedExport, check_exportable,
                               export_saved_model)
from metalearn.repository import ROOT
from metalearn.tasks import Episode
from tests import forked
from tests.serving.export_fixtures import image_episode, protonets_learner, sinusoid_learner

pytestmark = pytest.mark.xdist_group(__name__)

# Loads the SavedModel with TensorFlow alone and serves each case of cases.npz; with
# "adapt" among the signatures, also adapt once then predict.
_SERVE = r"""
import json, sys, time
import numpy as np
import tensorflow as tf
path, cases, out = sys.argv[1:4]
model = tf.saved_model.load(path)
signatures = model.signatures
data = np.load(cases)
results = {}
for i in range(int(data["count"])):
    inputs = {k: tf.constant(data[f"{k}_{i}"]) for k in ("support_x", "support_y", "query_x")}
    results[f"serve_{i}"] = signatures["serving_default"](**inputs)["predictions"].numpy()
    if "adapt" in signatures:
        state = signatures["adapt"](support_x=inputs["support_x"],
                                    support_y=inputs["support_y"])
        results[f"cached_{i}"] = signatures["predict"](query_x=inputs["query_x"],
                                                       **state)["predictions"].numpy()
serve = signatures["serving_default"]
inputs = {k: tf.constant(data[f"{k}_0"]) for k in ("support_x", "support_y", "query_x")}
serve(**inputs)
start = time.perf_counter()
for _ in range(50):
    serve(**inputs)["predictions"].numpy()
results["latency"] = np.array((time.perf_counter() - start) / 50)
np.savez(out, **results)
print(json.dumps({"metalearn_imported": "metalearn" in sys.modules,
                  "signatures": sorted(signatures)}))
"""


def serve_in_fresh_process(path, episodes, tmp_path):
    """``{name: array}`` of the SavedModel's predictions on ``episodes`` from a process
    that imports TensorFlow and never metalearn, and what it reports."""
    cases = {"count": len(episodes)}
    for i, episode in enumerate(episodes):
        cases.update({f"{k}_{i}": getattr(episode, k).numpy()
                      for k in ("support_x", "support_y", "query_x")})
    np.savez(tmp_path / "cases.npz", **cases)
    out = forked.run([sys.executable, "-c", _SERVE, path, str(tmp_path / "cases.npz"),
                     str(tmp_path / "served.npz")], capture_output=True, text=True,
                     env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["metalearn_imported"] is False
    return dict(np.load(tmp_path / "served.npz")), report


def test_maml_serves_the_task_runs_predictions_at_any_set_size(tmp_path):
    learner = sinusoid_learner()
    sizes = [(5, 10), (10, 3), (2, 25)]  # (shots, queries)
    episodes = [tasks.Sinusoid(shots=s, queries=q).sample(tf.constant([i, 1]), 1)
                for i, (s, q) in enumerate(sizes)]
    episodes = [Episode(*[t[0] for t in e]) for e in episodes]
    path = export_saved_model(learner, str(tmp_path / "sinusoid"), example=episodes[0])
    assert path == str(tmp_path / "sinusoid" / "1")
    metadata = json.loads(open(os.path.join(path, METADATA)).read())
    assert metadata["inner_steps"] == 3 and metadata["learner"] == "Learner"
    assert metadata["inputs"]["support_x"] == {"shape": [None, 1], "dtype": "float32"}
    served, report = serve_in_fresh_process(path, episodes, tmp_path)
    # adapt gives the adapted weights (every one changed), predict reads them
    assert report["signatures"] == ["adapt", "predict", "serving_default"]
    assert sorted(metadata["solution"]) == [
        f"weights_mlp_{layer}_{part}" for layer in ("head", "hidden0", "hidden1")
        for part in ("bias", "kernel")]
    for i, episode in enumerate(episodes):
        expected = learner.run_task(episode, measure=False).predictions.numpy()
        assert served[f"serve_{i}"].shape == expected.shape == (sizes[i][1], 1)
        np.testing.assert_allclose(served[f"serve_{i}"], expected, rtol=0, atol=1e-5)
        np.testing.assert_allclose(served[f"cached_{i}"], expected, rtol=0, atol=1e-5)
    # the adaptation changed the predictions: the inner loop is in the graph
    before = learner.predict(learner.initial_weights(), episodes[0].query_x).numpy()
    assert np.abs(served["serve_0"] - before).max() > 1e-3


def test_inner_steps_given_replace_the_trained_ones(tmp_path):
    learner = sinusoid_learner()
    episode = Episode(*[t[0] for t in tasks.Sinusoid(shots=4, queries=6).sample(
        tf.constant([3, 1]), 1)])
    absl = logging.getLogger("absl")
    absl.setLevel(logging.NOTSET)  # absl's own until a program sets its verbosity
    path = export_saved_model(learner, str(tmp_path / "m"), inner_steps=1, version=2,
                              example=episode)
    # tf.saved_model.save pins the absl logger at the level it reads (WARNING, the
    # root's): metalearn's INFO lines, and pytest's caplog of them, went silent after
    assert absl.level == logging.NOTSET
    assert json.load(open(os.path.join(path, METADATA)))["inner_steps"] == 1
    served = tf.saved_model.load(path).signatures["serving_default"](
        support_x=episode.support_x, support_y=episode.support_y,
        query_x=episode.query_x)["predictions"]
    expected = learner.run_task(episode, steps=1, measure=False).predictions
    np.testing.assert_allclose(served, expected, rtol=0, atol=1e-5)


def test_maml_through_batch_norm_serves_the_task_runs_predictions(tmp_path):
    """The inner loop's gradients through BatchNorm on the support batch's statistics
    (the library's exact batch moments), and the queries' own statistics, traced."""
    keras.utils.set_random_seed(0)
    model = models.conv_net((8, 8, 1), outputs=3, filters=4, blocks=2)
    learner = metalearn.Learner(model, adapter=GradientDescent(steps=2, learning_rate=0.3),
                                loss=metalearn.functional.softmax_cross_entropy)
    episodes = [image_episode(s, q, seed=i) for i, (s, q) in enumerate([(1, 4), (4, 1)])]
    path = export_saved_model(learner, str(tmp_path / "conv"), example=episodes[0])
    served = tf.saved_model.load(path).signatures["serving_default"]
    for episode in episodes:
        predictions = served(support_x=episode.support_x, support_y=episode.support_y,
                             query_x=episode.query_x)["predictions"]
        expected = learner.run_task(episode, measure=False).predictions
        np.testing.assert_allclose(predictions, expected, rtol=0, atol=1e-5)
        before = learner.predict(learner.initial_weights(), episode.query_x)
        assert np.abs(predictions - before).max() > 1e-4  # adapted


def test_protonets_serve_and_cache_the_heads_fit(tmp_path):
    learner = protonets_learner()
    sizes = [(1, 5), (5, 2), (3, 7)]  # (shots, queries) per class
    episodes = [image_episode(s, q, seed=i) for i, (s, q) in enumerate(sizes)]
    path = export_saved_model(learner, str(tmp_path / "protonets"), example=episodes[0])
    metadata = json.load(open(os.path.join(path, METADATA)))
    assert metadata["ways"] == 3 and metadata["inner_steps"] == 0
    assert metadata["inputs"]["support_y"] == {"shape": [None], "dtype": "int32"}
    served, report = serve_in_fresh_process(path, episodes, tmp_path)
    assert report["signatures"] == ["adapt", "predict", "serving_default"]
    for i, episode in enumerate(episodes):
        expected = learner.run_task(episode, measure=False).predictions.numpy()
        assert served[f"serve_{i}"].shape == expected.shape == (3 * sizes[i][1], 3)
        np.testing.assert_allclose(served[f"serve_{i}"], expected, rtol=0, atol=1e-5)
        np.testing.assert_allclose(served[f"cached_{i}"], expected, rtol=0, atol=1e-5)


def test_a_format_not_written_yet_is_named():
    keras.utils.set_random_seed(0)
    model = models.mlp((1,), hidden=(4,), outputs=1)
    maml = metalearn.Learner(model, adapter=GradientDescent(), loss="mse")
    with pytest.raises(UnsupportedExport, match=r"\(adapter GradientDescent\) cannot be "
                       "exported to 'onnx'"):
        check_exportable(maml, "onnx")
    with pytest.raises(UnsupportedExport, match="cannot be exported to 'litert' with "
                       "builtin ops"):
        check_exportable(maml, "litert")
    with pytest.raises(ValueError, match="unknown export format 'tflite'"):
        check_exportable(maml, "tflite")
    # any learner is checked by tracing its task run (tests/serving/families_test.py);
    # one whose queries the run makes itself is refused before (bad_export_test.py)
    check_exportable(metalearn.Learner(model, adapter=metalearn.adapters.NoAdaptation(),
                                       loss="mse"))


def test_a_non_empty_version_folder_is_refused_before_any_work(tmp_path):
    learner = sinusoid_learner()
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "1" / "saved_model.pb").write_text("older")
    with pytest.raises(FileExistsError, match="exists and is not empty"):
        export_saved_model(learner, str(tmp_path / "m"), example=None)
    episode = Episode(*[t[0] for t in tasks.Sinusoid(shots=2, queries=2).sample(
        tf.constant([0, 0]), 1)])
    path = export_saved_model(learner, str(tmp_path / "m"), example=episode,
                              overwrite=True)
    assert sorted(os.listdir(path)) == sorted(["assets", METADATA, "fingerprint.pb",
                                               "saved_model.pb", "variables"])
    assert sorted(os.listdir(tmp_path / "m")) == ["1"]  # no partial folder left
    with pytest.raises(ValueError, match="version must be a positive integer"):
        export_saved_model(learner, str(tmp_path / "m"), version=0, example=episode)


def test_the_export_pages_example_runs_as_written(capsys):
    page = os.path.join(ROOT, "docs", "concepts", "export.md")
    blocks = re.findall(r"^```python\n(.*?)^```", open(page).read(), re.M | re.S)
    assert len(blocks) == 1
    exec(compile(blocks[0], f"{page}[python block 0]", "exec"), {"__name__": "docs_export"})
    assert "True (10, 1) True" in capsys.readouterr().out  # what the page's comment says
