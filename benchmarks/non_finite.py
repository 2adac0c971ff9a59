r"""Cost of the per-step non-finite check on the sinusoid meta-step.

    PYTHONPATH=. python -m benchmarks.non_finite --steps=500 --rounds=5

Times, in one process, the per-step work of the training loop two ways on the same
batches (the MAML paper's sinusoid MLP 1-40-40-1, meta-batch 25, second order):

* ``plain``: the meta-step without the check (``skip_non_finite=False``), reading the
  step counter on the host after each step, as the loop did before the check;
* ``in_graph``: the checked meta-step (below) with only the step counter read;
* ``checked``: the meta-step with the check inside it (``skip_non_finite=True``: the
  finiteness flags of the loss and every gradient, ``tf.cond`` around the update),
  reading the flags, the step counter and the metrics on the host after each step, as
  ``metalearn.training.train`` now does.

The three alternate in ``--rounds`` rounds of ``--steps`` steps (so that load from other
processes hits them alike); prints one JSON line with the median and the fastest round's
ms per step of each, the medians' relative difference, and the time of the checked
loop's extra host reads (flags and metrics of one step) on their own.
"""

from __future__ import annotations

import json
import statistics
import time

from absl import app, flags

flags.DEFINE_integer("steps", 500, "Meta-steps per round and variant.")
flags.DEFINE_integer("rounds", 5, "Alternating rounds.")
FLAGS = flags.FLAGS


def main(argv) -> None:
    del argv
    import tensorflow as tf
    from metalearn.training import build_experiment, distribute, parse_config
    from metalearn.outer import NON_FINITE
    from metalearn.training import step as step_builder

    parse_config(["experiments/sinusoid/maml.gin"])
    experiment = build_experiment()
    strategy = tf.distribute.get_strategy()
    learner, rule = experiment.learner, experiment.outer_rule
    steps = {flag: step_builder.make_distributed_meta_step(
                 strategy, learner, rule, experiment.formulation, skip_non_finite=flag)
             for flag in (False, True)}
    batches = list(distribute.episode_stream(strategy, experiment.sampler, 25,
                                             num_steps=FLAGS.steps))

    def plain() -> None:
        for batch in batches:
            steps[False](batch)
            int(learner.meta_step.numpy())

    def in_graph() -> None:  # the check inside the step, but no extra host reads
        for batch in batches:
            steps[True](batch)
            int(learner.meta_step.numpy())

    def checked() -> None:
        for batch in batches:
            metrics = steps[True](batch)
            metrics.pop(NON_FINITE).numpy().any()
            int(learner.meta_step.numpy())
            {name: float(value) for name, value in metrics.items()}

    variants = (("plain", plain), ("in_graph", in_graph), ("checked", checked))
    times = {name: [] for name, _ in variants}
    plain(), checked()  # trace and warm up
    for _ in range(FLAGS.rounds):
        for name, run in variants:
            start = time.perf_counter()
            run()
            times[name].append((time.perf_counter() - start) / FLAGS.steps * 1e3)
    medians = {name: statistics.median(values) for name, values in times.items()}
    fastest = {name: min(values) for name, values in times.items()}
    metrics = steps[True](batches[0])  # the loop's extra host reads alone
    start = time.perf_counter()
    for _ in range(10000):
        values = dict(metrics)
        values.pop(NON_FINITE).numpy().any()
        {name: float(value) for name, value in values.items()}
    reads_us = (time.perf_counter() - start) / 10000 * 1e6
    print(json.dumps({"ms_per_step": {k: round(v, 3) for k, v in medians.items()},
                      "fastest_round_ms_per_step": {k: round(v, 3)
                                                    for k, v in fastest.items()},
                      "host_reads_us_per_step": round(reads_us, 1),
                      "rounds": {k: [round(x, 3) for x in v] for k, v in times.items()},
                      "overhead": {k: round(medians[k] / medians["plain"] - 1, 4)
                                   for k in ("in_graph", "checked")},
                      "steps": FLAGS.steps}))


if __name__ == "__main__":
    app.run(main)
