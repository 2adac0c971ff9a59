r"""Exports a trained run's adapt-then-predict for serving, loadable without metalearn.

    python -m metalearn.export --workdir=runs/sinusoid_maml --output=exported/sinusoid \
        [--format=saved_model] [--inner_steps=5] [--version=1] [--overwrite]

Restores the run (its saved config.gin and newest intact checkpoint, as
``metalearn.evaluate`` does, plus any --gin_file/--gin_param on top), takes one episode
of its sampler's ``--split`` for the inputs' feature shapes and dtypes, and writes
``--output/<version>/``: a SavedModel in TensorFlow Serving's layout whose
``serving_default`` signature, ``(support_x, support_y, query_x) -> {"predictions"}``,
runs the learner's own task run (adapt on the support set with the inner steps as
trained, or --inner_steps, then predict the queries) for any set sizes, with
``metadata.json`` beside it (:func:`metalearn.serving.export_saved_model`). Load it with
``tf.saved_model.load(path)`` or serve it with TensorFlow Serving.

Every learner family the library trains exports (its task run is what is traced:
inner loops, heads, neural processes, in-context learners; ``adapt`` and ``predict``
signatures beside it cache a task's solution); a learner that cannot (a meta-RL policy,
a task run that does not trace with the set sizes unknown) and --format=litert or onnx
(later slices) stop with an error naming them. A non-empty version folder is refused
before anything is restored, unless --overwrite.
"""

from __future__ import annotations

import sys
from typing import Optional, Sequence

from absl import app, flags

import metalearn  # imports nothing heavy here: run calls metalearn.import_all()
from metalearn.flags import EXPORT_FORMATS, define_gin_flags, resolve_gin_files
from metalearn.runs.workdir import Workdir  # file names only (light)

define_gin_flags()
flags.DEFINE_string("workdir", None, "A run directory written by metalearn.train.")
flags.DEFINE_string("output", None, "The exported model's folder; the export is written "
                    "in its <version> subfolder (TensorFlow Serving's layout).")
flags.DEFINE_enum("format", "saved_model", EXPORT_FORMATS, "Export format: saved_model "
                  "(litert and onnx are not supported yet).")
flags.DEFINE_integer("inner_steps", None, "Inner steps of the served adaptation "
                     "(default: the adapter's own, as trained).")
flags.DEFINE_integer("version", 1, "The version subfolder (a positive integer).")
flags.DEFINE_bool("overwrite", False, "Replace a non-empty version folder.")
flags.DEFINE_string("split", "test", "The sampler's split whose first episode gives the "
                    "inputs' feature shapes and dtypes.")
flags.mark_flags_as_required(["workdir", "output"])
FLAGS = flags.FLAGS


def _not_yet(format: str) -> Optional[str]:
    if format == "saved_model":
        return None
    return (f"export format {format!r} is not supported yet: only 'saved_model' is "
            "written (LiteRT and ONNX are later slices)")


def run(workdir: str, output: str, format: str = "saved_model",
        inner_steps: Optional[int] = None, version: int = 1, overwrite: bool = False,
        gin_files: Sequence[str] = (), gin_params: Sequence[str] = (),
        modules: Sequence[str] = (), trust_workdir: bool = False,
        split: str = "test") -> str:
    """What ``python -m metalearn.export`` does: checks the format, the run directory
    and the version folder (before anything is restored), restores the run, takes the
    first episode of its sampler's ``split`` as the example and writes the export
    (:func:`metalearn.serving.export_saved_model`). ``modules`` and ``trust_workdir``
    are as for :func:`metalearn.training.restore`.

    Returns:
      The version folder written.

    Raises:
      metalearn.serving.UnsupportedExport: a format other than ``saved_model``, or a
        learner that cannot be exported yet (named).
      FileExistsError: a non-empty version folder without ``overwrite``.
    """
    Workdir(workdir).require_run()  # a typo must not cost a restore
    metalearn.import_all()  # TensorFlow and every configurable (once), before gin parses
    from metalearn.runs.modules import import_modules
    from metalearn.serving import UnsupportedExport, check_exportable, check_target
    from metalearn.serving import export_saved_model
    from metalearn.tasks import Episode
    from metalearn.training import restore
    if _not_yet(format):
        raise UnsupportedExport(_not_yet(format))
    check_target(output, version, overwrite)  # before the restore
    import_modules(modules)
    params = [f"include '{p}'" for p in resolve_gin_files(gin_files)]
    experiment = restore(workdir, gin_params=params + list(gin_params), modules=modules,
                         trust_workdir=trust_workdir)
    check_exportable(experiment.learner, format)
    batch = next(iter(experiment.sampler.dataset(1, seed=experiment.seed, split=split,
                                                 num_steps=1)))
    example = Episode(*[value[0] for value in batch])
    return export_saved_model(experiment.learner, output, inner_steps=inner_steps,
                              version=version, example=example, overwrite=overwrite)


def main(argv) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}")
    if _not_yet(FLAGS.format):  # before any work
        raise app.UsageError(_not_yet(FLAGS.format))
    try:
        path = run(FLAGS.workdir, FLAGS.output, FLAGS.format, FLAGS.inner_steps,
                   FLAGS.version, FLAGS.overwrite, FLAGS.gin_file, FLAGS.gin_param,
                   FLAGS.module, FLAGS.trust_workdir, FLAGS.split)
    except (NotImplementedError, FileExistsError) as error:  # UnsupportedExport, a folder
        sys.exit(f"metalearn.export: {error}")  # the message alone, exit status 1
    print(f"exported to {path}", flush=True)


if __name__ == "__main__":
    app.run(main)
