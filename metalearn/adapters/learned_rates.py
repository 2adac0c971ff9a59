"""Front doors for learned inner learning rates: Meta-SGD (per element) and MAML++'s
LSLR (per step and per layer). Each is :class:`GradientDescent` whose update is a
:class:`~metalearn.adapters.updates.LearnedRates` transform."""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

import gin
import keras

from metalearn import configurables
from metalearn.adapters import gradient_descent
from metalearn.adapters.gradient_descent import GradientDescent
from metalearn.adapters.updates import LearnedRates
from metalearn.adapters.wrappers import StepWrapper
from metalearn.pieces import COUNT, check_range


@configurables.moved_keywords(gradient_descent.MOVED, gradient_descent.MOVED_MESSAGE)
class _LearnedRatesDoor(GradientDescent):
    _per = "element"

    def __init__(self, steps: int = 1, learning_rate: float = 0.01,
                 first_order: bool = False, max_learning_rate: Optional[float] = None,
                 min_learning_rate: Optional[float] = None,
                 wrappers: Sequence[StepWrapper] = (), name: Optional[str] = None):
        rates = LearnedRates(self._per, initial=learning_rate,
                             max_learning_rate=max_learning_rate,
                             min_learning_rate=min_learning_rate)
        # Every argument explicit: GradientDescent's own gin bindings (a base file's
        # GradientDescent.learning_rate) must not reach the front door's loop.
        super().__init__(steps, learning_rate=None, first_order=first_order, update=rates,
                         wrappers=wrappers, name=name)
        self.rates = rates
        self.max_learning_rate = self.rates.max_learning_rate
        self.min_learning_rate = self.rates.min_learning_rate

    @property
    def learning_rates(self) -> Dict[str, keras.Variable]:
        """The learned rates by weight path (variables)."""
        return self.rates.learning_rates


@gin.configurable
class MetaSGD(_LearnedRatesDoor):
    """Meta-SGD (Li et al., 2017): a learned learning rate for every element of every
    adapted weight, meta-trained with the initial weights.

    ``GradientDescent(steps, update=LearnedRates("element", learning_rate, ...))``, with
    ``learning_rate`` the rates' initial value; combine with a ``Mask`` or
    ``AnnealOrder`` through ``GradientDescent(update=[...])``.

    Args:
      steps, first_order, wrappers: as for :class:`GradientDescent`.
      learning_rate: the rates' initial value.
      max_learning_rate, min_learning_rate: clipping bounds where the rates are used
        (see :class:`~metalearn.adapters.updates.LearnedRates`).
    """

    _per = "element"


@gin.configurable
class PerStepLearningRates(_LearnedRatesDoor):
    """MAML++'s LSLR (Antoniou et al., 2019): a learned scalar learning rate for every
    adapted weight tensor (layer) and every inner step.

    ``GradientDescent(steps, update=LearnedRates("layer_step", learning_rate, ...))``.
    With more inner steps at test time than ``steps``, the last step's rates are reused.
    Arguments as for :class:`MetaSGD`.
    """

    _per = "layer_step"

    def __init__(self, steps: int = 1, *args: Any, **kwargs: Any):
        steps = check_range("PerStepLearningRates", "steps", steps, COUNT)
        super().__init__(steps, *args, **kwargs)
