"""Every learner family the library trains exports through the one mechanism (its own
task run traced with the set sizes unknown): a fresh process that never imports
metalearn loads every export at once and serves tasks of three sizes; its predictions
(``serving_default``, and ``predict`` of what ``adapt`` gave) are the library's
``run_task``'s (float32, within 1e-5). The learners are tests/serving/export_families.py's,
tiny, so that the whole module costs a few seconds."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from metalearn.serving import METADATA, export_saved_model, named_leaves
from tests import forked
from tests.serving.export_families import FAMILIES, episodes

pytestmark = pytest.mark.xdist_group(__name__)

CHECKED = ("meta_sgd", "anil", "maml_plus_plus", "imaml", "learned_optimizer", "hypermaml",
           "hypernetwork_input", "proto_maml", "ridge", "logistic", "svm",
           "conditional_np", "latent_np", "in_context_head")
"""One of each family and adapter kind (tests/serving/saved_model_test.py has MAML, MAML
through BatchNorm in a conv net and Prototypical Networks): learned rates, a masked
(ANIL) inner loop, MAML++ (BatchNorm, per-step weights, the multi-step loss), implicit
gradients, a learned optimizer, generated weights (then an inner loop; per input),
Proto-MAML, the ridge, logistic and SVM heads, the conditional and latent neural
processes (Gaussian predictions), the in-context transformer with a head."""

# Imports TensorFlow (while the exports are written), then reads the path of cases.npz,
# loads every export it names with TensorFlow alone and serves each of its tasks; with
# "adapt" among the signatures, also adapt once then predict.
_SERVE = r"""
import json, sys
import numpy as np
import tensorflow as tf
cases, out = np.load(sys.stdin.readline().strip()), {}
report = {"metalearn_imported": False, "signatures": {}}
for name in json.loads(str(cases["names"])):
    signatures = tf.saved_model.load(str(cases[f"{name}__path"])).signatures
    report["signatures"][name] = sorted(signatures)
    for i in range(int(cases["count"])):
        given = {k: tf.constant(cases[f"{name}__{k}_{i}"])
                 for k in ("support_x", "support_y", "query_x")}
        for key, value in signatures["serving_default"](**given).items():
            out[f"{name}__serve_{i}__{key}"] = value.numpy()
        if "adapt" in signatures:
            solution = signatures["adapt"](support_x=given["support_x"],
                                           support_y=given["support_y"])
            served = signatures["predict"](query_x=given["query_x"], **solution)
            for key, value in served.items():
                out[f"{name}__cached_{i}__{key}"] = value.numpy()
np.savez(sys.argv[1], **out)
report["metalearn_imported"] = "metalearn" in sys.modules
print(json.dumps(report))
"""


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """``(expected, served, report, metadata)``: the library's predictions by family,
    size and output; the fresh process's by the same keys; what it reported; each
    export's metadata."""
    folder = tmp_path_factory.mktemp("families")
    process = forked.Popen([sys.executable, "-c", _SERVE, str(folder / "served.npz")],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True,
                           env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    cases = {"names": json.dumps(CHECKED), "count": 3}
    expected, metadata = {}, {}
    try:
        for name in CHECKED:
            build, kind = FAMILIES[name]
            learner, tasks = build(), episodes(kind)
            # check=False: this test compares the served predictions itself
            path = export_saved_model(learner, str(folder / name), example=tasks[0],
                                      check=False)
            metadata[name] = json.load(open(os.path.join(path, METADATA)))
            cases[f"{name}__path"] = path
            for i, task in enumerate(tasks):
                cases.update({f"{name}__{k}_{i}": getattr(task, k).numpy()
                              for k in ("support_x", "support_y", "query_x")})
                predictions = learner.run_task(task, measure=False).predictions
                expected.update({(name, i, key): value.numpy() for key, value
                                 in named_leaves(predictions, "predictions")})
        np.savez(folder / "cases.npz", **cases)
        stdout, stderr = process.communicate(str(folder / "cases.npz") + "\n", timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, stderr[-3000:]
    report = json.loads(stdout.strip().splitlines()[-1])
    return expected, dict(np.load(folder / "served.npz")), report, metadata


def test_the_fresh_process_never_imports_metalearn(served):
    _, _, report, _ = served
    assert report["metalearn_imported"] is False
    assert sorted(report["signatures"]) == sorted(CHECKED)


@pytest.mark.parametrize("name", CHECKED)
def test_every_family_serves_the_librarys_predictions(served, name):
    expected, got, report, metadata = served
    signatures = report["signatures"][name]
    # a per-input hypernetwork keeps nothing per task: no adapt/predict pair
    cached = name != "hypernetwork_input"
    assert signatures == (["adapt", "predict", "serving_default"] if cached
                          else ["serving_default"])
    assert ("adapt_left_out" in metadata[name]) is not cached
    outputs = sorted(key for (family, i, key) in expected if family == name and i == 0)
    assert outputs == sorted(metadata[name]["outputs"])
    for (family, i, key), want in expected.items():
        if family != name:
            continue
        served_now = got[f"{name}__serve_{i}__{key}"]
        assert served_now.shape == want.shape
        np.testing.assert_allclose(served_now, want, rtol=0, atol=1e-5)
        if cached:
            np.testing.assert_allclose(got[f"{name}__cached_{i}__{key}"], want, rtol=0,
                                       atol=1e-5)


def test_the_solution_holds_what_adaptation_changed(served):
    """``adapt`` gives the weights the task's adaptation changed and its state, by
    name: ANIL's head alone, a neural process's encoded context and no weight, the
    heads' fit; neural processes predict a Gaussian, one output per part."""
    _, _, _, metadata = served
    anil = metadata["anil"]["adapted_weights"]
    assert anil and all("/head/" in path for path in anil.values()), anil
    assert len(metadata["meta_sgd"]["adapted_weights"]) == 4  # every weight of the MLP
    assert not metadata["conditional_np"]["adapted_weights"]
    assert sorted(metadata["conditional_np"]["solution"]) == \
        ["state_context_representation"]
    assert "state_context_latent" in metadata["latent_np"]["solution"]
    assert sorted(metadata["ridge"]["solution"]) == ["state_head"]
    assert sorted(metadata["latent_np"]["outputs"]) == ["predictions_mean",
                                                        "predictions_scale"]
    assert metadata["svm"]["inputs"]["support_x"]["shape"] == [None, 6]
