r"""Exports a trained run's adapt-then-predict for serving, loadable without metalearn.

    python -m metalearn.export --workdir=runs/sinusoid_maml --output=exported/sinusoid \
        [--format=saved_model|litert|onnx] [--inner_steps=5] [--version=1] [--overwrite] \
        [--support_size=N --query_size=M] [--select_tf_ops]

Restores the run (its saved config.gin and newest intact checkpoint, as
``metalearn.evaluate`` does, plus any --gin_file/--gin_param on top), takes one episode
of its sampler's ``--split`` for the inputs' feature shapes and dtypes, and writes
``--output/<version>/``: by default a SavedModel in TensorFlow Serving's layout whose
``serving_default`` signature, ``(support_x, support_y, query_x) -> {"predictions"}``,
runs the learner's own task run (adapt on the support set with the inner steps as
trained, or --inner_steps, then predict the queries) for any set sizes, with
``metadata.json`` beside it (:func:`metalearn.serving.export_saved_model`). Load it with
``tf.saved_model.load(path)`` or serve it with TensorFlow Serving.

Every learner family the library trains exports (its task run is what is traced:
inner loops, heads, neural processes, in-context learners; ``adapt`` and ``predict``
signatures beside it cache a task's solution); a learner that cannot (a meta-RL policy,
a task run that does not trace with the set sizes unknown) stops with an error naming it.

``--format=litert`` converts that SavedModel to ``model.tflite`` (set sizes fixed:
--support_size and --query_size, default the episode's) and ``--format=onnx`` to
``model.onnx`` (set sizes unknown unless given): :mod:`metalearn.serving.litert`,
:mod:`metalearn.serving.onnx`. Gradient-free learners (Prototypical Networks) go to both;
a gradient-based one (MAML) goes to LiteRT only with --select_tf_ops (Select TF ops,
which need a LiteRT runtime with the Flex delegate) and never to ONNX: refused with an
error naming the learner and the format before anything is traced. A non-empty version
folder is refused before TensorFlow loads (in a fraction of a second), unless --overwrite.
"""

from __future__ import annotations

import sys
from typing import Optional, Sequence

from absl import app, flags

import metalearn  # imports nothing heavy here: run calls metalearn.import_all()
from metalearn.flags import (EXPORT_FORMATS, define_gin_flags, define_once,
                             resolve_gin_files)
from metalearn.runs.files import check_version_folder  # light, as below
from metalearn.runs.workdir import Workdir  # file names only (light)

define_gin_flags()
define_once(flags.DEFINE_string, "workdir", None,
            "A run directory written by metalearn.train.")
define_once(flags.DEFINE_string, "output", None,
            "The exported model's folder; the export is written "
            "in its <version> subfolder (TensorFlow Serving's layout).")
flags.DEFINE_enum("format", "saved_model", EXPORT_FORMATS, "Export format: saved_model, "
                  "or litert and onnx converted from it (pip install 'metalearn[export]').")
flags.DEFINE_integer("inner_steps", None, "Inner steps of the served adaptation "
                     "(default: the adapter's own, as trained).")
flags.DEFINE_integer("version", 1, "The version subfolder (a positive integer).")
flags.DEFINE_bool("overwrite", False, "Replace a non-empty version folder.")
flags.DEFINE_string("split", "test", "The sampler's split whose first episode gives the "
                    "inputs' feature shapes and dtypes.")
flags.DEFINE_integer("support_size", None, "litert and onnx: the number of support "
                     "examples the model takes (litert default: the episode's; onnx: any).")
flags.DEFINE_integer("query_size", None, "litert and onnx: the number of queries the model "
                     "takes (litert default: the episode's; onnx: any).")
flags.DEFINE_bool("select_tf_ops", False, "litert: keep TensorFlow ops that LiteRT has no "
                  "builtin for (a gradient-based learner's inner loop) as Select TF ops.")
flags.mark_flags_as_required(["workdir", "output"])
FLAGS = flags.FLAGS


def _usage(format: str, support_size: Optional[int], query_size: Optional[int],
           select_tf_ops: bool) -> Optional[str]:
    """What is wrong with the format's flags, before any work (``None``: nothing)."""
    if format == "saved_model" and (support_size is not None or query_size is not None):
        return ("--support_size and --query_size apply to --format=litert and onnx; a "
                "SavedModel takes any set sizes")
    if select_tf_ops and format != "litert":
        return "--select_tf_ops applies to --format=litert only"
    for name, value in (("support_size", support_size), ("query_size", query_size)):
        if value is not None and value < 1:
            return f"--{name} must be a positive number of examples, got {value}"
    return None


