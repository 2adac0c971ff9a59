r"""Where the meta-step's time goes: TensorFlow's profiler over a few steps, by op type.

    python -m benchmarks.profile_step --meta_batch=32 --inner_steps=1 --order=second \
        --formulation=accumulate --warmup=3

The workload of :mod:`benchmarks.meta_step` (the MAML paper's Omniglot net, 5-way 1-shot,
15 queries; its flags, the first value of each list), traced and warmed up
(``--warmup`` steps after the first), then ``--profiled_steps`` steps under
``tf.profiler.experimental``; the trace (``.xplane.pb``) is read
back and the kernels' wall time summed per op type over TensorFlow's compute threads.
Prints one JSON line: the step's wall time, the threads' busy time per step, and each op
type's time per step (summed over threads), count per step and share of the busy time,
largest first. The profiler adds a little overhead; the shares are what to read.
"""

from __future__ import annotations

import glob
import json
import os
import tempfile
import time

from absl import app, flags

# meta_step's flags: --meta_batch, --inner_steps, --order, --formulation (the first value
# of each), --warmup
from benchmarks import meta_step, op_times

flags.DEFINE_integer("profiled_steps", 2, "Meta-steps under the profiler.")
flags.DEFINE_integer("top", 25, "Op types listed.")
FLAGS = flags.FLAGS

def main(argv):
    del argv
    import tensorflow as tf
    import keras
    import metalearn
    from metalearn.training.step import make_meta_step
    keras.utils.set_random_seed(0)
    batch_size, inner_steps = int(FLAGS.meta_batch[0]), int(FLAGS.inner_steps[0])
    order, formulation = FLAGS.order[0], FLAGS.formulation[0]
    learner, formulation_object = meta_step.benchmarked_learner(formulation, inner_steps, order)
    step = make_meta_step(learner, metalearn.MetaGradient(), formulation_object)
    batch = meta_step._episodes(batch_size)
    for _ in range(1 + FLAGS.warmup):
        float(step(batch)["loss"])
    steps = FLAGS.profiled_steps
    with tempfile.TemporaryDirectory() as logdir:
        tf.profiler.experimental.start(logdir)
        start = time.perf_counter()
        for _ in range(steps):
            float(step(batch)["loss"])
        wall = (time.perf_counter() - start) / steps * 1000
        tf.profiler.experimental.stop()
        path = glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)[0]
        with open(path, "rb") as f:
            times = op_times(f.read(), steps)
    busy = sum(ms for ms, _ in times.values())
    ranked = sorted(times.items(), key=lambda item: -item[1][0])[:FLAGS.top]
    print(json.dumps(dict(
        meta_batch=batch_size, inner_steps=inner_steps, order=order,
        formulation=formulation, wall_ms_per_step=round(wall, 1),
        kernel_ms_per_step=round(busy, 1),
        ops=[dict(op=name, ms=round(ms, 1), per_step=round(n), share=round(ms / busy, 3))
             for name, (ms, n) in ranked])))


if __name__ == "__main__":
    app.run(main)
