"""Data set loaders for classification tasks: each returns ``LabelledImages``."""

from metalearn.tasks.datasets.base import LabelledImages
from metalearn.tasks.datasets.mnist import load_mnist

__all__ = ["LabelledImages", "load_mnist"]
