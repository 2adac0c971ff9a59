r"""The in-context learner against Prototypical Networks on Omniglot, same wall time.

    PYTHONPATH=. python benchmarks/in_context.py --seconds=360 --out=runs/icl_wall
    PYTHONPATH=. python benchmarks/in_context.py --out=runs/icl_wall --analyse_only
    PYTHONPATH=. python benchmarks/in_context.py --sampler_rate

Each of experiments/omniglot/minimal/{in_context,protonets}_5way_1shot.gin (5-way 1-shot
on the minimal split, the same protocol: meta-batch 32, 1 query per class, Adam 1e-3) is
meta-trained by ``python -m metalearn.train`` stopped with SIGTERM after ``--seconds``
of wall time (the step under way finishes and is checkpointed), then evaluated by
``python -m metalearn.evaluate`` on the same 600 test episodes (the evaluation files'
``episodes`` digests must agree). Prints the accuracies with 95% intervals, the steps
each run reached, and the paired difference on the same episodes
(``metalearn.statistics.paired_difference``). The timings are those of whatever else
the machine runs.

``--sampler_rate`` measures instead the episodes per second that the random task priors
(``metalearn.tasks.RandomMLPFunctions``, ``RandomLinearClassification``) stream through
``tf.data`` in batches of 25, as the training loop iterates them.
"""

from __future__ import annotations

import json
import os

from absl import app, flags

from benchmarks.wall_time import run_main, stream_rate, train_and_evaluate
from metalearn.statistics import paired_difference

flags.DEFINE_integer("seconds", 360, "Meta-training wall time of each method.")
flags.DEFINE_string("out", "runs/icl_wall", "Folder of the workdirs.")
flags.DEFINE_bool("analyse_only", False, "Only read the workdirs' evaluations.")
flags.DEFINE_list("methods", ["in_context", "protonets"], "Which to (re)train.")
flags.DEFINE_bool("sampler_rate", False, "Measure the random task priors' episodes/s.")
FLAGS = flags.FLAGS

METHODS = ("in_context", "protonets")


def run(name: str, seconds: int, out: str) -> None:
    train_and_evaluate(f"experiments/omniglot/minimal/{name}_5way_1shot.gin",
                       os.path.join(out, name), seconds, log_every=100,
                       evaluations=[["--output=eval_5way.json"]])


def analyse(out: str) -> str:
    lines = ["| method | steps reached | test accuracy (600 episodes) |", "| --- | --- | --- |"]
    values = {}
    for name in METHODS:
        with open(os.path.join(out, name, "eval_5way.json")) as f:
            report = json.load(f)
        result = report["results"]["0"]["accuracy"]
        values[name] = (report["per_task"]["0"]["accuracy"], report["episodes"])
        lines.append(f"| {name} | {report['checkpoint_step']} | "
                     f"{100 * result['mean']:.1f} ± {100 * result['ci95']:.1f}% |")
    (a, digest_a), (b, digest_b) = values["in_context"], values["protonets"]
    if digest_a != digest_b:
        raise ValueError("the two runs were evaluated on other episodes")
    d = paired_difference(a, b)
    lines += ["", "| paired accuracy difference | a − b | 95% interval | p-value | "
              "episodes a better / b better |", "| --- | --- | --- | --- | --- |",
              f"| in_context − protonets | {100 * d['difference']:.1f} | "
              f"[{100 * d['low']:.1f}, {100 * d['high']:.1f}] | {d['p_value']:.2g} | "
              f"{d['wins_a']} / {d['wins_b']} |"]
    return "\n".join(lines)


def sampler_rate() -> str:
    from metalearn.tasks import RandomLinearClassification, RandomMLPFunctions
    samplers = {"RandomMLPFunctions(shots=10), 10 + 10 points, 1-32-32-1 tanh":
                RandomMLPFunctions(shots=10),
                "RandomLinearClassification(), 5-way 1-shot, 5 queries per class, dim 16":
                RandomLinearClassification()}
    return "\n".join(f"{name}: {stream_rate(sampler):,.0f} episodes/s"
                      for name, sampler in samplers.items())


def main(argv) -> None:
    del argv
    run_main(FLAGS, run, analyse, sampler_rate)


if __name__ == "__main__":
    app.run(main)
