"""Closed-form task solvers on embeddings: what an embedding learner fits per task."""

from metalearn.heads.base import Head
from metalearn.heads.logistic import LogisticHead
from metalearn.heads.prototypes import (PrototypeHead, class_prototypes,
                                        squared_distances)
from metalearn.heads.ridge import RidgeHead
from metalearn.heads.svm import SVMHead

__all__ = ["Head", "LogisticHead", "PrototypeHead", "RidgeHead", "SVMHead", "class_prototypes",
           "squared_distances"]
