r"""Peak memory of one meta-step as the number of inner steps grows: implicit MAML
against second-order MAML.

    PYTHONPATH=. python benchmarks/imaml_memory.py [--steps=5,10,20,50]

Each (algorithm, inner steps) configuration runs in its own subprocess, so peak resident
memory (``ru_maxrss``) is that configuration's alone. A subprocess builds an MLP
(1 -> 256 -> 256 -> 1, float32) on one sinusoid task with 1,000 support points (so that
activations, not weights, dominate), reads its resident memory (``VmRSS``), then runs
three compiled meta-steps (``metalearn.training.make_meta_step``, SGD) and reads its peak.
The growth, peak minus the memory before the first meta-step, includes tracing the
graph and everything the backward pass keeps. Second-order MAML keeps every inner step's
activations for the backward pass; iMAML keeps none (its inner loop is a
``tf.while_loop`` under ``stop_gradient``; the backward pass is conjugate gradient at
the adapted weights). Prints one JSON line per configuration and a summary.
"""

from __future__ import annotations

import json
import resource
import time

from absl import app, flags

from benchmarks import child_result, rss_mib

flags.DEFINE_string("steps", "5,10,20,50", "Inner-step counts, comma separated.")
flags.DEFINE_string("algorithms", "imaml,maml", "Comma separated: imaml, maml, "
                    "maml_recompute (GradientDescent(wrappers=[Recompute()])).")
flags.DEFINE_string("child", None, "Internal: run one configuration, 'algorithm:steps'.")
FLAGS = flags.FLAGS

SUPPORT, HIDDEN = 1000, 256




def _child(algorithm: str, steps: int) -> dict:
    import keras
    import tensorflow as tf

    import metalearn
    from metalearn import models
    from metalearn.adapters import GradientDescent, ImplicitGradientDescent, Recompute
    from metalearn.execution import Unrolled
    from metalearn.tasks import Sinusoid

    keras.utils.set_random_seed(0)
    model = models.mlp((1,), hidden=(HIDDEN, HIDDEN), outputs=1)
    if algorithm == "imaml":
        adapter = ImplicitGradientDescent(steps=steps, learning_rate=0.01,
                                          regularization=1.0, cg_steps=5)
    elif algorithm in ("maml", "maml_recompute"):
        adapter = GradientDescent(steps=steps, learning_rate=0.01, first_order=False,
                                  wrappers=[Recompute()] if algorithm == "maml_recompute"
                                  else [])
    else:
        raise ValueError("algorithm must be 'imaml', 'maml' or 'maml_recompute', got "
                         f"{algorithm!r}")
    learner = metalearn.Learner(model, adapter, loss="mse")
    episodes = Sinusoid(shots=SUPPORT, queries=100).sample(tf.constant([0, 0]), num_tasks=1)
    meta_step = metalearn.training.make_meta_step(
        learner, metalearn.MetaGradient(keras.optimizers.SGD(1e-3)), Unrolled())
    before = rss_mib()
    times = []
    for _ in range(3):
        start = time.perf_counter()
        loss = float(meta_step(episodes)["loss"])
        times.append(time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    return {"algorithm": algorithm, "inner_steps": steps, "rss_before_mib": round(before, 1),
            "peak_rss_mib": round(peak, 1), "growth_mib": round(peak - before, 1),
            "ms_per_step": round(1000 * min(times[1:]), 1), "loss": loss}


def main(argv) -> None:
    del argv
    if FLAGS.child:
        algorithm, steps = FLAGS.child.split(":")
        print(json.dumps(_child(algorithm, int(steps))))
        return
    results = []
    algorithms = FLAGS.algorithms.split(",")
    for algorithm in algorithms:
        for steps in [int(s) for s in FLAGS.steps.split(",")]:
            results.append(child_result(__file__, [f"--child={algorithm}:{steps}"],
                                        f"{algorithm}:{steps}"))
    summary = {}
    for algorithm in algorithms:
        rows = [r for r in results if r["algorithm"] == algorithm]
        summary[algorithm] = {"growth_mib_by_steps": {r["inner_steps"]: r["growth_mib"]
                                                      for r in rows},
                              "growth_ratio_last_to_first": round(
                                  rows[-1]["growth_mib"] / rows[0]["growth_mib"], 2)}
    print(json.dumps({"summary": summary}))


if __name__ == "__main__":
    app.run(main)