def run(workdir: str, output: str, format: str = "saved_model",
        inner_steps: Optional[int] = None, version: int = 1, overwrite: bool = False,
        gin_files: Sequence[str] = (), gin_params: Sequence[str] = (),
        modules: Sequence[str] = (), trust_workdir: bool = False,
        split: str = "test", support_size: Optional[int] = None,
        query_size: Optional[int] = None, select_tf_ops: bool = False) -> str:
    """What ``python -m metalearn.export`` does: checks the format, the run directory
    and the version folder (before anything is restored), restores the run, takes the
    first episode of its sampler's ``split`` as the example and writes the export
    (:func:`metalearn.serving.export_saved_model`, :func:`~metalearn.serving.export_litert`
    or :func:`~metalearn.serving.export_onnx`, given ``support_size``, ``query_size`` and
    ``select_tf_ops`` where they apply). ``modules`` and ``trust_workdir`` are as for
    :func:`metalearn.training.restore`.

    Returns:
      The version folder written.

    Raises:
      metalearn.serving.UnsupportedExport: a learner that cannot be exported to
        ``format`` (named, before anything is traced).
      metalearn.serving.ConverterMissing: the format's packages are not installed
        (before the restore).
      FileExistsError: a non-empty version folder without ``overwrite``.
      ValueError: flags that do not apply to ``format``.
    """
    usage = _usage(format, support_size, query_size, select_tf_ops)
    if usage:
        raise ValueError(usage)
    Workdir(workdir).require_run()  # a typo must not cost a restore
    check_version_folder(output, version, overwrite)  # nor a folder to keep
    metalearn.import_all()  # TensorFlow and every configurable (once), before gin parses
    from metalearn.runs.modules import import_modules
    from metalearn import serving
    from metalearn.serving.conversion import require_packages
    from metalearn.tasks import Episode
    from metalearn.training import restore
    require_packages(format)  # before the restore
    import_modules(modules)
    params = [f"include '{p}'" for p in resolve_gin_files(gin_files)]
    experiment = restore(workdir, gin_params=params + list(gin_params), modules=modules,
                         trust_workdir=trust_workdir)
    serving.check_exportable(experiment.learner, format, select_tf_ops)  # before tracing
    batch = next(iter(experiment.sampler.dataset(1, seed=experiment.seed, split=split,
                                                 num_steps=1)))
    example = Episode(*[value[0] for value in batch])
    common = dict(inner_steps=inner_steps, version=version, example=example,
                  overwrite=overwrite)
    if format == "litert":
        return serving.export_litert(experiment.learner, output, support_size=support_size,
                                     query_size=query_size, select_tf_ops=select_tf_ops,
                                     **common)
    if format == "onnx":
        return serving.export_onnx(experiment.learner, output, support_size=support_size,
                                   query_size=query_size, **common)
    return serving.export_saved_model(experiment.learner, output, **common)


def main(argv) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}")
    usage = _usage(FLAGS.format, FLAGS.support_size, FLAGS.query_size, FLAGS.select_tf_ops)
    if usage:  # before any work
        raise app.UsageError(usage)
    try:
        path = run(FLAGS.workdir, FLAGS.output, FLAGS.format, FLAGS.inner_steps,
                   FLAGS.version, FLAGS.overwrite, FLAGS.gin_file, FLAGS.gin_param,
                   FLAGS.module, FLAGS.trust_workdir, FLAGS.split, FLAGS.support_size,
                   FLAGS.query_size, FLAGS.select_tf_ops)
    except (NotImplementedError, FileExistsError) as error:  # UnsupportedExport, a folder
        sys.exit(f"metalearn.export: {error}")  # the message alone, exit status 1
    except ImportError as error:
        from metalearn.serving import ConverterMissing
        if not isinstance(error, ConverterMissing):
            raise
        sys.exit(f"metalearn.export: {error}")  # a converter's package to install
    print(f"exported to {path}", flush=True)


if __name__ == "__main__":
    app.run(main)
