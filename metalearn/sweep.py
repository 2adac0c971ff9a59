r"""Runs a sweep over gin bindings: one ``metalearn.train`` process per run.

    # inner learning rate x 2 seeds, 2 runs at once, each evaluated after training
    python -m metalearn.sweep --gin_file=experiments/sinusoid/maml.gin \
        --gin_param='Loop.num_steps=2000' \
        --axis='GradientDescent.learning_rate=[0.001, 0.01, 0.1]' \
        --axis='Runtime.seed=[0, 1]' --root=runs/sweep_lr --parallel=2 --evaluate

    # the same from a sweep file (see experiments/sweeps/)
    python -m metalearn.sweep --sweep_file=experiments/sweeps/sinusoid_inner_lr.gin \
        --root=runs/sweep_lr --evaluate

``--axis`` axes combine as a cartesian product; all ``--zip`` axes advance together
(equal lengths) as one more factor. Every run trains in ``ROOT/<bindings>``. Rerunning
the same command skips finished runs and resumes the others from their checkpoints.
Every binding is checked (gin parse and experiment build) before any run starts, and a
``--gin_param`` on a key an axis varies is refused (the axis would silently win).
``--module=my_rule.py`` (a file or a dotted name, repeatable) is imported before gin
parses, here and in every run's process. ``--ray_address`` runs each run as a Ray task instead (``pip install 'metalearn[ray]'``;
the root must be on a file system every node sees). Then: ``python -m metalearn.report
ROOT``.
"""

from __future__ import annotations

import signal
import sys
from typing import TYPE_CHECKING

from absl import app, flags

import metalearn  # imports nothing heavy here: main calls metalearn.import_all()
from metalearn.flags import (define_determinism_flag, define_gin_flags, determinism_params,
                             resolve_gin_files)

if TYPE_CHECKING:
    from metalearn.studies import sweeps

define_gin_flags()
define_determinism_flag()  # every run's
flags.DEFINE_string("sweep_file", None, "A sweep file (gin binding sweep.*), e.g. "
                    "experiments/sweeps/sinusoid_inner_lr.gin; --gin_file, --gin_param, "
                    "--axis and --zip add to it.")
flags.DEFINE_multi_string("axis", [], "A product axis 'Configurable.param=[v1, v2]'.")
flags.DEFINE_multi_string("zip", [], "An axis 'Configurable.param=[v1, v2]' zipped with "
                          "every other --zip axis.")
flags.DEFINE_string("root", None, "The sweep's directory; each run trains in a "
                    "subdirectory named by its bindings.")
flags.DEFINE_integer("parallel", 2, "Runs at once, as local processes.")
flags.DEFINE_bool("evaluate", False, "Evaluate each run after training (eval.json).")
flags.DEFINE_multi_string("eval_gin_param", [], "Gin bindings for the evaluations.")
flags.DEFINE_bool("dry_run", False, "Validate and list the runs, run nothing.")
flags.DEFINE_string("ray_address", None, "Run each run as a task on this Ray cluster "
                    "('auto', 'host:6379', or 'local' for a local instance).")
flags.DEFINE_float("ray_cpus_per_run", 1.0, "CPUs Ray reserves for each run.")
flags.DEFINE_string("execute", None, "Internal: train (and evaluate) the one run whose "
                    "sweep_run.json is in this workdir; what each run's process does.")
FLAGS = flags.FLAGS


def spec_from_flags() -> sweeps.SweepSpec:
    from metalearn.studies import sweeps
    spec = sweeps.load_sweep_file(resolve_gin_files([FLAGS.sweep_file])[0]) \
        if FLAGS.sweep_file else sweeps.SweepSpec()
    spec.gin_files += list(FLAGS.gin_file)
    spec.gin_params += list(FLAGS.gin_param) + determinism_params(FLAGS.deterministic)
    spec.modules += list(FLAGS.module)
    zipped_keys = [key for group in spec.zipped for key in group]
    sweeps.add_axes(spec.axes, FLAGS.axis, taken=zipped_keys)
    spec.eval_params += list(FLAGS.eval_gin_param)
    if FLAGS.zip:
        spec.zipped.append(sweeps.add_axes({}, FLAGS.zip, "--zip",
                                           taken=list(spec.axes) + zipped_keys))
    if not spec.gin_files:
        raise app.UsageError("give the runs' config: --gin_file or a --sweep_file with "
                             "sweep.gin_files")
    return spec


def main(argv) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}")
    if not FLAGS.root and not FLAGS.execute:
        raise app.UsageError("give --root, the sweep's directory")
    metalearn.import_all()  # TensorFlow and every configurable, before gin parses
    from metalearn.studies import sweeps
    if FLAGS.execute:
        sweeps.train_and_evaluate(FLAGS.execute, FLAGS.module, FLAGS.trust_workdir)
        return 0

    def stop(signum, frame):  # SIGTERM stops the runs too (they resume on a rerun)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    try:
        spec = spec_from_flags()
        if FLAGS.dry_run:
            runs = sweeps.validate(spec, spec.runs(FLAGS.root))
            for run in runs:
                print(f"{run.workdir}  ({run.num_steps} steps)")
            return 0
        results = sweeps.run_sweep(spec, FLAGS.root, parallel=FLAGS.parallel,
                                   evaluate=FLAGS.evaluate,
                                   ray_address=FLAGS.ray_address,
                                   ray_cpus_per_run=FLAGS.ray_cpus_per_run,
                                   log=lambda line: print(line, flush=True))
    except sweeps.SweepError as error:
        print(f"sweep error: {error}", file=sys.stderr)
        return 2
    except (SystemExit, KeyboardInterrupt):  # SIGTERM, Ctrl-C: say what is left
        print(f"INCOMPLETE: the sweep was stopped; its unfinished runs resume when the "
              f"same command runs again, and python -m metalearn.report {FLAGS.root} "
              "lists them", file=sys.stderr, flush=True)
        raise
    bad = [r for r in results if r["status"] in ("failed", "locked")]
    for result in bad:
        why = (f"exit code {result.get('exit_code')}, see {result.get('log')}"
               if result["status"] == "failed" else "another sweep process runs it")
        print(f"{result['status']}: {result['name']} ({result.get('workdir')}; {why})",
              file=sys.stderr)
    print(f"{len(results) - len(bad)}/{len(results)} runs finished"
          + (f"; INCOMPLETE: {len(bad)} not finished (listed above)" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    app.run(main)
