r"""Evolution strategies against the gradient rule: MAML on sinusoids (the MAML paper's
model and tasks, experiments/sinusoid/maml.gin), meta-trained by ``MetaGradient`` and
by ``EvolutionStrategies`` (experiments/sinusoid/maml_es.gin), compared at the same
number of meta-steps and at the same wall time.

    python -m benchmarks.es_vs_gradient --steps=300 --output=/tmp/es_vs_gradient.json \
        --plot=/tmp/es_vs_gradient.png

1. ES runs ``--steps`` meta-steps; its wall time ``T`` is counted from the end of the
   first (compiling) step.
2. The gradient rule runs ``--steps`` meta-steps from the same initial weights and the
   same task stream (evaluated there: "same steps"), then goes on until its own wall
   time, counted the same way, reaches ``T`` ("same wall time").
3. Each is evaluated on ``--eval_tasks`` held-out test tasks (10 shots, seed 0): query
   MSE after 10 inner steps, mean and 95 % interval (``metalearn.training.evaluate``;
   evaluation time is not counted). The untrained model is evaluated too.

4. With ``--eval_every`` > 0, the test curves: ES is evaluated every ``--eval_every``
   steps; the gradient rule at the same steps up to ``--steps``, then each time its wall
   time passes one of ES's evaluation times, so that both curves have points at equal
   steps and at equal time (on ``--curve_tasks`` tasks; the clock is paused while
   evaluating). ``--plot`` draws them against meta-steps and against wall time.

Prints one JSON object (also written to ``--output``): the results and the curves (the
loss each rule reports, every ``--log_every`` steps, with the wall time; ES reports its
population's mean loss, the smoothed meta-loss it descends; and the test curves).
"""

from __future__ import annotations

import json
import os
import time
from typing import Dict, List

import gin
from absl import app, flags

flags.DEFINE_integer("steps", 300, "Meta-steps of ES (and of the gradient rule's "
                     "same-steps point).")
flags.DEFINE_integer("eval_tasks", 200, "Held-out test tasks per evaluation.")
flags.DEFINE_integer("log_every", 25, "Steps between curve points.")
flags.DEFINE_multi_string("es_param", [], "Extra gin bindings for the ES run, e.g. "
                          "'EvolutionStrategies.population = 16'.")
flags.DEFINE_integer("max_gradient_steps", 200_000, "A bound on the same-wall-time run.")
flags.DEFINE_integer("eval_every", 0, "Steps of ES between test-curve points (0: no "
                     "curves).")
flags.DEFINE_integer("curve_tasks", 100, "Held-out test tasks per test-curve point.")
flags.DEFINE_string("output", "", "Also write the JSON here.")
flags.DEFINE_string("plot", "", "Draw the test curves (needs --eval_every) to this PNG.")
FLAGS = flags.FLAGS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAML = os.path.join(ROOT, "experiments", "sinusoid", "maml.gin")
MAML_ES = os.path.join(ROOT, "experiments", "sinusoid", "maml_es.gin")


def _build(gin_file: str, params: List[str]):
    import metalearn
    metalearn.training.parse_config([gin_file], params)
    experiment = metalearn.training.build_experiment()
    experiment.runtime.apply()
    step = metalearn.training.make_meta_step(
        experiment.learner, experiment.outer_rule, experiment.formulation,
        jit_compile=experiment.runtime.jit_compile)
    stream = iter(experiment.sampler.dataset(experiment.meta_batch_size,
                                             seed=experiment.runtime.seed))
    gin.clear_config()
    return experiment, step, stream


def _evaluate(experiment, num_tasks: int = 0) -> Dict[str, float]:
    import metalearn
    report = metalearn.training.evaluate(
        experiment.learner, experiment.sampler, num_tasks=num_tasks or FLAGS.eval_tasks,
        inner_steps=(10,), formulation=metalearn.execution.MapFn())
    loss = report["results"]["10"]["loss"]
    return {"mse_10_steps": loss["mean"], "ci95": loss["ci95"]}


