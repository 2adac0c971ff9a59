"""Inner loops: how a model's weights are adapted to one task."""

from metalearn.adapters.base import Adapter, LossFn, NoAdaptation
from metalearn.adapters.gradient_descent import GradientDescent
from metalearn.adapters.implicit import ImplicitGradientDescent
from metalearn.adapters.learned_rates import MetaSGD, PerStepLearningRates

__all__ = ["Adapter", "GradientDescent", "ImplicitGradientDescent", "LossFn", "MetaSGD",
           "NoAdaptation", "PerStepLearningRates"]
