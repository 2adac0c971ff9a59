"""A learner's adapt-then-predict as a LiteRT (TensorFlow Lite) model, converted from its
SavedModel with ``tf.lite.TFLiteConverter.from_saved_model``, set sizes fixed::

    path = export_litert(learner, "exported/protonets", example=episode)
    runner = Interpreter(model_path=path + "/model.tflite").get_signature_runner()
    predictions = runner(support_x=sx, support_y=sy, query_x=qx)["predictions"]

(``from ai_edge_litert.interpreter import Interpreter``). Gradient-free learners
(Prototypical Networks, ``EmbeddingLearner`` without an inner loop) convert to builtin
operators. A gradient-based learner (MAML and its variants) is refused unless
``select_tf_ops=True``: its inner loop's gradient operators then become Select TF ops,
which need a LiteRT runtime linked with the Flex delegate; the ``ai-edge-litert`` Python
package has none, so such a model is written but cannot be checked here
(:mod:`metalearn.serving.conversion`).
"""

from __future__ import annotations

from typing import List, Optional

import tensorflow as tf

from metalearn.learners import Learner
from metalearn.serving import conversion
from metalearn.tasks.episode import Episode

FILE = "model.tflite"
"""The model's file in the version folder."""


def _custom_ops(model: bytes) -> List[str]:
    """The custom operators (the ``Flex`` ones are Select TF ops) ``model`` uses."""
    from ai_edge_litert import schema_py_generated as schema
    codes = schema.ModelT.InitFromPackedBuf(model, 0).operatorCodes or []
    found = {code.customCode.decode() if isinstance(code.customCode, bytes)
             else code.customCode for code in codes if code.customCode}
    return sorted(found)


def export_litert(learner: Learner, directory: str, example: Optional[Episode] = None,
                  support_size: Optional[int] = None, query_size: Optional[int] = None,
                  inner_steps: Optional[int] = None, version: int = 1,
                  overwrite: bool = False, select_tf_ops: bool = False) -> str:
    """Writes ``learner``'s adapt-then-predict as ``directory/<version>/model.tflite``
    with ``metadata.json`` beside it, converted from its SavedModel
    (:func:`~metalearn.serving.export_saved_model`).

    The model's one signature, ``serving_default``, takes ``support_x``, ``support_y``
    and ``query_x`` and gives ``predictions``, at fixed set sizes: LiteRT's builtin
    operators do not take the unknown sizes the learners' graphs have.

    Args:
      learner: a gradient-free learner, or a gradient-based one with ``select_tf_ops``.
      directory: the model's folder; the export is its ``<version>`` subfolder.
      example: one episode (no task axis): the inputs' feature shapes and dtypes, and
        the set sizes not given.
      support_size: the number of support examples the model takes (default: the
        example's).
      query_size: the number of queries (default: the example's).
      inner_steps: inner steps of the served adaptation (default: as trained).
      version: the version subfolder, a positive integer.
      overwrite: replace a non-empty version folder instead of refusing it.
      select_tf_ops: let the converter keep TensorFlow ops LiteRT has no builtin for
        (a gradient-based learner's gradients) as Select TF ops.

    Returns:
      The version folder written.

    Raises:
      UnsupportedExport: a learner that cannot go to LiteRT (named, before any
        tracing), or a conversion that fails.
      ConverterMissing: ``ai-edge-litert`` is not installed.
      FileExistsError: a non-empty version folder without ``overwrite``.
      ValueError: a set size that is not a positive integer, or no example.
    """
    path, support_size, query_size = conversion.prepare(
        learner, "litert", directory, version, overwrite, example, support_size,
        query_size, select_tf_ops)
    support_size = support_size or int(example.support_x.shape[0])
    query_size = query_size or int(example.query_x.shape[0])

    def converted(source: str) -> bytes:
        converter = tf.lite.TFLiteConverter.from_saved_model(source)
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS] + (
            [tf.lite.OpsSet.SELECT_TF_OPS] if select_tf_ops else [])
        return converter.convert()

    model, metadata, inputs = conversion.from_saved_model(
        learner, "litert", example, inner_steps, support_size, query_size, converted)
    select = [op[len("Flex"):] for op in _custom_ops(model) if op.startswith("Flex")]
    metadata = conversion.converted_metadata(metadata, "litert", FILE, inputs, {
        "select_tf_ops": select,
        "runtime": ("a LiteRT runtime linked with the Flex delegate (Select TF ops); the "
                    "ai-edge-litert Python interpreter cannot run it") if select else
                   "the LiteRT interpreter (ai_edge_litert.interpreter.Interpreter), "
                   "builtin ops only",
    })
    return conversion.write_version(path, {FILE: model}, metadata)
