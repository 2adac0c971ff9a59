"""Inner loops: how a model's weights are adapted to one task."""

from metalearn.adapters.base import Adapter, LossFn
from metalearn.adapters.gradient_descent import GradientDescent

__all__ = ["Adapter", "GradientDescent", "LossFn"]
