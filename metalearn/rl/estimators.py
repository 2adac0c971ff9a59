"""Returns, advantages, baselines and the policy-gradient surrogate losses.

The inner policy-gradient loss is written with DiCE (Foerster et al. 2018): its value is
the batch's mean return and its derivatives of *every* order, in expectation, are those
of the expected return, because the dependence of the sampled trajectories on the policy
is carried by the magic box ``exp(x - stop_gradient(x))`` of the log-probabilities
(:func:`magic_box`), not by the (stop-gradiented) actions. With the baseline in the form
of Loaded DiCE (Farquhar et al. 2019)::

    objective = sum_t [box(S_t) - box(S_{t-1})] A_t,   S_t = sum_{t' <= t} log pi(a_t' | s_t')

which equals ``sum_t box(S_t) r_t`` in every derivative's expectation when ``A_t`` is the
reward-to-go minus any baseline of the state (``gae_lambda=1``): the existing inner-loop
pieces (plain steps, first order, Meta-SGD rates, inner Adam) then differentiate it to
any order unchanged. :class:`NaiveSurrogate` (``log pi * A``, the MAML code's inner
loss) has the right first derivative and the wrong second: ``tests/rl/meta_rl_test.py``
shows both against the exact expected return of a tabular MDP.

:class:`LVC`, ProMP's low variance curvature estimator (Rothfuss et al. 2019), boxes each
step's log-probability alone (``sum_t box(log pi(a_t | s_t)) A_t``): the same first
derivative, and a Hessian without the cross terms between time steps, biased but of
lower variance than DiCE's (its docstring).
"""

from __future__ import annotations

from typing import Callable, Dict, NamedTuple, Optional, Sequence, Tuple

import gin
import keras
import numpy as np
import tensorflow as tf

from metalearn import functional
from metalearn.ranges import COUNT, NON_NEGATIVE, POSITIVE, UNIT, check_range
from metalearn.rl.environments import Trajectories


def magic_box(x: tf.Tensor) -> tf.Tensor:
    """DiCE's magic box: 1 in value, ``d box(x) = box(x) dx`` in every derivative."""
    return tf.exp(x - tf.stop_gradient(x))


def _reverse_discounted(values: tf.Tensor, factor: float) -> tf.Tensor:
    """``out_t = values_t + factor * out_{t+1}`` along the last axis (``out_T = 0``)."""
    time_first = tf.experimental.numpy.moveaxis(values, -1, 0)
    out = tf.scan(lambda carry, v: v + factor * carry, time_first,
                  initializer=tf.zeros_like(time_first[0]), reverse=True)
    return tf.experimental.numpy.moveaxis(out, 0, -1)


def discounted_returns(rewards: tf.Tensor, discount: float) -> tf.Tensor:
    """Rewards-to-go ``G_t = sum_{t' >= t} discount^(t' - t) r_t'`` along the last axis."""
    return _reverse_discounted(rewards, float(discount))


def gae(rewards: tf.Tensor, values: tf.Tensor, mask: tf.Tensor, discount: float,
        gae_lambda: float) -> tf.Tensor:
    """Generalised advantage estimates (Schulman et al. 2016) along the last axis:
    ``A_t = sum_l (discount * lambda)^l delta_{t+l}``, ``delta_t = r_t + discount *
    V_{t+1} - V_t``, with the value after the last step (and after an episode's end) 0.
    ``gae_lambda=1`` gives ``G_t - V_t``."""
    values = values * mask
    following = tf.concat([values[..., 1:], tf.zeros_like(values[..., :1])], -1)
    deltas = (rewards + float(discount) * following - values) * mask
    return _reverse_discounted(deltas, float(discount) * float(gae_lambda)) * mask


