r"""A learned optimizer against hand-tuned SGD and Adam on held-out sinusoid tasks.

    python -m benchmarks.learned_optimizer --steps=1000 --output=/tmp/lopt.json
    python -m benchmarks.learned_optimizer --gin_file=experiments/sinusoid/learned_optimizer_truncated.gin --steps=2000 --seeds=0,1,2

1. The experiment of ``--gin_file`` is built (by default
   ``experiments/sinusoid/learned_optimizer.gin``): the MAML paper's MLP 1-40-40-1 ReLU
   at one fixed random initialisation (``FixedInit``), the rule ``LearnedRule`` as the
   inner update over the config's horizon ``H`` (its ``GradientDescent.steps``: 20 there,
   100 in ``learned_optimizer_truncated.gin`` and ``learned_optimizer_pes.gin``), and
   the config's outer rule: full backpropagation through the ``H`` steps
   (``MetaGradient``), truncated backpropagation (``TruncatedUnroll``) or PES
   (``PersistentES``) through a trajectory carried across outer steps.
2. The baselines start from the same weights: ``GradientStep(lr)`` (SGD) and
   ``InnerAdam(lr)`` (Keras' Adam), each rate tuned on a grid (``--sgd_grid``,
   ``--adam_grid``) on ``--tune_tasks`` *validation* tasks (``--tune_split=train`` for a
   sampler without validation classes), separately at each horizon
   (``--horizons``; by default 1x, 2x and 5x ``H``).
3. The rule's base step is set to Adam's best rate at the first horizon, so the
   untrained rule is tuned Adam (it starts as Adam, ``metalearn/adapters/learned_optimizer.py``); it
   is then meta-trained for ``--steps`` outer steps of the config's rule (its meta-batch
   of training tasks), once per meta-training seed (``--seeds``: the rule network's
   initial weights ``LearnedRule.seed``, the task stream's seed and an ES rule's noise
   seed; the model's fixed initialisation is the config's and the same for all).
4. Everything is evaluated on the same ``--eval_tasks`` held-out *test* tasks (the
   config's query loss after each horizon, MSE on sinusoids: mean and 95 % interval over
   tasks; the learner's other metrics, such as accuracy, beside it), with the paired
   difference rule - Adam per task (mean, interval, fraction of tasks the rule wins);
   over several seeds, the seeds' means with a t interval across seeds.
5. Drop-in: each meta-trained rule is saved (``LearnedRule.save``), loaded into a
   ``LearnedRuleOptimizer`` and used in ``model.fit`` (full-batch steps on the 10
   support points, ``H`` steps) on ``--keras_tasks`` new tasks with a model initialised
   from another seed, against ``keras.optimizers.Adam``/``SGD`` at the tuned rates;
   and on tasks from outside the family (lines ``y = a x + b``); ``--keras_tasks=0``
   leaves this out (another task family than sinusoids).
6. ``--include``: the seeds of earlier outputs of the same setting (gin file, bindings,
   meta-steps, task counts; checked, with the tuned rates) join this run's before the
   table and the intervals across seeds are computed, so more seeds can be added to a
   result without meta-training the first ones again (every run is deterministic).

Prints one JSON object (also written to ``--output``); ``--plot`` writes a figure.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from typing import Dict, List, Optional, Sequence

import numpy as np
from absl import app, flags, logging

flags.DEFINE_integer("steps", 1000, "Meta-training steps of the rule.")
flags.DEFINE_integer("eval_tasks", 300, "Held-out test tasks.")
flags.DEFINE_integer("tune_tasks", 100, "Validation tasks for tuning the baselines' rates.")
flags.DEFINE_list("sgd_grid", ["0.003", "0.01", "0.03", "0.1", "0.3"], "SGD rates.")
flags.DEFINE_list("adam_grid", ["0.003", "0.01", "0.03", "0.1", "0.3"], "Adam rates.")
flags.DEFINE_list("horizons", [], "Inner steps evaluated; by default 1x, 2x and 5x the "
                  "config's horizon.")
flags.DEFINE_string("gin_file", "experiments/sinusoid/learned_optimizer.gin",
                    "The learned optimizer's config (relative to the repository root or "
                    "absolute): the rule, its horizon and the outer rule that meta-trains it.")
flags.DEFINE_list("seeds", ["0"], "Meta-training seeds (one rule meta-trained per seed; "
                  "none, with --include: the baselines evaluated again beside earlier "
                  "seeds).")
flags.DEFINE_integer("keras_tasks", 20, "Tasks of the Keras drop-in comparison (sinusoids "
                     "and lines; 0 leaves it out, e.g. for another task family).")
flags.DEFINE_enum("tune_split", "validation", ["train", "validation"], "The split whose "
                  "tasks tune the baselines' rates (train: for a sampler without "
                  "validation classes; the test tasks are never used).")
flags.DEFINE_integer("log_every", 50, "Meta-steps between curve points.")
flags.DEFINE_multi_string("gin_param", [], "Extra gin bindings.")
flags.DEFINE_list("include", [], "Outputs (--output) of earlier runs of the same setting "
                  "whose seeds join this run's.")
flags.DEFINE_string("output", "", "Also write the JSON here.")
flags.DEFINE_string("plot", "", "Write a figure of the held-out losses here (.png).")
FLAGS = flags.FLAGS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _interval(values: Sequence[float]) -> Dict[str, float]:
    values = np.asarray(values, np.float64)
    return {"mean": float(values.mean()),
            "ci95": float(1.96 * values.std(ddof=1) / np.sqrt(len(values)))}


def _evaluate(learner, sampler, horizons: List[int], tasks: int, split: str,
              figures: Optional[Dict[str, Dict[str, Dict[str, float]]]] = None):
    """The per-task query losses after each horizon; with ``figures``, the intervals of
    the learner's other metrics (accuracy) are added to it by metric and horizon."""
    import metalearn
    report = metalearn.training.evaluate(learner, sampler, num_tasks=tasks,
                                         inner_steps=horizons, split=split, seed=0,
                                         formulation=metalearn.execution.Batched())
    for h in horizons:
        for metric, per_task in report["per_task"][str(h)].items():
            if figures is not None and metric != "loss":
                figures.setdefault(metric, {})[str(h)] = _interval(per_task)
    return {h: np.asarray(report["per_task"][str(h)]["loss"], np.float64) for h in horizons}


