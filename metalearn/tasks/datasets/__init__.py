"""Data set loaders for classification tasks: each returns ``LabelledImages``."""

from metalearn.tasks.datasets.base import LabelledImages

__all__ = ["LabelledImages"]
