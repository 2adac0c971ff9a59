"""Inner loops: how a model's weights are adapted to one task."""

from metalearn.adapters.base import Adapter, CallFn, LossFn
from metalearn.adapters.gradient_descent import GradientDescent
from metalearn.adapters.hypernetwork import Hypernetwork

__all__ = ["Adapter", "CallFn", "GradientDescent", "Hypernetwork", "LossFn"]