def _baseline(experiment, update):
    import metalearn
    from metalearn.adapters import GradientDescent, WhileLoop
    from metalearn.learners import FixedInit
    learner = experiment.learner
    return metalearn.Learner(learner.model, GradientDescent(20, update=update,
                                                            wrappers=[WhileLoop()]),
                             loss=learner.loss, metrics=learner.metrics,
                             task_init=[FixedInit()])


def _tune(experiment, make, grid, horizons):
    """The best rate at each horizon on validation tasks, and every rate's loss."""
    losses = {}
    for rate in grid:
        per = _evaluate(_baseline(experiment, make(float(rate))), experiment.sampler,
                        horizons, FLAGS.tune_tasks, FLAGS.tune_split)
        losses[rate] = {h: float(np.mean(v)) for h, v in per.items()}
    best = {}
    for h in horizons:
        scores = {r: losses[r][h] for r in grid}
        best[h] = float(min((s, float(r)) for r, s in scores.items()
                            if np.isfinite(s))[1])
    return best, losses


def _keras_comparison(rule_path: str, rates: Dict[str, float], tasks: int, steps: int):
    """model.fit with the loaded rule against Keras' Adam and SGD at the tuned rates:
    query MSE after ``steps`` full-batch steps on new sinusoid tasks (a model from
    another seed) and on lines from outside the family."""
    import keras
    from metalearn import models
    from metalearn.adapters import LearnedRule, LearnedRuleOptimizer
    rng = np.random.default_rng(123)
    families = {
        "sinusoid": lambda x, a, p: a * np.sin(x - p),
        "line (outside the family)": lambda x, a, p: (a / 5.0) * x + (p - 1.5),
    }
    makers = {
        "learned_rule": lambda: LearnedRuleOptimizer(LearnedRule.load(rule_path)),
        "adam": lambda: keras.optimizers.Adam(rates["adam"]),
        "sgd": lambda: keras.optimizers.SGD(rates["sgd"]),
    }
    result = {}
    for family, fn in families.items():
        losses = {name: [] for name in makers}
        for task in range(tasks):
            a, p = rng.uniform(0.1, 5.0), rng.uniform(0, np.pi)
            x = rng.uniform(-5, 5, (20, 1)).astype("float32")
            y = fn(x, a, p).astype("float32")
            for name, make in makers.items():
                keras.utils.set_random_seed(1000 + task)  # not the meta-training init
                model = models.mlp((1,), hidden=(40, 40), outputs=1, activation="relu")
                model.compile(optimizer=make(), loss="mse")
                model.fit(x[:10], y[:10], epochs=steps, batch_size=10, verbose=0,
                          shuffle=False)
                losses[name].append(float(model.evaluate(x[10:], y[10:], verbose=0)))
        diff = np.asarray(losses["learned_rule"]) - np.asarray(losses["adam"])
        result[family] = {**{n: _interval(v) for n, v in losses.items()},
                          "rule_minus_adam": _interval(diff),
                          "rule_wins": float(np.mean(diff < 0))}
    return result


