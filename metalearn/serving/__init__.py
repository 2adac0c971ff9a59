"""Serving a trained learner outside metalearn: its adapt-then-predict written as a
TensorFlow SavedModel (:func:`export_saved_model`) that loads with TensorFlow alone
(``tf.saved_model.load``, TensorFlow Serving). ``python -m metalearn.export`` writes one
from a trained run. Consumers of the learners; nothing below imports them."""

from metalearn.serving.saved_model import (FORMATS, METADATA, TOLERANCE, UnsupportedExport,
                                           check_exportable, check_target,
                                           export_refusals, export_saved_model,
                                           named_leaves)

__all__ = ["FORMATS", "METADATA", "TOLERANCE", "UnsupportedExport", "check_exportable",
           "check_target", "export_refusals", "export_saved_model", "named_leaves"]
