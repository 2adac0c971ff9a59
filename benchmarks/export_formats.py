r"""Exported size and per-task latency of adapt-then-predict, per learner and format:
one 5-way 1-shot Omniglot-shaped task (5 support and 5 query images of 28x28x1, as
experiments/omniglot/minimal/*_5way_1shot.gin sample them), MAML's Omniglot net
(``omniglot_conv_net``: 4 x [conv 64, BatchNorm, ReLU]).

    PYTHONPATH=. python benchmarks/export_formats.py [--repeats=50] [--out=runs/export_formats]

The learners are those files' (MAML: ``GradientDescent``, 1 inner step of 0.4, served
with 3 as evaluated; Prototypical Networks: the net without its head), with freshly
initialised weights: size and latency depend on the architecture, not on the values.
Each exports with :mod:`metalearn.serving` to every format it can go to; the latency is
measured in a fresh process that imports only the format's runtime (TensorFlow for the
SavedModel, ``ai_edge_litert`` for LiteRT, ``onnxruntime`` for ONNX, never metalearn):
the median over ``--repeats`` calls of adapt-then-predict on the same task, after one
warm-up call, on the machine's cores as they are. A combination that cannot be exported
or run here is listed with the reason. Prints a Markdown table (docs/concepts/export.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from absl import app, flags

flags.DEFINE_integer("repeats", 50, "Calls of adapt-then-predict timed per export.")
flags.DEFINE_string("out", "runs/export_formats", "Folder for the exports and the task.")
FLAGS = flags.FLAGS

# Times `repeats` calls of one export in a process that never imports metalearn.
_TIME = r"""
import json, statistics, sys, time
import numpy as np
format, path, task, repeats, out = sys.argv[1:4] + [int(sys.argv[4]), sys.argv[5]]
feed = dict(np.load(task))
if format == "saved_model":
    import tensorflow as tf
    serve = tf.saved_model.load(path).signatures["serving_default"]
    feed = {k: tf.constant(v) for k, v in feed.items()}
    call = lambda: serve(**feed)["predictions"].numpy()
elif format == "litert":
    from ai_edge_litert.interpreter import Interpreter
    runner = Interpreter(model_path=path + "/model.tflite").get_signature_runner()
    call = lambda: runner(**feed)["predictions"]
else:
    import onnxruntime
    session = onnxruntime.InferenceSession(path + "/model.onnx",
                                           providers=["CPUExecutionProvider"])
    call = lambda: session.run(["predictions"], feed)[0]
try:
    np.save(out, call())
except RuntimeError as error:
    flex = "Select TensorFlow op" in str(error)
    print(json.dumps({"error": "the interpreter has no Flex delegate" if flex
                      else str(error).splitlines()[0][:120]}))
    sys.exit(0)
times = []
for _ in range(repeats):
    start = time.perf_counter()
    call()
    times.append(time.perf_counter() - start)
print(json.dumps({"ms": 1000 * statistics.median(times),
                  "metalearn": "metalearn" in sys.modules}))
"""


def _size(path: str) -> int:
    return sum(os.path.getsize(os.path.join(folder, name))
               for folder, _, names in os.walk(path) for name in names
               if name != "metadata.json")


def _learners():
    import keras

    import metalearn
    keras.utils.set_random_seed(0)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    maml = metalearn.Learner(metalearn.models.omniglot_conv_net(5),
                             metalearn.adapters.GradientDescent(1, 0.4), loss=loss)
    protonets = metalearn.PrototypicalNetworks(metalearn.models.omniglot_conv_net(5),
                                               ways=5, drop_head="head")
    return {"MAML (3 inner steps)": (maml, 3), "Prototypical Networks": (protonets, None)}


def main(argv) -> None:
    del argv
    import numpy as np
    import tensorflow as tf

    from metalearn import serving
    from metalearn.tasks import Episode
    images = tf.random.stateless_uniform([10, 28, 28, 1], [0, 0])
    labels = tf.range(5)
    task = Episode(images[:5], labels, images[5:], labels)
    os.makedirs(FLAGS.out, exist_ok=True)
    task_file = os.path.join(FLAGS.out, "task.npz")
    np.savez(task_file, support_x=task.support_x.numpy(), support_y=labels.numpy(),
             query_x=task.query_x.numpy())
    exports = {"saved_model": serving.export_saved_model, "litert": serving.export_litert,
               "onnx": serving.export_onnx}
    rows = ["| learner | format | exported size | adapt-then-predict, ms (median) | "
            "note (max diff: from the library's predictions) |",
            "| --- | --- | --- | --- | --- |"]
    for name, (learner, steps) in _learners().items():
        expected = learner.run_task(task, steps, measure=False).predictions.numpy()
        for format, export in exports.items():
            folder = os.path.join(FLAGS.out, name.split()[0].lower(), format)
            extra = {"select_tf_ops": True} if format == "litert" else {}
            try:
                serving.check_exportable(learner, format, select_tf_ops=True)
            except serving.UnsupportedExport as error:
                rows.append(f"| {name} | {format} | - | - | refused: "
                            f"{str(error).split(':')[0]} |")
                continue
            path = export(learner, folder, inner_steps=steps, example=task, overwrite=True,
                          **extra)
            metadata = json.load(open(os.path.join(path, serving.METADATA)))
            note = ("Select TF ops " + ", ".join(metadata["select_tf_ops"])
                    if metadata.get("select_tf_ops") else "")
            served = os.path.join(FLAGS.out, "served.npy")
            out = subprocess.run([sys.executable, "-c", _TIME, format, path, task_file,
                                  str(FLAGS.repeats), served], capture_output=True, text=True,
                                 env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
                                 check=True)
            timed = json.loads(out.stdout.strip().splitlines()[-1])
            assert not timed.get("metalearn"), "the runtime's process imported metalearn"
            if "error" in timed:
                latency, note = "-", f"{note}; not run here: {timed['error']}"
            else:
                latency = f"{timed['ms']:.2f}"
                difference = float(np.abs(np.load(served) - expected).max())
                note = f"{note}; max diff {difference:.1e}".lstrip("; ")
            size = _size(path)
            rows.append(f"| {name} | {format} | {size / 2 ** 20:.2f} MiB | {latency} | "
                        f"{note} |")
            print(rows[-1], flush=True)
    print("\n".join(rows))


if __name__ == "__main__":
    app.run(main)