@gin.configurable
class LinearFeatureBaseline:
    """The linear feature baseline of the MAML code (rllab's ``LinearFeatureBaseline``):
    the returns regressed by ridge regression (``reg``) on the features ``[o, o**2, t,
    t**2, t**3, 1]`` (``o``: the observation clipped to ``[-10, 10]``, ``t``: the step
    over 100), fitted on the batch it is then applied to. No variables: refitted on
    every batch, outside every gradient."""

    def __init__(self, reg: float = 1e-5):
        reg = check_range("LinearFeatureBaseline", "reg", reg, NON_NEGATIVE)
        self.reg = float(reg)

    @staticmethod
    def features(observations: tf.Tensor) -> tf.Tensor:
        """``[n, T, 3 * obs + 4]`` features of ``[n, T, obs]`` observations (float64)."""
        o = tf.clip_by_value(tf.cast(observations, tf.float64), -10.0, 10.0)
        steps = tf.shape(o)[1]
        t = tf.cast(tf.range(steps), tf.float64)[None, :, None] / 100.0
        t = tf.broadcast_to(t, tf.concat([tf.shape(o)[:2], [1]], 0))
        return tf.concat([o, o ** 2, t, t ** 2, t ** 3, tf.ones_like(t)], -1)

    def __call__(self, trajectories: Trajectories, returns: tf.Tensor,
                 weights: tf.Tensor) -> tf.Tensor:
        """The fitted values ``[n, T]`` (each trajectory's steps weighted by its weight
        and mask)."""
        features = self.features(trajectories.observations)
        k = features.shape[-1]
        w = tf.reshape(tf.cast(trajectories.mask * weights[:, None], tf.float64), [-1])
        coefficients = _weighted_ridge(tf.reshape(features, [-1, k]),
                                       tf.reshape(tf.cast(returns, tf.float64), [-1]),
                                       w, self.reg)
        values = tf.linalg.matvec(features, coefficients)
        return tf.stop_gradient(tf.cast(values, returns.dtype))


def _weighted_ridge(features: tf.Tensor, target: tf.Tensor, w: tf.Tensor,
                    reg: float) -> tf.Tensor:
    """``[k]`` coefficients minimising ``sum_i w_i (features_i . c - target_i)^2 + reg *
    sum(w) |c|^2`` (``features [m, k]``, ``target``, ``w [m]``; float64)."""
    k = features.shape[-1]
    weighted = features * w[:, None]
    gram = tf.matmul(weighted, features, transpose_a=True)
    scale = tf.reduce_sum(w)  # the regulariser relative to the data's weight
    return tf.linalg.solve(gram + reg * scale * tf.eye(k, dtype=features.dtype),
                           tf.matmul(weighted, target[:, None], transpose_a=True))[:, 0]


