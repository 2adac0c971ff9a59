"""Differentiable inner-loop optimizers: momentum (and Nesterov), Adam, RMSProp.

Each is an update transform (:class:`~metalearn.adapters.updates.Update`) whose state
(momenta, second moments) the loop carries from inner step to inner step, and each
equals its ``keras.optimizers`` counterpart step by step in value (Keras 3's update
rules, ``tests/adapters/optimizers_test.py``). Every operation is a TensorFlow op on
tensors, so the meta-gradient flows through the steps and the state to every order
(second-order MAML with inner Adam). Every hyperparameter may be :class:`Learned` (per
layer, per step, ...), and they compose with masks, annealing, per-step weights,
recomputation and mini-batches like any other transform::

    GradientDescent(5, update=[Mask(("head",)), InnerAdam(Learned(1e-3, "layer"))])

The classes carry an ``Inner`` prefix so that gin names them apart from
``keras.optimizers.Adam`` and friends.
"""

from __future__ import annotations

from typing import Optional

import gin
import tensorflow as tf

from metalearn.adapters.hyperparameters import Learned, Value
from metalearn.adapters.updates import Update
from metalearn.pieces import DECAY, EPSILON, POSITIVE, Capabilities


def _zeros(weights):
    return {p: tf.zeros_like(w) for p, w in weights.items()}


def safe_sqrt(x: tf.Tensor) -> tf.Tensor:
    """``sqrt(x)`` with the derivative at ``x = 0`` taken as 0 instead of infinity.

    Same values. Adam's ``m / (sqrt(v) + eps)`` has an infinite derivative in ``v`` where
    a gradient element is exactly zero (a dead ReLU unit), which turns that element's
    zero contribution into NaN in a second-order meta-gradient; elsewhere the derivative
    is the exact one.
    """
    positive = x > 0
    return tf.where(positive, tf.sqrt(tf.where(positive, x, tf.ones_like(x))),
                    tf.zeros_like(x))


def _learnable(value: Value) -> bool:
    return isinstance(value, Learned) or float(value) != 0


@gin.configurable
class InnerMomentum(Update):
    """SGD with momentum, as ``keras.optimizers.SGD(learning_rate, momentum, nesterov)``:
    ``m <- momentum * m - learning_rate * g``; the update is ``m``, or with Nesterov
    ``momentum * m - learning_rate * g``. State: ``m``, zero before the first step.

    Ranges (:func:`~metalearn.pieces.check_range`; a :class:`Learned` one's initial
    value): ``learning_rate > 0``, ``momentum`` in ``[0, 1)``.
    """

    def __init__(self, learning_rate: Value = 0.01, momentum: Value = 0.9,
                 nesterov: bool = False, name: Optional[str] = None):
        super().__init__(name=name)
        self.learning_rate = self.hyperparameter("learning_rate", learning_rate, POSITIVE)
        self.momentum = self.hyperparameter("momentum", momentum, DECAY)
        self.nesterov = bool(nesterov)

    def own_capabilities(self) -> Capabilities:
        return Capabilities(step_prefix=True)  # its state and the step index alone

    def init(self, weights):
        return _zeros(weights)

    def update(self, grads, state, weights, info):
        updates, new_state = {}, {}
        for p, g in grads.items():
            lr = self.hp("learning_rate", p, info, g.dtype)
            mu = self.hp("momentum", p, info, g.dtype)
            m = state[p] * mu - g * lr
            new_state[p] = m
            updates[p] = m * mu - g * lr if self.nesterov else m
        return updates, new_state


