r"""Meta-trains an experiment described by gin.

    python -m metalearn.train --gin_file=experiments/sinusoid/maml.gin \
        --gin_param='Loop.num_steps=1000' --workdir=runs/sinusoid_maml

Classes of your own (an outer rule, a learner) in a file: add --module=my_rule.py
(imported before gin parses; recorded in the workdir, so evaluate and restore import it
too). Several GPUs: add --strategy=mirrored. Several machines: run the same command on each
with --strategy=multi_worker and TF_CONFIG set (see docs/concepts/execution.md). Rerunning the same command resumes from the workdir's latest checkpoint. The workdir
receives config.gin (the operative config), checkpoints/, TensorBoard summaries in
train/ and metrics.json. --deterministic turns on TensorFlow's op determinism (the
binding Runtime.deterministic=True): a run killed at any moment then resumes to the
same weights as an uninterrupted one, and the same config and seed repeat exactly.

SIGTERM (what schedulers and `timeout` send) or Ctrl-C: the step under way finishes (a
batch being collected outside the step, a Python simulator's, is abandoned at once), a
checkpoint of it is saved, and the process exits with status 128 + the signal's number
(143, 130); rerunning resumes there. A CPU-time limit does the same when reached
(SIGXCPU, status 152): `prlimit --cpu=600:900 python -m metalearn.train ...` trains
for 600 CPU seconds, a budget that other jobs on the machine do not shrink as they
shrink a wall-clock one (the hard limit, 900, leaves room for the last step and its
checkpoint). A second process on the same workdir stops with an
error naming the pid and host of the one training there. With --strategy=multi_worker
each task first waits for the cluster's other tasks, logging which, for at most
make_strategy.peer_timeout seconds (600), and SIGTERM stops that wait too.
"""

from __future__ import annotations

import json
import sys

from absl import app, flags, logging

import metalearn  # imports nothing heavy here: main calls metalearn.import_all()
from metalearn.flags import (STRATEGIES, define_determinism_flag, define_gin_flags,
                             define_once,
                             determinism_params, resolve_gin_files)

define_gin_flags()
define_determinism_flag()
define_once(flags.DEFINE_string, "workdir", None,
            "Directory for checkpoints, summaries and results.")
flags.DEFINE_enum("strategy", None, STRATEGIES, "tf.distribute strategy; overrides the "
                  "gin binding make_strategy.name (default: 'default', one device).")
flags.DEFINE_bool("allow_config_change", False, "Resume a workdir whose saved config.gin "
                  "differs from this config in more than run length and logging.")
flags.mark_flag_as_required("workdir")
FLAGS = flags.FLAGS


def main(argv) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}")
    if not FLAGS.gin_file:
        raise app.UsageError("give at least one --gin_file, e.g. "
                             "--gin_file=experiments/sinusoid/maml.gin")
    gin_files = resolve_gin_files(FLAGS.gin_file)  # a missing one: told at once
    # a missing --module file, and a resumed run's recorded modules unless given again
    # (--module) or trusted (--trust_workdir), are told before TensorFlow loads: a
    # workdir is data, and what it names is refused, listed
    from metalearn.runs.modules import allowed, check_files
    check_files(FLAGS.module)
    recorded = allowed(FLAGS.workdir, FLAGS.module, FLAGS.trust_workdir)
    metalearn.import_all()  # TensorFlow and every configurable, before gin parses
    from metalearn.runs.cluster import ClusterWaitInterrupted
    from metalearn.runs.experiment import apply_configured_threads
    from metalearn.training import build_experiment, parse_config, train
    from metalearn.training.distribute import make_strategy
    from metalearn.training.loop import TrainingInterrupted
    parse_config(gin_files, list(FLAGS.gin_param) + determinism_params(FLAGS.deterministic),
                 modules=[*recorded, *FLAGS.module])
    apply_configured_threads()  # before the strategy starts TensorFlow's runtime
    try:
        strategy = make_strategy(name=FLAGS.strategy) if FLAGS.strategy else \
            make_strategy()
        experiment = build_experiment(strategy)
        metrics = train(experiment, FLAGS.workdir, strategy,
                        allow_config_change=FLAGS.allow_config_change)
    except (TrainingInterrupted, ClusterWaitInterrupted) as stopped:
        # SIGTERM, Ctrl-C: a checkpoint was saved (or nothing had started yet)
        logging.warning("%s", stopped)
        sys.exit(128 + stopped.signal_number)  # as a shell reports a signal's end
    logging.info("final metrics: %s", json.dumps(metrics, sort_keys=True))
    print(json.dumps(metrics, sort_keys=True))


if __name__ == "__main__":
    app.run(main)