@gin.configurable
class ValueNetworkBaseline:
    """A value network as the baseline: a small Keras MLP ``V(o, t)`` of the observation
    (clipped to ``[-10, 10]``) and the step over 100 (the inputs of
    :class:`LinearFeatureBaseline`), refitted to the returns of every batch it is
    applied to (one task's trajectories), with the same interface.

    The fit starts each time from the same initial weights (Glorot, ``seed``): the
    hidden layers (a Keras ``Sequential`` of ``Dense`` layers) take ``steps`` Adam steps
    (rate ``learning_rate``) on the weighted squared error of the standardised returns,
    and at every step the linear output layer is the weighted ridge solution (``reg``)
    on the last hidden layer's features (variable projection: the output layer is
    exact for the features it sees, the gradient steps improve the features). The
    values are stop-gradiented: a function of the state, as a baseline must be, so it
    changes no derivative of the DiCE objective in expectation (and none with an
    exact batch, ``tests/rl/meta_rl_test.py``) and only lowers the variance.

    Args:
      hidden: the hidden layers' widths.
      steps: Adam steps of the hidden layers per fit (>= 1).
      learning_rate: Adam's rate on the standardised returns.
      activation: the hidden layers' activation (a Keras name).
      reg: the output layer's ridge regulariser, relative to the data's weight.
      seed: the initial weights' seed.
    """

    def __init__(self, hidden: Sequence[int] = (32, 32), steps: int = 20,
                 learning_rate: float = 0.01, activation: str = "tanh",
                 reg: float = 1e-5, seed: int = 0):
        owner = "ValueNetworkBaseline"
        if isinstance(hidden, (int, str)) or not len(hidden):
            raise ValueError(f"{owner}.hidden must be a non-empty sequence of widths, "
                             f"got {hidden!r}")
        self.hidden = tuple(check_range(owner, "hidden", h, COUNT) for h in hidden)
        self.steps = check_range(owner, "steps", steps, COUNT)
        self.learning_rate = check_range(owner, "learning_rate", learning_rate, POSITIVE)
        self.reg = check_range(owner, "reg", reg, NON_NEGATIVE)
        keras.activations.get(activation)  # an unknown name fails here, not at a step
        self.activation = activation
        self.seed = int(seed)
        self._networks: Dict[int, Tuple[keras.Model, Dict[str, np.ndarray]]] = {}

    @staticmethod
    def inputs(observations: tf.Tensor) -> tf.Tensor:
        """``[n, T, obs + 1]`` network inputs of ``[n, T, obs]`` observations (float64)."""
        o = tf.clip_by_value(tf.cast(observations, tf.float64), -10.0, 10.0)
        t = tf.cast(tf.range(tf.shape(o)[1]), tf.float64)[None, :, None] / 100.0
        return tf.concat([o, tf.broadcast_to(t, tf.concat([tf.shape(o)[:2], [1]], 0))], -1)

    def network(self, size: int) -> Tuple[keras.Model, Dict[str, np.ndarray]]:
        """The hidden layers for ``size`` inputs (a float64 Keras ``Sequential``, built
        once per input size outside any traced function) and their initial weights."""
        if size not in self._networks:
            with tf.init_scope():
                layers = [keras.Input((size,), dtype="float64")] + [
                    keras.layers.Dense(width, activation=self.activation,
                                       dtype="float64", name=f"value{i}",
                                       kernel_initializer=keras.initializers.GlorotUniform(
                                           self.seed + i))
                    for i, width in enumerate(self.hidden)]
                model = keras.Sequential(layers, name="value_network")
                initial = {p: np.asarray(v) for p, v in functional.variables(model).items()}
            self._networks[size] = (model, initial)
        return self._networks[size]

    def __call__(self, trajectories: Trajectories, returns: tf.Tensor,
                 weights: tf.Tensor) -> tf.Tensor:
        """The fitted values ``[n, T]`` (each trajectory's steps weighted by its weight
        and mask)."""
        inputs = self.inputs(trajectories.observations)
        size = inputs.shape[-1]
        model, initial = self.network(size)
        flat = tf.stop_gradient(tf.reshape(inputs, [-1, size]))
        w = tf.reshape(tf.cast(trajectories.mask * weights[:, None], tf.float64), [-1])
        w = tf.stop_gradient(w / tf.reduce_sum(w))
        target = tf.stop_gradient(tf.reshape(tf.cast(returns, tf.float64), [-1]))
        mean = tf.reduce_sum(w * target)
        std = tf.sqrt(tf.reduce_sum(w * tf.square(target - mean))) + 1e-8
        target = (target - mean) / std

        def features(body):
            h = functional.call(model, body, flat)
            return tf.concat([h, tf.ones_like(h[:, :1])], -1)

        def head(h):
            return _weighted_ridge(h, target, w, self.reg)

        def step(i, body, m, v):
            with tf.GradientTape() as tape:
                tape.watch(body)
                h = features(body)
                coefficients = tf.stop_gradient(head(h))  # exact: the envelope theorem
                loss = tf.reduce_sum(w * tf.square(tf.linalg.matvec(h, coefficients) - target))
            gradients = tape.gradient(loss, body)
            t = tf.cast(i + 1, tf.float64)
            m = {p: 0.9 * m[p] + 0.1 * gradients[p] for p in body}
            v = {p: 0.999 * v[p] + 0.001 * tf.square(gradients[p]) for p in body}
            rate = self.learning_rate * tf.sqrt(1.0 - 0.999 ** t) / (1.0 - 0.9 ** t)
            body = {p: body[p] - rate * m[p] / (tf.sqrt(v[p]) + 1e-8) for p in body}
            return i + 1, body, m, v

        body = {p: tf.constant(value) for p, value in initial.items()}
        zeros = {p: tf.zeros_like(value) for p, value in body.items()}
        _, body, _, _ = tf.while_loop(lambda i, *_: i < self.steps, step,
                                      (tf.constant(0), body, zeros, zeros))
        h = features(body)
        values = tf.linalg.matvec(h, head(h)) * std + mean
        values = tf.reshape(values, tf.shape(trajectories.mask))
        return tf.stop_gradient(tf.cast(values, returns.dtype))


class Batch(NamedTuple):
    """What a surrogate loss needs of one task's trajectories (the learner's ``y``).

    Attributes:
      actions: as in :class:`~metalearn.rl.environments.Trajectories`.
      rewards, mask: ``[n, T]``.
      advantages: ``[n, T]``, zero after an episode's end.
      weights: ``[n]``, summing to 1: ``1 / n`` for sampled rollouts, the (stopped)
        trajectory probabilities for an exact enumeration.
      behaviour: ``None`` for trajectories sampled from the policy being
        differentiated (the magic box's ``stop_gradient`` stands for their
        probabilities); for trajectories collected earlier
        (:class:`metalearn.rl.Collected`), ``[n, T]`` the log-probabilities of their
        actions under the policy that collected them: the surrogates then weight by the
        likelihood ratio to it, a function of the weights whose derivatives at the
        collecting weights are DiCE's and which stays an importance-sampling estimate
        elsewhere.
      infos: the trajectories' per-step figures of the simulator by name
        (:attr:`~metalearn.rl.environments.Trajectories.infos`), for metrics.
    """

    actions: tf.Tensor
    rewards: tf.Tensor
    mask: tf.Tensor
    advantages: tf.Tensor
    weights: tf.Tensor
    behaviour: Optional[tf.Tensor] = None
    infos: Dict[str, tf.Tensor] = {}  # never mutated: a new dict for every value


