"""Closed-form task solvers on embeddings: what an embedding learner fits per task."""

from metalearn.heads.base import Head
from metalearn.heads.prototypes import (PrototypeHead, class_prototypes,
                                        squared_distances)
from metalearn.heads.ridge import RidgeHead

__all__ = ["Head", "PrototypeHead", "RidgeHead", "class_prototypes", "squared_distances"]
