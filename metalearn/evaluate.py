r"""Evaluates a trained run on held-out tasks, with 95% confidence intervals.

    python -m metalearn.evaluate --workdir=runs/sinusoid_maml \
        --gin_param='evaluate.inner_steps=(1, 5, 10)' --gin_param='Sinusoid.shots=5' \
        --output=eval_5shot.json

Rebuilds the run from its saved config.gin (plus any --gin_file/--gin_param on top),
restores the latest checkpoint and writes the results as JSON into the workdir.
"""

from __future__ import annotations

import json
import os

from absl import app, flags, logging

import metalearn  # noqa: F401
from metalearn.flags import define_gin_flags, resolve_gin_files
from metalearn.training import evaluate, restore
from metalearn.runs.files import write_json

define_gin_flags()
flags.DEFINE_string("workdir", None, "A run directory written by metalearn.train.")
flags.DEFINE_string("output", "eval.json", "Results file name, inside the workdir.")
flags.mark_flag_as_required("workdir")
FLAGS = flags.FLAGS


def main(argv) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}")
    params = [f"include '{path}'" for path in resolve_gin_files(FLAGS.gin_file)]
    experiment = restore(FLAGS.workdir, gin_params=params + list(FLAGS.gin_param))
    report = evaluate(experiment.learner, experiment.sampler)
    report["checkpoint_step"] = experiment.restored_step
    write_json(os.path.join(FLAGS.workdir, FLAGS.output), report)
    for steps, metrics in report["results"].items():
        logging.info("%s inner steps: %s", steps, "  ".join(
            f"{name} {m['mean']:.4f} ± {m['ci95']:.4f}" for name, m in metrics.items()))
    print(json.dumps(report, sort_keys=True))


if __name__ == "__main__":
    app.run(main)
