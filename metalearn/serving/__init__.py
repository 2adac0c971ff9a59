"""Serving a trained learner outside metalearn: its adapt-then-predict written as a
TensorFlow SavedModel (:func:`export_saved_model`) that loads with TensorFlow alone
(``tf.saved_model.load``, TensorFlow Serving), and converted from it to LiteRT
(:func:`export_litert`, run by the ``ai-edge-litert`` interpreter) and ONNX
(:func:`export_onnx`, run by ``onnxruntime``) for the learners each format takes.
``python -m metalearn.export`` writes one from a trained run. Consumers of the
learners; nothing below imports them."""

from metalearn.serving.conversion import (ConverterMissing, check_convertible,
                                          check_exportable)
from metalearn.serving.litert import export_litert
from metalearn.serving.onnx import export_onnx
from metalearn.serving.saved_model import (FORMATS, METADATA, TOLERANCE, UnsupportedExport,
                                           check_target, export_refusals,
                                           export_saved_model, named_leaves)

__all__ = ["FORMATS", "METADATA", "TOLERANCE", "ConverterMissing", "UnsupportedExport",
           "check_convertible", "check_exportable", "check_target", "export_litert",
           "export_onnx", "export_refusals", "export_saved_model", "named_leaves"]