def _train(step, stream, steps: int, seconds: float = float("inf"),
           evaluate_at=None, experiment=None, curve_at=None):
    """``steps`` meta-steps, or until the wall time after the first step passes
    ``seconds``; returns (curve, wall seconds after the first step, steps run, the
    evaluation at step ``evaluate_at``, the test curve). ``curve_at(done, elapsed)``
    says whether to add a test-curve point after this step."""
    curve, start, done, at_point, tests = [], None, 0, None, []
    paused = 0.0
    while done < steps:
        loss = float(step(next(stream))["loss"].numpy())
        done += 1
        now = time.perf_counter()
        if start is None:
            start = now
        elapsed = now - start - paused
        if done % FLAGS.log_every == 0 or done == 1:
            curve.append({"step": done, "seconds": round(elapsed, 3), "loss": loss})
        if evaluate_at is not None and done == evaluate_at:
            before = time.perf_counter()
            at_point = {"step": done, "seconds": round(elapsed, 3), **_evaluate(experiment)}
            paused += time.perf_counter() - before
        if curve_at is not None and curve_at(done, elapsed):
            before = time.perf_counter()
            tests.append({"step": done, "seconds": round(elapsed, 3),
                          **_evaluate(experiment, FLAGS.curve_tasks)})
            paused += time.perf_counter() - before
        if elapsed >= seconds:
            break
    return curve, elapsed, done, at_point, tests


def _every(n: int):
    return lambda done, elapsed: n > 0 and done % n == 0


def _equal_steps_then_times(n: int, steps: int, times: List[float]):
    """The gradient rule's test points: every ``n`` steps up to ``steps``, then at the
    first step past each of ``times`` (ES's evaluation times) not yet reached."""
    pending = sorted(times)

    def at(done: int, elapsed: float) -> bool:
        due = False
        while pending and elapsed >= pending[0]:
            pending.pop(0)
            due = True
        return n > 0 and ((done <= steps and done % n == 0) or (done > steps and due))
    return at


def _plot(path: str, untrained: Dict[str, float], tests: Dict[str, list], title: str):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, key, label in ((axes[0], "step", "meta-steps"),
                           (axes[1], "seconds", "wall seconds (compile step excluded)")):
        for name, points in tests.items():
            x = [0] + [p[key] for p in points]
            y = [untrained["mse_10_steps"]] + [p["mse_10_steps"] for p in points]
            ci = [untrained["ci95"]] + [p["ci95"] for p in points]
            ax.plot(x, y, marker="o", markersize=3, label=name)
            ax.fill_between(x, [a - b for a, b in zip(y, ci)],
                            [a + b for a, b in zip(y, ci)], alpha=0.12)
        ax.set_xscale("symlog", linthresh=1 if key == "seconds" else 10)
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"test MSE after 10 inner steps ({FLAGS.curve_tasks} tasks, 95 %)")
    axes[0].legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv):
    del argv
    import metalearn  # noqa: F401  (registers the configurables)
    if FLAGS.plot and FLAGS.eval_every <= 0:
        raise app.UsageError(f"--plot needs test curves: --eval_every={FLAGS.eval_every}, "
                             "expected a positive number of steps")
    es, es_step, es_stream = _build(MAML_ES, list(FLAGS.es_param))
    rule = es.outer_rule
    untrained = _evaluate(es)
    es_curve, es_seconds, _, _, es_tests = _train(
        es_step, es_stream, FLAGS.steps, experiment=es, curve_at=_every(FLAGS.eval_every))
    es_result = {"step": FLAGS.steps, "seconds": round(es_seconds, 3), **_evaluate(es)}

    grad, grad_step, grad_stream = _build(MAML, [])
    curve, seconds, done, same_steps, grad_tests = _train(
        grad_step, grad_stream, FLAGS.max_gradient_steps, seconds=es_seconds,
        evaluate_at=FLAGS.steps, experiment=grad,
        curve_at=_equal_steps_then_times(FLAGS.eval_every, FLAGS.steps,
                                         [p["seconds"] for p in es_tests]))
    same_time = {"step": done, "seconds": round(seconds, 3), **_evaluate(grad)}
    result = {
        "es": {"population": rule.population, "sigma": rule.sigma,
               "centred_ranks": rule.centred_ranks, "optimizer": type(rule.optimizer).__name__,
               "learning_rate": float(rule.optimizer.learning_rate.numpy()),
               **es_result},
        "untrained": untrained,
        "gradient_same_steps": same_steps,
        "gradient_same_wall_time": same_time,
        "eval_tasks": FLAGS.eval_tasks, "es_params": list(FLAGS.es_param),
        "curves": {"es": es_curve, "gradient": curve},
        "test_curves": {"es": es_tests, "gradient": grad_tests},
    }
    text = json.dumps(result)
    print(text)
    if FLAGS.output:
        with open(FLAGS.output, "w") as f:
            f.write(text + "\n")
    if FLAGS.plot:
        _plot(FLAGS.plot, untrained,
              {f"ES ({rule.population} pairs)": es_tests, "meta-gradient": grad_tests},
              "MAML on sinusoids: evolution strategies against the meta-gradient")


if __name__ == "__main__":
    app.run(main)