LABELS = {"sgd": "SGD, rate tuned per horizon", "adam": "Adam, rate tuned per horizon",
          "rule_untrained": "learned rule, untrained (= Adam)",
          "rule_trained": "learned rule, meta-trained"}


def _plot(path: str, horizons, table, seeds: int = 1, title: str = ""):
    """Bars of the held-out losses with their 95 % intervals (over tasks; the
    meta-trained rule's over seeds when there are several)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    names = list(table)
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        means = [table[name][str(h)]["mean"] for h in horizons]
        errs = [table[name][str(h)]["ci95"] for h in horizons]
        label = LABELS.get(name, name)
        if name == "rule_trained" and seeds > 1:
            label += f" ({seeds} seeds, interval over seeds)"
        ax.bar(np.arange(len(horizons)) + i * width, means, width, yerr=errs, label=label,
               capsize=3)
    if title:
        ax.set_title(title, fontsize=9)
    ax.set_xticks(np.arange(len(horizons)) + 0.4 - width / 2)
    ax.set_xticklabels([f"{h} steps" for h in horizons])
    ax.set_ylabel("held-out query loss")
    ax.set_yscale("log")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _build(gin_file: str, params: List[str]):
    """The experiment of ``gin_file`` and ``params``, and its learned rule."""
    import gin
    import metalearn
    from metalearn.adapters import LearnedRule
    path = gin_file if os.path.isabs(gin_file) else os.path.join(ROOT, gin_file)
    metalearn.training.parse_config([path], params)
    experiment = metalearn.training.build_experiment()
    # a sampler given its loader by reference (@load_omniglot) loads when first used:
    # while the bindings hold
    experiment.sampler.dataset(experiment.meta_batch_size, seed=0)
    gin.clear_config()
    rules = [p for p in experiment.learner.adapter.parts() if isinstance(p, LearnedRule)]
    if not rules:
        raise ValueError(f"{gin_file} has no LearnedRule in its inner loop")
    return experiment, rules[0]


def _meta_train(experiment, seed: int, steps: int):
    """``steps`` outer steps of the config's rule on the training stream of ``seed``:
    the curve (every ``--log_every`` steps) and the seconds after the first step (its
    tracing excluded)."""
    import metalearn
    step = metalearn.training.make_meta_step(experiment.learner, experiment.outer_rule,
                                             experiment.formulation)
    stream = iter(experiment.sampler.dataset(experiment.meta_batch_size, seed=seed))
    curve, start = [], None
    for done in range(1, steps + 1):
        loss = float(step(next(stream))["loss"].numpy())
        if start is None:
            start = time.perf_counter()
        if done % FLAGS.log_every == 0 or done == 1:
            curve.append({"step": done, "loss": loss,
                          "seconds": round(time.perf_counter() - start, 2)})
            logging.info("seed %d: meta-step %d/%d, loss %.4f", seed, done, steps, loss)
    return curve, time.perf_counter() - start


def _over_seeds(per_seed: List[Dict[str, float]]) -> Dict[str, float]:
    from metalearn.statistics import seed_interval
    return seed_interval([s["mean"] for s in per_seed])


SAME = {"gin_file": None, "meta_steps": None, "eval_tasks": None, "tune_tasks": None,
        "tune_split": "validation", "gin_params": None, "horizons": None,
        "tuned_rates": None, "rule_base_step": None}
"""What an included output must share with this run (the value an output written before
the key existed had)."""


def _included(paths: Sequence[str], setting: Dict, seeds: Sequence[int]) -> List[Dict]:
    """The seeds' runs of the earlier outputs ``paths``, checked against ``setting``."""
    runs: List[Dict] = []
    for path in paths:
        with open(path) as f:
            earlier = json.load(f)
        for key in SAME:
            if earlier.get(key, SAME[key]) != setting[key]:
                raise ValueError(f"--include={path}: its {key} is {earlier.get(key)!r}, "
                                 f"this run's {setting[key]!r}; expected the same setting")
        runs.extend(earlier["seeds"])
    taken = [r["seed"] for r in runs] + list(seeds)
    repeated = sorted({s for s in taken if taken.count(s) > 1})
    if repeated:
        raise ValueError(f"--include: seed(s) {repeated} appear more than once; expected "
                         f"each meta-training seed once across the runs")
    return runs


