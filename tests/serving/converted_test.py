"""metalearn.serving.litert and .onnx: a gradient-free learner converted to LiteRT
(builtin ops, set sizes fixed) and to ONNX (set sizes unknown, several tried) gives, in
one fresh process that imports neither metalearn nor TensorFlow, the library's
predictions. (A gradient-based learner's LiteRT model, Select TF ops, is
tests/export_test.py's, through the command line.)"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from metalearn.serving import METADATA, export_litert, export_onnx
from tests.serving.export_fixtures import image_episode, protonets_learner

pytestmark = pytest.mark.xdist_group(__name__)

# Runs each case of cases.json: a model file and the npz of its inputs; writes the
# predictions, or the runtime's error, by case name.
_RUN = r"""
import json, sys
import numpy as np
import onnxruntime
from ai_edge_litert.interpreter import Interpreter
cases, out = json.load(open(sys.argv[1])), sys.argv[2]
results, errors = {}, {}
for name, (model, inputs) in cases.items():
    feed = dict(np.load(inputs))
    try:
        if model.endswith(".tflite"):
            runner = Interpreter(model_path=model).get_signature_runner("serving_default")
            results[name] = runner(**feed)["predictions"]
        else:
            session = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"])
            results[name] = session.run(["predictions"], feed)[0]
    except RuntimeError as error:
        errors[name] = str(error)
np.savez(out, **results)
print(json.dumps({"errors": errors,
                  "imported": sorted(m for m in ("metalearn", "tensorflow", "keras")
                                     if m in sys.modules)}))
"""


def run_in_fresh_process(cases, tmp_path):
    """``({name: predictions}, {name: error}, imported)`` of ``cases`` (``{name: (model
    file, episode)}``) run by the runtimes alone in a fresh process."""
    listed = {}
    for name, (model, episode) in cases.items():
        inputs = str(tmp_path / f"{name}.npz")
        np.savez(inputs, **{k: getattr(episode, k).numpy()
                            for k in ("support_x", "support_y", "query_x")})
        listed[name] = (model, inputs)
    (tmp_path / "cases.json").write_text(json.dumps(listed))
    out = subprocess.run([sys.executable, "-c", _RUN, str(tmp_path / "cases.json"),
                          str(tmp_path / "out.npz")], capture_output=True, text=True,
                         timeout=300, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    return dict(np.load(tmp_path / "out.npz")), report["errors"], report["imported"]


def test_protonets_converted_serve_the_librarys_predictions(tmp_path):
    protonets = protonets_learner()
    sizes = [(1, 5), (2, 2), (4, 1)]  # (shots, queries) per class of a 3-way task
    episodes = [image_episode(s, q, seed=i) for i, (s, q) in enumerate(sizes)]
    fixed = export_litert(protonets, str(tmp_path / "litert"), example=episodes[1],
                          support_size=3, query_size=15)  # episodes[0]'s sizes
    dynamic = export_onnx(protonets, str(tmp_path / "onnx"), example=episodes[0])
    metadata = json.load(open(os.path.join(fixed, METADATA)))
    assert (metadata["format"], metadata["file"]) == ("litert", "model.tflite")
    assert metadata["set_sizes"] == {"support": 3, "query": 15}
    assert metadata["inputs"]["support_x"] == {"shape": [3, 8, 8, 1], "dtype": "float32"}
    assert metadata["outputs"]["predictions"]["shape"] == [15, 3]
    assert metadata["select_tf_ops"] == [] and metadata["learner"] == "PrototypicalNetworks"
    onnx_metadata = json.load(open(os.path.join(dynamic, METADATA)))
    assert (onnx_metadata["format"], onnx_metadata["file"]) == ("onnx", "model.onnx")
    assert onnx_metadata["set_sizes"] == {"support": None, "query": None}
    assert onnx_metadata["inputs"]["support_y"] == {"shape": [None], "dtype": "int32"}

    cases = {"litert": (f"{fixed}/model.tflite", episodes[0]),
             **{f"onnx_{i}": (f"{dynamic}/model.onnx", e) for i, e in enumerate(episodes)}}
    served, errors, imported = run_in_fresh_process(cases, tmp_path)
    assert errors == {} and imported == []  # the runtimes alone: no metalearn, no TF
    expected = [protonets.run_task(e, measure=False).predictions.numpy() for e in episodes]
    np.testing.assert_allclose(served["litert"], expected[0], rtol=0, atol=1e-4)
    for i, (shots, queries) in enumerate(sizes):
        assert served[f"onnx_{i}"].shape == (3 * queries, 3)
        np.testing.assert_allclose(served[f"onnx_{i}"], expected[i], rtol=0, atol=1e-4)
