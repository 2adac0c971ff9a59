"""Inner loops: how a model's weights are adapted to one task."""

from metalearn.adapters.base import Adapter, CallFn, LossFn, NoAdaptation
from metalearn.adapters.gradient_descent import GradientDescent
from metalearn.adapters.hypernetwork import Hypernetwork
from metalearn.adapters.implicit import ImplicitGradientDescent
from metalearn.adapters.learned_rates import MetaSGD, PerStepLearningRates

__all__ = ["Adapter", "CallFn", "GradientDescent", "Hypernetwork", "ImplicitGradientDescent",
           "LossFn", "MetaSGD", "NoAdaptation", "PerStepLearningRates"]
