r"""Evaluates a trained run on held-out tasks, with 95% confidence intervals.

    python -m metalearn.evaluate --workdir=runs/sinusoid_maml \
        --gin_param='evaluate.inner_steps=(1, 5, 10)' --gin_param='Sinusoid.shots=5' \
        --output=eval_5shot.json

Rebuilds the run from its saved config.gin (plus any --gin_file/--gin_param on top),
restores the newest intact checkpoint and writes the results as JSON into the workdir
(--workdir is checked to be a run directory and --output's folder is created and checked
writable, with free space, before anything is evaluated). It prints what it evaluated
(the sampler, ways, shots and queries of the tasks, how many tasks of which split, the
inner steps, the checkpoint step) and, for each number of inner steps, every metric's
mean over the tasks ± its 95% interval; the per-task values are in the JSON file only.
Progress lines with an ETA come every 15 seconds (``evaluate.log_every_seconds``), and
the means go to TensorBoard too (``eval/<report>/`` in the workdir, at the checkpoint's
step: ``tensorboard --logdir runs/``). The figures are printed before the file is
written: a write that fails still (a disk filled meanwhile) names the file and the
reason, and logs the file's whole content, so the evaluation is not lost.

With ``--metaworld`` a run on a Meta-World benchmark (``metalearn.rl.MetaWorld``) is
evaluated by Meta-World's own evaluator instead (``metaworld.evaluation.
metalearning_evaluation`` through ``metalearn.rl.metaworld_evaluation``, its settings
bound by gin, e.g. ``--gin_param='metaworld_evaluation.num_evals = 10'``): its mean
success rate, mean return and success rate per test task, written to
``metaworld.json`` unless --output names another file.
"""

from __future__ import annotations

import os
from typing import Callable, Dict, Optional, Sequence

from absl import app, flags

import metalearn  # imports nothing heavy here: main calls metalearn.import_all()
from metalearn.flags import (define_determinism_flag, define_gin_flags, define_once,
                             determinism_params, resolve_gin_files)
from metalearn.runs.workdir import Workdir  # file names only (light)

define_gin_flags()
define_determinism_flag()
define_once(flags.DEFINE_string, "workdir", None,
            "A run directory written by metalearn.train.")
define_once(flags.DEFINE_string, "output", Workdir.EVALUATION,
            "Results file, relative to the workdir (or "
            "absolute); its folder is created, and checked writable first.")
define_once(flags.DEFINE_bool, "metaworld", False,
            "Evaluate with Meta-World's own metalearning_evaluation (a run whose "
            "environment is metalearn.rl.MetaWorld; settings: gin bindings of "
            "metaworld_evaluation) instead of metalearn.evaluate; the report goes to "
            f"{Workdir.METAWORLD_EVALUATION} unless --output names another file.")
flags.mark_flag_as_required("workdir")
FLAGS = flags.FLAGS


def run(workdir: str, output: str = Workdir.EVALUATION, gin_files: Sequence[str] = (),
        gin_params: Sequence[str] = (), modules: Sequence[str] = (),
        trust_workdir: bool = False,
        show: Optional[Callable[[str], None]] = None,
        metaworld: bool = False) -> Dict[str, object]:
    """What ``python -m metalearn.evaluate`` does: restores the run, evaluates it and
    writes the report to ``output`` (relative to ``workdir``; its folder is created).
    The output's writability is checked before anything is restored or evaluated.
    ``modules`` (``--module``) are imported first, e.g. the one a ``gin_files`` binding
    names; those the run recorded (``modules.json``) or its config imports are imported
    only if among them, or with ``trust_workdir`` (``--trust_workdir``): a workdir is
    data, and one named otherwise is refused (``UntrustedModulesError``). The figures
    (:func:`~metalearn.training.evaluation.report_figures`: what was evaluated, each
    metric's mean ± 95% interval) go to ``show`` before the file is written (``print``
    at the command line); ``None``: to the log. With ``metaworld``, the run is evaluated
    by Meta-World's own evaluator (:func:`metalearn.rl.metaworld_evaluation`, gin-bound)
    and no TensorBoard summaries are written.

    Returns:
      The report (``evaluate``'s, plus ``checkpoint_step``).
    """
    from metalearn.runs.files import check_writable, write_json_results  # light
    Workdir(workdir).require_run()  # before the output: a typo must not create it
    path = check_writable(Workdir(workdir).evaluation(output))  # before any work
    from metalearn.runs.modules import allowed, check_files  # light: told in a second
    check_files(modules)  # a missing --module file
    allowed(workdir, modules, trust_workdir)  # the run's recorded modules, unless given
    metalearn.import_all()  # TensorFlow and every configurable (once), before gin parses
    from metalearn.runs.modules import import_modules
    from metalearn.training import evaluate, restore
    from metalearn.training.evaluation import report_figures, write_summaries
    import_modules(modules)
    params = [f"include '{p}'" for p in resolve_gin_files(gin_files)]
    experiment = restore(workdir, gin_params=params + list(gin_params), modules=modules,
                         trust_workdir=trust_workdir)
    if metaworld:
        from metalearn.rl.metaworld import metaworld_evaluation, metaworld_figures
        report = metaworld_evaluation(experiment.learner)
        figures_of = metaworld_figures
    else:
        report = evaluate(experiment.learner, experiment.sampler,
                          formulation=experiment.formulation)
        figures_of = report_figures
    report["checkpoint_step"] = experiment.restored_step
    figures = figures_of(report)
    if show is not None:
        show(figures)  # results first, then the file
        figures = None  # shown: write_json_results need not log them again
    write_json_results(path, report, figures, "evaluation")  # figures logged first
    if not metaworld:
        write_summaries(report, Workdir(workdir).evaluation_summaries(output))  # TensorBoard
    return report


def main(argv) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}")
    # what was evaluated and the means, printed before the file is written; the
    # per-task values go to the file only
    output = FLAGS.output
    if FLAGS.metaworld and not FLAGS["output"].present:
        output = Workdir.METAWORLD_EVALUATION
    run(FLAGS.workdir, output, FLAGS.gin_file,
        list(FLAGS.gin_param) + determinism_params(FLAGS.deterministic), FLAGS.module,
        FLAGS.trust_workdir, show=lambda figures: print(figures, flush=True),
        metaworld=FLAGS.metaworld)
    path = os.path.abspath(Workdir(FLAGS.workdir).evaluation(output))
    print(f"per-task values and the whole report: {path}")


if __name__ == "__main__":
    app.run(main)
