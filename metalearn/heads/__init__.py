"""Closed-form task solvers on embeddings: what an embedding learner fits per task."""

from metalearn.heads.base import (Head, LabelOutsideClassesError, class_labels,
                                   support_targets)
from metalearn.heads.linear import LinearProbeHead, classifier_logits
from metalearn.heads.logistic import LogisticHead, LogisticRegressionHead
from metalearn.heads.prototypes import (PrototypeHead, class_prototypes,
                                        cosine_similarities, squared_distances)
from metalearn.heads.ridge import RidgeHead
from metalearn.heads.svm import SVMHead

__all__ = ["Head", "LabelOutsideClassesError", "LinearProbeHead", "LogisticHead", "LogisticRegressionHead", "PrototypeHead",
           "RidgeHead", "SVMHead", "class_prototypes", "classifier_logits", "cosine_similarities",
           "squared_distances", "support_targets", "class_labels"]
