"""Data set loaders for classification tasks: each returns ``LabelledImages``."""

from metalearn.tasks.datasets.base import LabelledImages
from metalearn.tasks.datasets.omniglot import MINIMAL_SPLIT, load_omniglot

__all__ = ["LabelledImages", "MINIMAL_SPLIT", "load_omniglot"]
