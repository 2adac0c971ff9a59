"""A per-task-gradient outer rule (PCGrad) against MAML's MetaGradient on the same step.

The MAML Omniglot conv net (5-way 1-shot, 15 queries per class, one second-order inner
step), meta-batch ``--tasks``; for each formulation, both rules' compiled steps timed on
one pre-made batch, alternating rule by rule for ``--rounds`` rounds of ``--steps``
steps each after a warm-up step. Prints one JSON line: median ms per meta-step and
tasks/s per (formulation, rule), and PCGrad's time over MAML's with its spread over the
rounds.

    PYTHONPATH=. python benchmarks/per_task_gradients.py    # ~1 minute on 2 cores
"""

from __future__ import annotations

import json
import time

import keras
import numpy as np
import tensorflow as tf
from absl import app, flags

import metalearn
from metalearn import execution
from metalearn.adapters import GradientDescent
from metalearn.tasks import Episode

FLAGS = flags.FLAGS
flags.DEFINE_integer("tasks", 8, "meta-batch")
flags.DEFINE_integer("steps", 5, "timed steps per round")
flags.DEFINE_integer("rounds", 3, "rounds, each rule once per round")
flags.DEFINE_list("formulations", ["batched", "accumulate"], "formulations to time")


def episodes(tasks: int) -> Episode:
    rng = np.random.default_rng(0)
    image = lambda n: tf.constant(rng.random((tasks, n, 28, 28, 1)), tf.float32)
    label = lambda n: tf.constant(np.tile(np.arange(5), (tasks, n // 5)), tf.int64)
    return Episode(image(5), label(5), image(75), label(75))


def learner() -> metalearn.Learner:
    keras.utils.set_random_seed(0)
    return metalearn.Learner(metalearn.models.omniglot_conv_net(5),
                             GradientDescent(1, 0.4),
                             loss=metalearn.functional.softmax_cross_entropy,
                             metrics={"accuracy": "accuracy"})


def timed(rule_name: str, formulation: str, batch: Episode, steps: int):
    model = learner()
    rule = (metalearn.outer.PCGrad if rule_name == "pcgrad" else metalearn.MetaGradient)(
        keras.optimizers.SGD(1e-3))
    step = metalearn.training.make_meta_step(model, rule, execution.formulation(formulation))
    step(batch)["loss"].numpy()  # trace and warm up

    def run() -> float:
        start = time.perf_counter()
        for _ in range(steps):
            loss = step(batch)["loss"]
        loss.numpy()
        return (time.perf_counter() - start) / steps * 1000.0
    return run


def main(_):
    batch = episodes(FLAGS.tasks)
    result = {"tasks": FLAGS.tasks, "steps": FLAGS.steps, "rounds": FLAGS.rounds}
    for formulation in FLAGS.formulations:
        runs = {name: timed(name, formulation, batch, FLAGS.steps)
                for name in ("maml", "pcgrad")}
        times = {name: [] for name in runs}
        for _ in range(FLAGS.rounds):
            for name, run in runs.items():
                times[name].append(run())
        ratios = [p / m for p, m in zip(times["pcgrad"], times["maml"])]
        result[formulation] = {
            **{f"{name}_ms": float(np.median(t)) for name, t in times.items()},
            **{f"{name}_tasks_per_s": float(FLAGS.tasks * 1000.0 / np.median(t))
               for name, t in times.items()},
            "pcgrad_over_maml": float(np.median(ratios)),
            "pcgrad_over_maml_rounds": [round(r, 3) for r in ratios]}
    print(json.dumps(result))


if __name__ == "__main__":
    app.run(main)