@gin.configurable
class DiCE:
    """The policy-gradient surrogate whose every derivative is right (module docstring).

    Args:
      discount: the discount of the returns the advantages are made of.
      gae_lambda: GAE's lambda; 1 (the default, as the MAML code) gives the reward-to-go
        minus the baseline, unbiased at every order; below 1 trades bias for variance.
      baseline: a function of ``(trajectories, returns, weights)`` giving ``[n, T]``
        values (:class:`LinearFeatureBaseline`, :class:`ValueNetworkBaseline`), or
        ``None`` for none.
      normalize_advantages: centre and scale the advantages over the batch (the MAML
        code's ``center_adv``): a constant baseline and a step-size change per batch.
      mean_over_steps: the objective divided by the horizon, value and derivatives
        alike (the mean over time steps of the MAML code's surrogate, the scale its inner
        rate 0.1 is for); the learner's ``return`` metric stays the return.
    """

    def __init__(self, discount: float = 0.99, gae_lambda: float = 1.0,
                 baseline: Optional[Callable[..., tf.Tensor]] = None,
                 normalize_advantages: bool = False, mean_over_steps: bool = False):
        discount = check_range(type(self).__name__, "discount", discount, UNIT)
        gae_lambda = check_range(type(self).__name__, "gae_lambda", gae_lambda, UNIT)
        if baseline is not None and not callable(baseline):
            raise TypeError(f"baseline must be callable(trajectories, returns, weights), "
                            f"got {baseline!r}")
        self.discount = float(discount)
        self.gae_lambda = float(gae_lambda)
        self.baseline = baseline
        self.normalize_advantages = bool(normalize_advantages)
        self.mean_over_steps = bool(mean_over_steps)

    def targets(self, trajectories: Trajectories, weights: Optional[tf.Tensor] = None,
                behaviour: Optional[tf.Tensor] = None) -> Batch:
        """The :class:`Batch` of ``trajectories`` (``weights``: ``1 / n`` each by
        default; ``behaviour``: the collecting policy's log-probabilities, see
        :class:`Batch`), everything in it stop-gradiented."""
        rewards, mask = trajectories.rewards, trajectories.mask
        if weights is None:
            n = tf.shape(rewards)[0]
            weights = tf.ones([n], rewards.dtype) / tf.cast(n, rewards.dtype)
        weights = tf.stop_gradient(tf.cast(weights, rewards.dtype))
        returns = discounted_returns(rewards, self.discount)
        values = tf.zeros_like(rewards) if self.baseline is None else \
            self.baseline(trajectories, returns, weights)
        advantages = gae(rewards, values, mask, self.discount, self.gae_lambda)
        if self.normalize_advantages:
            w = mask * weights[:, None]
            total = tf.reduce_sum(w)
            mean = tf.reduce_sum(w * advantages) / total
            var = tf.reduce_sum(w * tf.square(advantages - mean)) / total
            advantages = (advantages - mean) * tf.math.rsqrt(var + 1e-8) * mask
        if behaviour is not None:
            behaviour = tf.stop_gradient(tf.cast(behaviour, rewards.dtype) * mask)
        infos = {k: tf.stop_gradient(v) for k, v in trajectories.infos.items()}
        return Batch(*[tf.stop_gradient(t) for t in (trajectories.actions, rewards, mask,
                                                     advantages, weights)], behaviour, infos)

    def surrogate(self, log_probs: tf.Tensor, batch: Batch) -> tf.Tensor:
        """``[n]`` per trajectory: 0 in value, the estimator in its derivatives (with
        ``batch.behaviour``: the magic box's values are the likelihood ratios of the
        trajectories' prefixes to the collecting policy, 1 at its weights)."""
        log_probs = log_probs * batch.mask
        cumulative = tf.cumsum(log_probs, axis=-1)
        if batch.behaviour is None:
            box, previous = magic_box(cumulative), magic_box(cumulative - log_probs)
        else:
            behaviour = tf.cast(batch.behaviour, log_probs.dtype)
            collected = tf.cumsum(behaviour, axis=-1)
            box = tf.exp(cumulative - collected)
            previous = tf.exp((cumulative - log_probs) - (collected - behaviour))
        return tf.reduce_sum((box - previous) * batch.advantages, -1)

    def objective(self, log_probs: tf.Tensor, batch: Batch) -> tf.Tensor:
        """The weighted mean return in value, the estimated expected return's
        derivatives in its derivatives (``log_probs [n, T]``: the policy's, of
        ``batch.actions``)."""
        returns = tf.reduce_sum(batch.rewards * batch.mask, -1)
        total = tf.reduce_sum(batch.weights * (returns + self.surrogate(log_probs, batch)))
        if self.mean_over_steps:
            total = total / tf.cast(tf.shape(batch.rewards)[-1], total.dtype)
        return total

    def __call__(self, log_probs: tf.Tensor, batch: Batch) -> tf.Tensor:
        """The loss: minus :meth:`objective`."""
        return -self.objective(log_probs, batch)