def main(argv):
    del argv
    from metalearn.adapters import GradientStep, InnerAdam
    seeds = [int(s) for s in FLAGS.seeds]
    experiment, rule = _build(FLAGS.gin_file, list(FLAGS.gin_param))
    experiment.runtime.apply()
    horizon = int(experiment.learner.adapter.steps)
    horizons = ([int(h) for h in FLAGS.horizons] if FLAGS.horizons
                else [horizon, 2 * horizon, 5 * horizon])
    sampler = experiment.sampler

    started = time.perf_counter()
    sgd_best, sgd_grid = _tune(experiment, GradientStep, FLAGS.sgd_grid, horizons)
    adam_best, adam_grid = _tune(experiment, InnerAdam, FLAGS.adam_grid, horizons)
    tuning_seconds = time.perf_counter() - started
    logging.info("tuned in %.0f s: SGD %s, Adam %s", tuning_seconds, sgd_best, adam_best)
    base_step = adam_best[horizons[0]]
    rule.learning_rate = base_step

    per_task, figures = {}, {}  # figures: the other metrics' intervals (accuracy)
    for name, best, make in (("sgd", sgd_best, GradientStep), ("adam", adam_best, InnerAdam)):
        per_task[name] = {h: _evaluate(_baseline(experiment, make(best[h])), sampler, [h],
                                       FLAGS.eval_tasks, "test",
                                       figures.setdefault(name, {}))[h] for h in horizons}
    per_task["rule_untrained"] = _evaluate(experiment.learner, sampler, horizons,
                                           FLAGS.eval_tasks, "test",
                                           figures.setdefault("rule_untrained", {}))
    table = {name: {str(h): _interval(v[h]) for h in horizons} for name, v in per_task.items()}

    json_keys = lambda d: {str(h): r for h, r in d.items()}
    setting = {"gin_file": FLAGS.gin_file, "meta_steps": FLAGS.steps,
               "eval_tasks": FLAGS.eval_tasks, "tune_tasks": FLAGS.tune_tasks,
               "tune_split": FLAGS.tune_split, "gin_params": list(FLAGS.gin_param),
               "horizons": horizons,
               "tuned_rates": {"sgd": json_keys(sgd_best), "adam": json_keys(adam_best)},
               "rule_base_step": base_step}
    runs = _included(FLAGS.include, setting, seeds)
    for seed in seeds:
        # the same fixed model initialisation (the config's Runtime.seed); the rule's
        # network, the task stream and an ES rule's noise from the meta-training seed
        trained, rule = _build(FLAGS.gin_file, list(FLAGS.gin_param)
                               + [f"LearnedRule.seed = {seed}"])
        trained.runtime.apply()
        if hasattr(trained.outer_rule, "seed"):
            trained.outer_rule.seed = seed
        rule.learning_rate = base_step
        curve, train_seconds = _meta_train(trained, seed, FLAGS.steps)
        seed_figures: Dict[str, Dict[str, Dict[str, float]]] = {}
        losses = _evaluate(trained.learner, sampler, horizons, FLAGS.eval_tasks, "test",
                           seed_figures)
        paired = {}
        for h in horizons:
            diff = losses[h] - per_task["adam"][h]
            paired[str(h)] = {**_interval(diff), "rule_wins": float(np.mean(diff < 0))}
        keras_result = None
        if FLAGS.keras_tasks > 0:
            with tempfile.TemporaryDirectory() as folder:
                path = os.path.join(folder, "rule.npz")
                rule.save(path)
                keras_result = _keras_comparison(path, {"adam": adam_best[horizons[0]],
                                                        "sgd": sgd_best[horizons[0]]},
                                                 FLAGS.keras_tasks, horizons[0])
        runs.append({"seed": seed, "train_seconds": round(train_seconds, 1),
                     "held_out_test_mse": {str(h): _interval(losses[h]) for h in horizons},
                     "other_metrics": seed_figures,
                     "rule_minus_adam": paired, "keras_drop_in": keras_result,
                     "curve": curve})
    # one seed: its interval over tasks; several: the seeds' means, a t interval
    table["rule_trained"] = (runs[0]["held_out_test_mse"] if len(runs) == 1 else
                             {str(h): _over_seeds([r["held_out_test_mse"][str(h)]
                                                   for r in runs]) for h in horizons})
    figures["rule_trained"] = {
        metric: (runs[0]["other_metrics"][metric] if len(runs) == 1 else
                 {str(h): _over_seeds([r["other_metrics"][metric][str(h)] for r in runs])
                  for h in horizons})
        for metric in runs[0].get("other_metrics", {})}
    result = {
        "command": "python -m benchmarks.learned_optimizer " + " ".join(
            [f"--{k}={v}" for k, v in (("gin_file", FLAGS.gin_file), ("steps", FLAGS.steps),
                                       ("seeds", ",".join(FLAGS.seeds)),
                                       ("eval_tasks", FLAGS.eval_tasks),
                                       ("tune_tasks", FLAGS.tune_tasks))]
            + [f"--gin_param='{p}'" for p in FLAGS.gin_param]),
        **setting, "horizon": horizon,
        "outer_rule": type(experiment.outer_rule).__name__,
        "included": list(FLAGS.include),
        "grids": {"sgd": {r: {str(h): v for h, v in d.items()} for r, d in sgd_grid.items()},
                  "adam": {r: {str(h): v for h, v in d.items()} for r, d in adam_grid.items()}},
        "held_out_test_mse": table,  # the config's query loss (MSE on sinusoids)
        "other_metrics": figures,
        "rule_minus_adam_over_seeds": {
            str(h): _over_seeds([r["rule_minus_adam"][str(h)] for r in runs])
            for h in horizons},
        "seeds": runs,
        "tuning_seconds": round(tuning_seconds, 1),
    }
    text = json.dumps(result)
    print(text)
    if FLAGS.output:
        with open(FLAGS.output, "w") as f:
            f.write(text + "\n")
    if FLAGS.plot:
        _plot(FLAGS.plot, horizons, table, len(runs),
              f"{result['outer_rule']}, horizon {horizon}, {FLAGS.steps} meta-steps; "
              f"{FLAGS.eval_tasks} held-out tasks")


if __name__ == "__main__":
    app.run(main)
