"""A gradient-free learner's adapt-then-predict as an ONNX model, converted from its
SavedModel with ``tf2onnx`` and run by ``onnxruntime``, set sizes unknown unless fixed::

    path = export_onnx(learner, "exported/protonets", example=episode)
    session = onnxruntime.InferenceSession(path + "/model.onnx")
    predictions, = session.run(None, {"support_x": sx, "support_y": sy, "query_x": qx})

Gradient-based learners are refused before anything is traced: their inner loop's
gradient operators have no ONNX counterpart (:mod:`metalearn.serving.conversion`).
"""

from __future__ import annotations

from typing import Optional

from metalearn.learners import Learner
from metalearn.serving import conversion
from metalearn.tasks.episode import Episode

FILE = "model.onnx"
"""The model's file in the version folder."""

OPSET = 17
"""The ONNX operator set written by default."""


def export_onnx(learner: Learner, directory: str, example: Optional[Episode] = None,
                support_size: Optional[int] = None, query_size: Optional[int] = None,
                inner_steps: Optional[int] = None, version: int = 1,
                overwrite: bool = False, opset: int = OPSET) -> str:
    """Writes ``learner``'s adapt-then-predict as ``directory/<version>/model.onnx`` with
    ``metadata.json`` beside it, converted from its SavedModel
    (:func:`~metalearn.serving.export_saved_model`) by ``tf2onnx``.

    The graph's inputs are ``support_x``, ``support_y`` and ``query_x``, its output
    ``predictions``; a set size not given stays unknown (any number of examples).

    Args:
      learner: a gradient-free learner (no inner loop: ``PrototypicalNetworks``,
        ``EmbeddingLearner`` with ``NoAdaptation``).
      directory: the model's folder; the export is its ``<version>`` subfolder.
      example: one episode (no task axis): the inputs' feature shapes and dtypes.
      support_size: fixes the number of support examples (default: any).
      query_size: fixes the number of queries (default: any).
      inner_steps: inner steps of the served adaptation (default: as trained).
      version: the version subfolder, a positive integer.
      overwrite: replace a non-empty version folder instead of refusing it.
      opset: the ONNX operator set.

    Returns:
      The version folder written.

    Raises:
      UnsupportedExport: a gradient-based or unsupported learner (named, before any
        tracing), or a conversion that fails.
      ConverterMissing: ``tf2onnx`` or ``onnxruntime`` is not installed.
      FileExistsError: a non-empty version folder without ``overwrite``.
      ValueError: a set size that is not a positive integer, or no example.
    """
    path, support_size, query_size = conversion.prepare(
        learner, "onnx", directory, version, overwrite, example, support_size, query_size)
    import tf2onnx
    from tf2onnx import tf_loader

    def converted(source: str) -> bytes:
        graph, names_in, names_out, renames = tf_loader.from_saved_model(
            source, None, None, tag="serve", signatures=["serving_default"],
            return_tensors_to_rename=True)
        model, _ = tf2onnx.convert.from_graph_def(
            graph, input_names=names_in, output_names=names_out, opset=opset,
            tensors_to_rename=renames)
        return model.SerializeToString()

    model, metadata, inputs = conversion.from_saved_model(
        learner, "onnx", example, inner_steps, support_size, query_size, converted)
    metadata = conversion.converted_metadata(metadata, "onnx", FILE, inputs, {
        "opset": int(opset),
        "runtime": "onnxruntime (onnxruntime.InferenceSession)"})
    return conversion.write_version(path, {FILE: model}, metadata)
