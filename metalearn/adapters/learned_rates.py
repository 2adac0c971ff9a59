"""Learned inner learning rates: Meta-SGD (per element) and MAML++'s LSLR (per step and
per layer). Both are :class:`GradientDescent` with a learned :meth:`step_size`."""

from __future__ import annotations

from typing import List, Optional, Sequence

import gin
import keras
import numpy as np
import tensorflow as tf

from metalearn.adapters.gradient_descent import GradientDescent, variable_name
from metalearn.functional import Weights


class _LearnedRates(GradientDescent):
    """Gradient descent whose step sizes are meta-learned ``keras.Variable``s.

    Args:
      max_learning_rate: if set, the learned rates are clipped to
        ``[-max_learning_rate, max_learning_rate]`` where they are used (no gradient
        reaches a rate while it is clipped). A safeguard for regression losses whose
        inner loop diverges above a small rate: the outer optimizer (Adam) moves a rate
        by about its own learning rate per meta-step, whatever the rate's scale.
      min_learning_rate: if set, the lower clipping bound instead of
        ``-max_learning_rate`` (e.g. ``0.0`` keeps per-layer rates from turning the
        inner loop into gradient ascent, which diverges).
      **kwargs: as for :class:`GradientDescent`.
    """

    def __init__(self, *args, max_learning_rate: Optional[float] = None,
                 min_learning_rate: Optional[float] = None, **kwargs):
        super().__init__(*args, **kwargs)
        if max_learning_rate is not None and not float(max_learning_rate) > 0:
            raise ValueError(f"max_learning_rate must be > 0, got {max_learning_rate}")
        self.max_learning_rate = None if max_learning_rate is None \
            else float(max_learning_rate)
        if min_learning_rate is not None and self.max_learning_rate is not None and \
                not float(min_learning_rate) < self.max_learning_rate:
            raise ValueError(f"min_learning_rate={min_learning_rate} must be below "
                             f"max_learning_rate={self.max_learning_rate}")
        self.min_learning_rate = None if min_learning_rate is None \
            else float(min_learning_rate)

    def _rate_shape(self, weight: tf.Tensor) -> Sequence[int]:
        raise NotImplementedError

    def build(self, model: keras.Model, weights: Weights) -> None:
        super().build(model, weights)
        self._rate_paths = list(self.adapted_paths(weights))
        self._rates = [keras.Variable(
            np.full(self._rate_shape(weights[p]), self.learning_rate),
            dtype=weights[p].dtype.name, trainable=True, name=variable_name(p, "lr"))
            for p in self._rate_paths]
        self._rate_index = {p: i for i, p in enumerate(self._rate_paths)}

    @property
    def meta_variables(self) -> List[keras.Variable]:
        return super().meta_variables + list(self._rates)

    @property
    def learning_rates(self):
        """The learned rates by weight path (variables)."""
        return dict(zip(self._rate_paths, self._rates))

    def _rate(self, path: str, dtype: tf.DType) -> tf.Tensor:
        if path not in self._rate_index:
            raise KeyError(f"no learned rate for weight {path!r}: the adapter was built "
                           f"for {self._rate_paths}")
        rate = tf.cast(self._rates[self._rate_index[path]], dtype)
        if self.max_learning_rate is not None or self.min_learning_rate is not None:
            high = self.max_learning_rate if self.max_learning_rate is not None else np.inf
            low = self.min_learning_rate if self.min_learning_rate is not None else -high
            rate = tf.clip_by_value(rate, low, high)
        return rate


@gin.configurable
class MetaSGD(_LearnedRates):
    """Meta-SGD (Li et al., 2017): a learned learning rate for every element of every
    adapted weight, meta-trained with the initial weights.

    ``learning_rate`` is the rates' initial value. Everything else is as in
    :class:`GradientDescent` (``adapt`` patterns, ``first_order``, ``per_step`` ...).
    """

    def _rate_shape(self, weight: tf.Tensor) -> Sequence[int]:
        return tuple(weight.shape)

    def step_size(self, step: int, path: str, dtype: tf.DType) -> tf.Tensor:
        return self._rate(path, dtype)


@gin.configurable
class PerStepLearningRates(_LearnedRates):
    """MAML++'s LSLR (Antoniou et al., 2019): a learned scalar learning rate for every
    adapted weight tensor (layer) and every inner step.

    ``learning_rate`` is the rates' initial value. With more inner steps at test time
    than the ``steps`` it was built for, the last step's rates are reused.
    """

    def _rate_shape(self, weight: tf.Tensor) -> Sequence[int]:
        if self.steps < 1:
            raise ValueError(f"PerStepLearningRates needs steps >= 1, got {self.steps}")
        return (self.steps,)

    def step_size(self, step: int, path: str, dtype: tf.DType) -> tf.Tensor:
        return self._rate(path, dtype)[min(step, self.steps - 1)]