@gin.configurable
class NaiveSurrogate(DiCE):
    """``sum_t log pi(a_t | s_t) A_t``: the MAML code's inner loss. Its gradient is the
    policy gradient; its Hessian lacks the products of scores that the dependence of
    the sampled trajectories on the policy adds, so second-order meta-gradients through
    it are wrong (``tests/rl/meta_rl_test.py``). For comparisons; use :class:`DiCE`."""

    def surrogate(self, log_probs, batch):
        if batch.behaviour is not None:  # the per-step likelihood ratio (MAML-TRPO's)
            return _step_ratio_surrogate(log_probs, batch)
        log_probs = log_probs * batch.mask
        return tf.reduce_sum((log_probs - tf.stop_gradient(log_probs)) * batch.advantages, -1)


def _step_ratio_surrogate(log_probs: tf.Tensor, batch: Batch) -> tf.Tensor:
    """``[n]``: ``sum_t (ratio_t - 1) A_t`` with ``ratio_t`` each step's own likelihood
    ratio: ``pi / stop_gradient(pi)`` (the magic box of the step's log-probability, 1 in
    value), or with ``batch.behaviour`` the ratio to the collecting policy."""
    log_probs = log_probs * batch.mask
    if batch.behaviour is None:
        ratio = magic_box(log_probs)
    else:
        ratio = tf.exp(log_probs - tf.cast(batch.behaviour, log_probs.dtype))
    return tf.reduce_sum((ratio - 1.0) * batch.mask * batch.advantages, -1)


@gin.configurable
class LVC(DiCE):
    """ProMP's low variance curvature estimator (Rothfuss et al. 2019, section 5): each
    time step's likelihood ratio to itself, stop-gradiented, times its advantage::

        J_LVC = sum_t [pi(a_t | s_t) / stop_gradient(pi(a_t | s_t))] A_t

    per-step ratios where DiCE's magic box holds the cumulative sum of the
    log-probabilities (the prefix's probability). With ``g_t = grad log pi(a_t | s_t)``
    and ``H_t`` its Hessian, on every batch (each trajectory weighted by its weight):

    * its gradient is ``sum_t A_t g_t``, the policy gradient: DiCE's and
      :class:`NaiveSurrogate`'s on the same batch (equal up to rounding), unbiased;
    * its Hessian is ``sum_t A_t (g_t g_t^T + H_t)``: per step, **without** the cross
      terms ``sum_t A_t sum_{t' < t} (g_t g_t'^T + g_t' g_t^T)`` that DiCE's Hessian
      adds (the products of a step's score with the earlier steps' ones). Their
      expectation is not zero, so this is a biased estimate of the expected return's
      Hessian; dropping them is what lowers its variance (ProMP's trade, for the
      meta-gradient through the inner step). Unlike :class:`NaiveSurrogate`'s it keeps
      the ``g_t g_t^T`` terms;
    * its third and higher derivatives are not the expected return's either: with
      several inner steps the meta-gradient is biased beyond the curvature above.

    Everything else is :class:`DiCE`'s (the advantages, baselines, arguments and
    checks): the value is the batch's weighted mean return (the surrogate is 0 in value;
    the paper's ``J_LVC`` is ``sum_t A_t`` in value, a constant away), so the learner's
    ``loss`` stays minus the return. With ``batch.behaviour`` (collected trajectories,
    :class:`metalearn.rl.ClippedRatio`'s replay) each step's ratio is to the collecting
    policy, whose derivatives at the collecting weights are the ones above (ProMP's
    inner objective on its collected samples). As the query loss, only its first
    derivative enters the meta-gradient: there it gives DiCE's. ProMP uses it for the
    inner step (``experiments/rl/point_nav_promp.gin``).
    """

    def surrogate(self, log_probs: tf.Tensor, batch: Batch) -> tf.Tensor:
        """``[n]`` per trajectory: ``sum_t (ratio_t - 1) A_t``, 0 in value (with
        ``batch.behaviour``: each step's likelihood ratio to the collecting policy)."""
        return _step_ratio_surrogate(log_probs, batch)
