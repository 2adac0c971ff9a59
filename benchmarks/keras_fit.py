r"""Sinusoid MAML through Keras' ``fit`` beside ``metalearn.train``, same seed.

    PYTHONPATH=. python -m benchmarks.keras_fit --steps=2000 --window=500

Builds the main job's experiment (``experiments/sinusoid/maml.gin``: the MAML paper's
MLP 1-40-40-1, meta-batch 25, one second-order inner step, Adam 1e-3, seed 0) twice from
the same config: once trained by :func:`metalearn.training.train` for ``--steps``
meta-steps with a log line every ``--window`` steps (its TensorBoard ``meta_loss``: the
mean loss of each window), once by :class:`metalearn.keras.MetaModel`'s ``fit`` with
``steps_per_epoch=--window`` (each epoch's ``loss``: the mean of the same steps). Prints
one JSON line: both series, their largest relative difference, the largest difference
of the final meta-variables and each side's wall time.
"""

from __future__ import annotations

import glob
import json
import os
import tempfile
import time

from absl import app, flags

flags.DEFINE_integer("steps", 2000, "Meta-steps of each run.")
flags.DEFINE_integer("window", 500, "Steps per logged mean (the loop's log_every, fit's "
                     "steps_per_epoch).")
FLAGS = flags.FLAGS


def _experiment(steps: int, window: int):
    from metalearn.training import build_experiment, parse_config
    parse_config(["experiments/sinusoid/maml.gin"],
                 [f"Loop.num_steps = {steps}", f"Loop.log_every = {window}",
                  f"Loop.checkpoint_every = {steps}"])
    return build_experiment()


def _window_losses(workdir: str):
    import tensorflow as tf
    found = {}
    for path in sorted(glob.glob(os.path.join(workdir, "train", "events.out.tfevents.*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.tag == "meta_loss":
                    found[event.step] = float(tf.make_ndarray(value.tensor))
    return [found[step] for step in sorted(found)]


def main(argv) -> None:
    del argv
    import numpy as np
    from metalearn.keras import MetaModel
    from metalearn.training import train

    steps, window = FLAGS.steps, FLAGS.window
    if steps % window:
        raise app.UsageError(f"--steps={steps} must be a multiple of --window={window}")
    experiment = _experiment(steps, window)
    with tempfile.TemporaryDirectory(prefix="keras_fit_") as workdir:
        start = time.perf_counter()
        train(experiment, workdir)
        train_seconds = time.perf_counter() - start
        train_losses = _window_losses(workdir)
    trained = [np.asarray(v) for v in experiment.learner.meta_variables]

    experiment = _experiment(steps, window)  # the same config: the same initial weights
    model = MetaModel.from_experiment(experiment)
    model.compile()
    start = time.perf_counter()
    history = model.fit(model.episodes(experiment.sampler, experiment.meta_batch_size,
                                       seed=experiment.seed),
                        epochs=steps // window, steps_per_epoch=window, verbose=0)
    fit_seconds = time.perf_counter() - start
    fit_losses = [float(x) for x in history.history["loss"]]
    differences = [abs(a - b) / abs(b) for a, b in zip(fit_losses, train_losses)]
    weights = max(float(np.max(np.abs(np.asarray(v) - w)))
                  for v, w in zip(experiment.learner.meta_variables, trained))
    print(json.dumps({
        "steps": steps, "window": window, "metalearn_train": train_losses,
        "keras_fit": fit_losses, "max_relative_difference": max(differences),
        "max_weight_difference": weights, "train_seconds": round(train_seconds, 1),
        "fit_seconds": round(fit_seconds, 1)}))


if __name__ == "__main__":
    app.run(main)
