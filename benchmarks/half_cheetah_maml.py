"""MAML against the pretrained baseline on a Python environment (HalfCheetah velocity or
direction, MuJoCo), through the library's entry points: for each of the two runs,
what ``python -m metalearn.train`` then ``python -m metalearn.evaluate`` do (training
with checkpoints, resume and TensorBoard summaries in ``<workdir>/<run>``; the returns
after 0, 1, 2, 3 adaptation steps on held-out tasks with 95 % intervals, written to
``<workdir>/<run>/eval.json``), then the collector's environment steps per second on
one meta-batch. Rerunning resumes each run from its checkpoints (a finished one is
only read back).

    python benchmarks/half_cheetah_maml.py --gin_file=experiments/rl/half_cheetah_vel_maml.gin --workdir=runs/half_cheetah_vel

The runs: ``maml`` (the config as it is) and ``pretrained`` (the same with
``GradientDescent.steps = 0``: one policy trained on all tasks jointly, then the inner
steps at evaluation); ``--nobaseline`` runs MAML only. The same by hand::

    python -m metalearn.train --gin_file=experiments/rl/half_cheetah_vel_maml.gin --workdir=runs/half_cheetah_vel/maml
    python -m metalearn.evaluate --workdir=runs/half_cheetah_vel/maml
    python -m metalearn.train --gin_file=experiments/rl/half_cheetah_vel_maml.gin --workdir=runs/half_cheetah_vel/pretrained --gin_param='GradientDescent.steps = 0'
    python -m metalearn.evaluate --workdir=runs/half_cheetah_vel/pretrained
"""

from __future__ import annotations

import json
import os
import time
from typing import Dict, Sequence

import tensorflow as tf
from absl import app, flags

from metalearn import evaluate as evaluate_entry  # --gin_file, --gin_param, --module, --workdir, --output
from metalearn.runs.experiment import apply_configured_threads
from metalearn.training import build_experiment, parse_config, train

FLAGS = flags.FLAGS
RUNS = {"maml": [], "pretrained": ["GradientDescent.steps = 0"]}
"""Each run's gin bindings on top of the config's."""


def define_flags() -> None:
    """The script's own flags (``--gin_file``, ``--gin_param``, ``--module``,
    ``--workdir``: the root of the runs, and ``--output``: the summary, relative to it,
    are :mod:`metalearn.evaluate`'s), defined when it runs."""
    flags.DEFINE_bool("baseline", True, "also run the pretrained baseline "
                      "(GradientDescent.steps = 0)")


def throughput(workdir: str) -> float:
    """Environment steps per second of the restored run's collection (its sampler's
    :meth:`~metalearn.tasks.TaskSampler.collection`, one step's meta-batch): the policy
    called per environment step and the in-graph adaptation between collections."""
    from metalearn.training import restore
    experiment = restore(workdir)
    collection = experiment.sampler.collection(experiment.learner)
    if collection is None:
        raise ValueError(f"{type(experiment.sampler).__name__} collects nothing outside "
                         "the step: this script is for Python environments")
    batch = experiment.sampler.sample(tf.constant([experiment.seed, 0], tf.int64),
                                      experiment.meta_batch_size)
    try:
        collection(batch)  # compiles the policy and the adaptation
        taken, start = collection.collector.steps_taken, time.perf_counter()
        collection(batch)
        return (collection.collector.steps_taken - taken) / (time.perf_counter() - start)
    finally:
        collection.close()


def run(gin_files: Sequence[str], gin_params: Sequence[str], workdir: str,
        baseline: bool = True, modules: Sequence[str] = ()) -> Dict:
    """Trains and evaluates each run in ``workdir/<run>``, as the entry points do; the
    evaluation reports by run, the seconds each run took and the collector's
    throughput."""
    results: Dict = {"runs": {}, "seconds": {}}
    for name, params in RUNS.items():
        if name != "maml" and not baseline:
            continue
        start, run_dir = time.time(), os.path.join(workdir, name)
        parse_config(list(gin_files), list(gin_params) + params, modules=modules)
        apply_configured_threads()
        train(build_experiment(), run_dir)
        report = evaluate_entry.run(run_dir)
        results["runs"][name] = report["results"]
        results["seconds"][name] = time.time() - start
    results["env_steps_per_second"] = throughput(os.path.join(workdir, "maml"))
    return results


def table(results: Dict, metric: str = "return") -> str:
    """The returns after each number of adaptation steps, a column per run."""
    names = list(results["runs"])
    steps = list(results["runs"][names[0]])
    lines = ["| adaptation steps | " + " | ".join(names) + " |",
             "| --- |" + " --- |" * len(names)]
    for s in steps:
        cells = [results["runs"][n][s][metric] for n in names]
        lines.append(f"| {s} | " + " | ".join(f"{c['mean']:.1f} ± {c['ci95']:.1f}"
                                               for c in cells) + " |")
    return "\n".join(lines)


def main(argv):
    del argv
    results = run(FLAGS.gin_file, FLAGS.gin_param, FLAGS.workdir, FLAGS.baseline,
                  FLAGS.module)
    print(table(results))
    print(json.dumps({k: v for k, v in results.items() if k != "runs"}, indent=1))
    output = os.path.join(FLAGS.workdir, FLAGS.output)
    with open(output, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    define_flags()
    flags.FLAGS.set_default("output", "benchmark.json")
    app.run(main)