@gin.configurable
class InnerAdam(Update):
    """Adam, as ``keras.optimizers.Adam(learning_rate, beta_1, beta_2, epsilon)``:
    ``m <- m + (g - m)(1 - beta_1)``, ``v <- v + (g^2 - v)(1 - beta_2)``, update
    ``-alpha m / (sqrt(v) + epsilon)`` with
    ``alpha = learning_rate sqrt(1 - beta_2^t) / (1 - beta_1^t)`` at inner step ``t``
    (from 1). State: ``(m, v)``, zero before the first step. ``sqrt`` has a zero
    derivative at 0 (see :func:`safe_sqrt`).

    Ranges (:func:`~metalearn.pieces.check_range`; a :class:`Learned` one's initial
    value): ``learning_rate > 0``, ``beta_1`` and ``beta_2`` in ``[0, 1)``,
    ``epsilon > 0`` (Keras' Adam checks none of them).
    """

    def __init__(self, learning_rate: Value = 0.001, beta_1: Value = 0.9,
                 beta_2: Value = 0.999, epsilon: Value = 1e-7, name: Optional[str] = None):
        super().__init__(name=name)
        self.learning_rate = self.hyperparameter("learning_rate", learning_rate, POSITIVE)
        self.beta_1 = self.hyperparameter("beta_1", beta_1, DECAY)
        self.beta_2 = self.hyperparameter("beta_2", beta_2, DECAY)
        self.epsilon = self.hyperparameter("epsilon", epsilon, EPSILON)

    def own_capabilities(self) -> Capabilities:
        return Capabilities(step_prefix=True)  # its state and the step index alone

    def init(self, weights):
        return _zeros(weights), _zeros(weights)

    def update(self, grads, state, weights, info):
        ms, vs = state
        updates, new_m, new_v = {}, {}, {}
        for p, g in grads.items():
            lr, b1, b2, eps = (self.hp(n, p, info, g.dtype) for n in
                               ("learning_rate", "beta_1", "beta_2", "epsilon"))
            t = tf.cast(info.step + 1, g.dtype)
            alpha = lr * tf.sqrt(1 - tf.pow(b2, t)) / (1 - tf.pow(b1, t))
            m = ms[p] + (g - ms[p]) * (1 - b1)
            v = vs[p] + (tf.square(g) - vs[p]) * (1 - b2)
            new_m[p], new_v[p] = m, v
            updates[p] = -((m * alpha) / (safe_sqrt(v) + eps))
        return updates, (new_m, new_v)


@gin.configurable
class InnerRMSProp(Update):
    """RMSProp, as ``keras.optimizers.RMSprop(learning_rate, rho, momentum, epsilon,
    centered)``: ``v <- rho v + (1 - rho) g^2`` (and, centred, ``a <- rho a + (1 - rho)
    g``), increment ``learning_rate g / sqrt(v [- a^2] + epsilon)``; with momentum
    ``m <- momentum m + increment`` and the update is ``-m``, else ``-increment``.
    State: ``(v, a, m)`` (``a`` and ``m`` only where used), zero before the first step.

    Ranges (:func:`~metalearn.pieces.check_range`; a :class:`Learned` one's initial
    value): ``learning_rate > 0``, ``rho`` and ``momentum`` in ``[0, 1)``,
    ``epsilon > 0``.
    """

    def __init__(self, learning_rate: Value = 0.001, rho: Value = 0.9,
                 momentum: Value = 0.0, epsilon: Value = 1e-7, centered: bool = False,
                 name: Optional[str] = None):
        super().__init__(name=name)
        self.learning_rate = self.hyperparameter("learning_rate", learning_rate, POSITIVE)
        self.rho = self.hyperparameter("rho", rho, DECAY)
        self.momentum = self.hyperparameter("momentum", momentum, DECAY)
        self.epsilon = self.hyperparameter("epsilon", epsilon, EPSILON)
        self.centered = bool(centered)
        self._uses_momentum = _learnable(momentum)

    def own_capabilities(self) -> Capabilities:
        return Capabilities(step_prefix=True)  # its state and the step index alone

    def init(self, weights):
        return (_zeros(weights), _zeros(weights) if self.centered else (),
                _zeros(weights) if self._uses_momentum else ())

    def update(self, grads, state, weights, info):
        velocities, averages, momenta = state
        updates, new_v, new_a, new_m = {}, {}, {}, {}
        for p, g in grads.items():
            lr, rho, eps = (self.hp(n, p, info, g.dtype)
                            for n in ("learning_rate", "rho", "epsilon"))
            v = rho * velocities[p] + (1 - rho) * tf.square(g)
            new_v[p] = v
            if self.centered:
                a = rho * averages[p] + (1 - rho) * g
                new_a[p] = a
                denominator = v - tf.square(a) + eps
            else:
                denominator = v + eps
            increment = (lr * g) / tf.sqrt(denominator)
            if self._uses_momentum:
                m = self.hp("momentum", p, info, g.dtype) * momenta[p] + increment
                new_m[p] = m
                updates[p] = -m
            else:
                updates[p] = -increment
        return updates, (new_v, new_a if self.centered else (),
                         new_m if self._uses_momentum else ())
