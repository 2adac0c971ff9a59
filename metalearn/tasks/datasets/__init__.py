"""Data set loaders for classification tasks: each returns ``LabelledImages``."""

from metalearn.tasks.datasets.base import LabelledImages
from metalearn.tasks.datasets.mnist import load_mnist
from metalearn.tasks.datasets.omniglot import MINIMAL_SPLIT, load_omniglot

__all__ = ["LabelledImages", "MINIMAL_SPLIT", "load_mnist", "load_omniglot"]
