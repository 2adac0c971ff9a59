r"""Where the meta-step's time goes: TensorFlow's profiler over a few steps, by op type.

    python -m benchmarks.profile_step --meta_batch=32 --inner_steps=1 --formulation=accumulate

The workload of :mod:`benchmarks.meta_step` (the MAML paper's Omniglot net, 5-way 1-shot,
15 queries, second order unless ``--order=first``), traced and warmed up, then
``--steps`` steps under ``tf.profiler.experimental``; the trace (``.xplane.pb``) is read
back and the kernels' wall time summed per op type over TensorFlow's compute threads.
Prints one JSON line: the step's wall time, the threads' busy time per step, and each op
type's time per step (summed over threads), count per step and share of the busy time,
largest first. The profiler adds a little overhead; the shares are what to read.
"""

from __future__ import annotations

import collections
import glob
import json
import os
import tempfile
import time

from absl import app, flags

flags.DEFINE_integer("meta_batch", 32, "Tasks per meta-step.")
flags.DEFINE_integer("inner_steps", 1, "Inner steps.")
flags.DEFINE_enum("order", "second", ["second", "first"], "Meta-gradient order.")
flags.DEFINE_string("formulation", "accumulate", "As benchmarks.meta_step's --formulation.")
flags.DEFINE_integer("steps", 2, "Profiled meta-steps.")
flags.DEFINE_integer("warmup", 3, "Meta-steps before profiling (the first compiles).")
flags.DEFINE_integer("top", 25, "Op types listed.")
FLAGS = flags.FLAGS

# Events of the executor itself (and of whole functions), not kernels.
_NOT_KERNELS = ("Process", "ParallelFor", "EagerExecute", "EagerKernelExecute", "Run")


def op_times(xspace_bytes: bytes, steps: int) -> dict:
    """Per op type, the kernels' time (ms) and count per step over TensorFlow's compute
    threads (``tf_Compute`` lines of the host plane), from a serialised ``XSpace``."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2
    space = xplane_pb2.XSpace()
    space.ParseFromString(xspace_bytes)
    ms, count = collections.Counter(), collections.Counter()
    for plane in space.planes:
        for line in plane.lines:
            if not line.name.startswith("tf_Compute"):
                continue
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name.split(":")[-1]
                if name in _NOT_KERNELS:
                    continue
                ms[name] += event.duration_ps / 1e9 / steps
                count[name] += 1 / steps
    return {name: (ms[name], count[name]) for name in ms}


def main(argv):
    del argv
    import tensorflow as tf
    import keras
    import metalearn
    from metalearn.training.step import make_meta_step
    from benchmarks.meta_step import _episodes, _learner
    keras.utils.set_random_seed(0)
    learner = _learner(FLAGS.formulation, FLAGS.inner_steps, FLAGS.order)
    step = make_meta_step(learner, metalearn.MetaOptimizer())
    batch = _episodes(FLAGS.meta_batch)
    for _ in range(FLAGS.warmup):
        float(step(batch)["loss"])
    with tempfile.TemporaryDirectory() as logdir:
        tf.profiler.experimental.start(logdir)
        start = time.perf_counter()
        for _ in range(FLAGS.steps):
            float(step(batch)["loss"])
        wall = (time.perf_counter() - start) / FLAGS.steps * 1000
        tf.profiler.experimental.stop()
        path = glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)[0]
        with open(path, "rb") as f:
            times = op_times(f.read(), FLAGS.steps)
    busy = sum(ms for ms, _ in times.values())
    ranked = sorted(times.items(), key=lambda item: -item[1][0])[:FLAGS.top]
    print(json.dumps(dict(
        meta_batch=FLAGS.meta_batch, inner_steps=FLAGS.inner_steps, order=FLAGS.order,
        formulation=FLAGS.formulation, wall_ms_per_step=round(wall, 1),
        kernel_ms_per_step=round(busy, 1),
        ops=[dict(op=name, ms=round(ms, 1), per_step=round(n), share=round(ms / busy, 3))
             for name, (ms, n) in ranked])))


if __name__ == "__main__":
    app.run(main)
