r"""Evaluates a trained run on held-out tasks, with 95% confidence intervals.

    python -m metalearn.evaluate --workdir=runs/sinusoid_maml \
        --gin_param='evaluate.inner_steps=(1, 5, 10)' --gin_param='Sinusoid.shots=5' \
        --output=eval_5shot.json

Rebuilds the run from its saved config.gin (plus any --gin_file/--gin_param on top),
restores the newest intact checkpoint and writes the results as JSON into the workdir
(--workdir is checked to be a run directory and --output's folder is created and checked
writable, with free space, before anything is evaluated). The figures are logged before
the file is written: a write that fails still (a disk filled meanwhile) names the file
and the reason, and logs the file's whole content, so the evaluation is not lost.
"""

from __future__ import annotations

import json
from typing import Dict, Sequence

from absl import app, flags

import metalearn  # noqa: F401
from metalearn.flags import define_gin_flags, resolve_gin_files
from metalearn.training import evaluate, restore
from metalearn.training.evaluation import report_figures
from metalearn.runs.files import check_writable, write_json_results
from metalearn.runs.workdir import Workdir
from metalearn.runs.modules import import_modules

define_gin_flags()
flags.DEFINE_string("workdir", None, "A run directory written by metalearn.train.")
flags.DEFINE_string("output", Workdir.EVALUATION, "Results file, relative to the workdir (or "
                    "absolute); its folder is created, and checked writable first.")
flags.mark_flag_as_required("workdir")
FLAGS = flags.FLAGS


def run(workdir: str, output: str = Workdir.EVALUATION, gin_files: Sequence[str] = (),
        gin_params: Sequence[str] = (), modules: Sequence[str] = (),
        trust_workdir: bool = False) -> Dict[str, object]:
    """What ``python -m metalearn.evaluate`` does: restores the run, evaluates it and
    writes the report to ``output`` (relative to ``workdir``; its folder is created).
    The output's writability is checked before anything is restored or evaluated.
    ``modules`` (``--module``) are imported first, e.g. the one a ``gin_files`` binding
    names; those the run recorded (``modules.json``) or its config imports are imported
    only if among them, or with ``trust_workdir`` (``--trust_workdir``): a workdir is
    data, and one named otherwise is refused (``UntrustedModulesError``).

    Returns:
      The report (``evaluate``'s, plus ``checkpoint_step``).
    """
    Workdir(workdir).require_run()  # before the output: a typo must not create it
    path = check_writable(Workdir(workdir).evaluation(output))  # before any work
    import_modules(modules)
    params = [f"include '{p}'" for p in resolve_gin_files(gin_files)]
    experiment = restore(workdir, gin_params=params + list(gin_params), modules=modules,
                         trust_workdir=trust_workdir)
    report = evaluate(experiment.learner, experiment.sampler,
                      formulation=experiment.formulation)
    report["checkpoint_step"] = experiment.restored_step
    write_json_results(path, report, report_figures(report), "evaluation")  # logged first
    return report


def main(argv) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}")
    report = run(FLAGS.workdir, FLAGS.output, FLAGS.gin_file, FLAGS.gin_param,
                 FLAGS.module, FLAGS.trust_workdir)  # logs the figures before writing them
    print(json.dumps(report, sort_keys=True))


if __name__ == "__main__":
    app.run(main)
