r"""Episodes per second of the Omniglot sampler against the meta-step's consumption.

    PYTHONPATH=. python benchmarks/sampler.py [--omniglot=../shared/data/omniglot] [--max_shift=2]

5-way 1-shot Omniglot (28x28, rotations, the minimal split of experiments/omniglot/
minimal/), meta-batch 32. Measures (1) episodes/s of ``FewShotClassification.dataset``
alone, iterated as the training loop does (decoded images in memory, batches assembled
in parallel by tf.data, prefetched), and (2) episodes/s the compiled MAML meta-step
(``metalearn.training.make_meta_step``, the Omniglot conv net, one inner step, second
order) consumes on pre-made batches. The sampler must deliver at least 10x what the
meta-step consumes, so that it is never the bottleneck. Prints one JSON line.
"""

from __future__ import annotations

import json
import os
import time

from absl import app, flags

import keras
import tensorflow as tf

import metalearn
from metalearn.tasks import FewShotClassification
from metalearn.tasks.datasets import MINIMAL_SPLIT, load_omniglot
from metalearn.training import make_meta_step

flags.DEFINE_string("omniglot", os.path.join(os.path.dirname(__file__), "..", "..",
                                             "shared", "data", "omniglot"),
                    "Folder with the Omniglot minimal zips.")
flags.DEFINE_integer("meta_batch_size", 32, "Episodes per batch.")
flags.DEFINE_integer("batches", 200, "Batches timed for the sampler.")
flags.DEFINE_integer("steps", 20, "Meta-steps timed.")
flags.DEFINE_integer("max_shift", 0, "FewShotClassification.max_shift: augment the "
                     "meta-training images by random shifts of up to this many pixels.")
FLAGS = flags.FLAGS


def sampler_rate(sampler, batch_size: int, batches: int) -> float:
    stream = iter(sampler.dataset(batch_size, seed=0))
    for _ in range(5):  # warm-up: tracing, first prefetch
        next(stream)
    start = time.perf_counter()
    for _ in range(batches):
        next(stream)
    return batches * batch_size / (time.perf_counter() - start)


def meta_step_rate(sampler, batch_size: int, steps: int) -> float:
    learner = metalearn.Learner(
        metalearn.models.omniglot_conv_net(outputs=5),
        adapter=metalearn.adapters.GradientDescent(steps=1, learning_rate=0.4),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics={"accuracy": "accuracy"})
    meta_step = make_meta_step(learner, metalearn.MetaGradient())
    batches = list(sampler.dataset(batch_size, seed=1, num_steps=steps + 2))
    for batch in batches[:2]:  # warm-up: tracing
        meta_step(batch)
    start = time.perf_counter()
    for batch in batches[2:]:
        float(meta_step(batch)["loss"])
    return steps * batch_size / (time.perf_counter() - start)


def main(argv) -> None:
    del argv
    data = load_omniglot(FLAGS.omniglot)
    sampler = FewShotClassification(data, ways=5, shots=1, queries=1, split_by="group",
                                    rotations=(0, 90, 180, 270), rotation_splits=("train",),
                                    max_shift=FLAGS.max_shift, **MINIMAL_SPLIT)
    sampled = sampler_rate(sampler, FLAGS.meta_batch_size, FLAGS.batches)
    consumed = meta_step_rate(sampler, FLAGS.meta_batch_size, FLAGS.steps)
    print(json.dumps({"sampler_episodes_per_s": round(sampled, 1),
                      "meta_step_episodes_per_s": round(consumed, 1),
                      "ratio": round(sampled / consumed, 1),
                      "meta_batch_size": FLAGS.meta_batch_size,
                      "max_shift": FLAGS.max_shift,
                      "cpu_count": os.cpu_count(), "tensorflow": tf.__version__}))


if __name__ == "__main__":
    app.run(main)
