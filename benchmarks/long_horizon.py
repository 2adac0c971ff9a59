r"""Long-horizon MAML on sinusoids: full backpropagation through every inner step against
truncated backpropagation and PES through a carried trajectory (metalearn.outer's
TruncatedUnroll and PersistentES), side by side: peak memory and held-out test MSE.

    PYTHONPATH=. python benchmarks/long_horizon.py --inner_steps=100 --truncation=10 \
        --steps=2000
    PYTHONPATH=. python benchmarks/long_horizon.py --steps=3 --eval_tasks=10   # a check

Each rule runs in its own subprocess, so peak resident memory (``VmHWM``) is that rule's
alone. The learner is the MAML paper's (MLP 1-40-40-1 ReLU, sinusoid tasks with 10
support and 10 query points; ``--shots`` more), ``--inner_steps`` SGD steps of ``--inner_lr`` in a
``tf.while_loop`` (the graph flat in the steps; second order), Adam ``--outer_lr``,
``--meta_batch_size`` tasks, the ``MapFn`` formulation:

* ``full``: ``MetaGradient``, backpropagation through all ``inner_steps`` (what grows
  with the horizon: the while-loop's stacks of every step's activations);
* ``truncated``: ``TruncatedUnroll(horizon=inner_steps, truncation)``, one segment of
  ``truncation`` steps backpropagated per outer step;
* ``pes``: ``PersistentES(horizon=inner_steps, truncation, population, sigma)``, no
  backpropagation, ``2 population`` particles carried.

Every rule takes ``--steps`` outer steps (a truncated rule sees a new meta-batch every
``inner_steps / truncation`` of them). Reported per rule: resident memory before the
first step and its peak over the run (tracing included, as benchmarks/imaml_memory.py
measures it), milliseconds per outer step (the median after the first), the last
logged meta-loss, and the test MSE after ``inner_steps`` inner steps on
``--eval_tasks`` held-out tasks (``metalearn.training.evaluation.evaluate``, mean and 95 %
interval). One JSON line per rule, then a summary line.
"""

from __future__ import annotations

import json
import statistics
import time

from absl import app, flags

from benchmarks import child_result

flags.DEFINE_string("rules", "full,truncated,pes", "Comma separated: full, truncated, pes.")
flags.DEFINE_integer("inner_steps", 50, "Inner steps of a whole trajectory (the horizon).")
flags.DEFINE_integer("truncation", 10, "Inner steps per outer step (truncated, pes).")
flags.DEFINE_integer("steps", 1000, "Outer steps per rule.")
flags.DEFINE_integer("meta_batch_size", 8, "Tasks per outer step.")
flags.DEFINE_integer("shots", 10, "Support (and query) points per task; more makes the "
                     "activations, not tracing, dominate the memory (e.g. 1000).")
flags.DEFINE_float("inner_lr", 0.01, "Inner SGD rate.")
flags.DEFINE_float("outer_lr", 1e-3, "Outer Adam rate.")
flags.DEFINE_integer("population", 8, "PES antithetic pairs.")
flags.DEFINE_float("sigma", 0.01, "PES noise scale.")
flags.DEFINE_integer("eval_tasks", 200, "Held-out tasks for the test MSE.")
flags.DEFINE_integer("seed", 0, "Seed of the model, the task stream and the noise.")
flags.DEFINE_string("child", None, "Internal: run one rule.")
FLAGS = flags.FLAGS


def _child(rule_name: str) -> dict:
    import keras
    import tensorflow as tf

    import metalearn
    from benchmarks import peak_rss_mib, rss_mib
    from metalearn import models
    from metalearn.adapters import GradientDescent, WhileLoop
    from metalearn.execution import MapFn
    from metalearn.outer import MetaGradient, PersistentES, TruncatedUnroll
    from metalearn.tasks import Sinusoid
    from metalearn.training.evaluation import evaluate

    keras.utils.set_random_seed(FLAGS.seed)
    horizon, truncation = FLAGS.inner_steps, FLAGS.truncation
    model = models.mlp((1,), hidden=(40, 40), outputs=1, activation="relu")
    learner = metalearn.Learner(model, GradientDescent(horizon, FLAGS.inner_lr,
                                                       wrappers=[WhileLoop()]), loss="mse")
    optimizer = keras.optimizers.Adam(FLAGS.outer_lr)
    if rule_name == "full":
        rule = MetaGradient(optimizer)
    elif rule_name == "truncated":
        rule = TruncatedUnroll(optimizer, horizon=horizon, truncation=truncation)
    elif rule_name == "pes":
        rule = PersistentES(optimizer, horizon=horizon, truncation=truncation,
                            population=FLAGS.population, sigma=FLAGS.sigma, seed=FLAGS.seed)
    else:
        raise ValueError(f"rule must be 'full', 'truncated' or 'pes', got {rule_name!r}")
    sampler = Sinusoid(shots=FLAGS.shots, queries=FLAGS.shots)
    step = metalearn.training.make_meta_step(learner, rule, MapFn(), skip_non_finite=True)
    stream = iter(sampler.dataset(FLAGS.meta_batch_size, seed=FLAGS.seed))
    before = rss_mib()
    times, losses = [], []
    for _ in range(FLAGS.steps):
        batch = next(stream)
        start = time.perf_counter()
        losses.append(float(tf.reduce_mean(step(batch)["loss"])))
        times.append(time.perf_counter() - start)
    peak = peak_rss_mib()
    window = losses[-max(1, min(100, len(losses) // 10)):]
    result = evaluate(learner, sampler, num_tasks=FLAGS.eval_tasks, inner_steps=[horizon],
                      batch_size=min(25, FLAGS.eval_tasks), seed=FLAGS.seed + 1)
    test = result["results"][str(horizon)]["loss"]
    return {"rule": rule_name, "inner_steps": horizon, "shots": FLAGS.shots,
            "truncation": None if rule_name == "full" else truncation,
            "outer_steps": FLAGS.steps, "rss_before_mib": round(before, 1),
            "peak_rss_mib": round(peak, 1), "growth_mib": round(peak - before, 1),
            "ms_per_step": round(1000 * statistics.median(times[1:] or times), 1),
            "train_loss_last": round(statistics.fmean(window), 4),
            "test_mse": round(float(test["mean"]), 4),
            "test_mse_ci95": round(float(test["ci95"]), 4),
            "eval_tasks": FLAGS.eval_tasks}


def main(argv) -> None:
    del argv
    if FLAGS.child:
        print(json.dumps(_child(FLAGS.child)))
        return
    passed = [f"--{name}={FLAGS[name].value}" for name in
              ("inner_steps", "truncation", "steps", "meta_batch_size", "shots", "inner_lr",
               "outer_lr", "population", "sigma", "eval_tasks", "seed")]
    results = [child_result(__file__, [f"--child={rule}", *passed], rule)
               for rule in FLAGS.rules.split(",")]
    print(json.dumps({"summary": {r["rule"]: {k: r[k] for k in
                                              ("peak_rss_mib", "growth_mib", "ms_per_step",
                                               "test_mse", "test_mse_ci95")}
                                  for r in results}}))


if __name__ == "__main__":
    app.run(main)
