"""Evolution strategies (Salimans et al., 2017) as an outer rule: the meta-gradient
estimated from the meta-loss at perturbed values of every meta-variable, with no
backpropagation through the inner loop.

With ``N`` antithetic pairs of Gaussian perturbations ``eps_j`` (one tensor per
meta-variable) and noise scale ``sigma``, the estimate of the gradient of the
meta-loss ``F`` is::

    g = sum_j (F(theta + sigma eps_j) - F(theta - sigma eps_j)) eps_j / (2 N sigma)

(the gradient of the Gaussian-smoothed meta-loss ``E F(theta + sigma eps)``); with
fitness shaping, ``F`` is replaced by the centred ranks of the ``2 N`` meta-losses
(``rank / (2 N - 1) - 1/2``: the scale of the loss no longer matters, outliers neither).
A Keras optimizer applies ``g`` as it would a gradient.

The noise is stateless: pair ``j``'s perturbation of meta-variable ``k`` comes from
Philox bits under the seed ``fold_in(fold_in([seed, meta_step], j), k)`` (int64
throughout: ``stateless_fold_in`` draws in its data's dtype; :func:`noise`), so it
depends only on the rule's seed and the learner's step counter (checkpointed with the
run): a resumed run draws the same noise. It is the same on every
replica, and regenerated rather than stored between the two passes of a step.
"""

from __future__ import annotations

import math
from typing import Callable, List, Optional, Sequence, Tuple

import gin
import keras
import tensorflow as tf

from metalearn.learners.learner import Learner, objective
from metalearn.outer import replicas
from metalearn.outer.rule import Directions, Metrics, OptimizerRule
from metalearn.ranges import COUNT, POSITIVE, WHOLE, check_range

_TWO_PI = 2.0 * math.pi


def pair_seed(seed: tf.Tensor, pair: tf.Tensor) -> tf.Tensor:
    """The Philox seed of antithetic pair ``pair`` under a step's ``seed`` (``[2]``
    int64: the rule's seed and the step counter)."""
    return tf.random.experimental.stateless_fold_in(seed, tf.cast(pair, tf.int64),
                                                     alg="philox")


def noise(seed: tf.Tensor, shapes: Sequence[tf.TensorShape],
          dtypes: Sequence[tf.DType]) -> List[tf.Tensor]:
    """Standard Gaussian noise, one tensor per ``shapes`` / ``dtypes`` entry, from a
    pair's ``seed`` (:func:`pair_seed`): entry ``k`` is the Box-Muller transform
    ``sqrt(-2 log u1) cos(2 pi u2)`` of uniforms ``u = (bits + 1/2) / 2**32`` made of
    the Philox bits ``stateless_uniform([2, size], fold_in(seed, k), uint32)``.

    Built from the raw bits, which XLA and TensorFlow's kernels draw alike (their own
    Gaussian samplers differ), so the noise is the same compiled or not, up to
    rounding in ``log`` and ``cos``.
    """
    result = []
    for k, (shape, dtype) in enumerate(zip(shapes, dtypes)):
        shape, dtype = tf.TensorShape(shape), tf.as_dtype(dtype)
        size = max(int(shape.num_elements()), 1)
        seed_k = tf.random.experimental.stateless_fold_in(seed, tf.constant(k, tf.int64),
                                                          alg="philox")
        bits = tf.random.stateless_uniform([2, size], seed=seed_k, dtype=tf.uint32,
                                           minval=None, maxval=None, alg="philox")
        compute = tf.float64 if dtype == tf.float64 else tf.float32
        uniform = (tf.cast(bits, compute) + 0.5) / 2.0 ** 32
        gaussian = tf.sqrt(-2.0 * tf.math.log(uniform[0])) * tf.cos(_TWO_PI * uniform[1])
        result.append(tf.cast(tf.reshape(gaussian[:shape.num_elements()], shape), dtype))
    return result


def check_population(population: int, owner: str) -> int:
    """``population`` if it is a whole number >= 1 (antithetic pairs); a
    :class:`~metalearn.ranges.HyperparameterRangeError` naming ``owner`` and it
    otherwise (:func:`~metalearn.ranges.check_range`)."""
    return check_range(owner, "population (antithetic pairs)", population, COUNT)


def check_sigma(sigma: float, owner: str) -> float:
    """``sigma`` if it is a finite number > 0 (the noise scale); a
    :class:`~metalearn.ranges.HyperparameterRangeError` naming ``owner`` and it
    otherwise."""
    return check_range(owner, "sigma (the noise scale)", sigma, POSITIVE)


def centred_ranks(fitness: tf.Tensor) -> tf.Tensor:
    """``rank / (n - 1) - 1/2`` of each of the ``n`` values (the smallest ``-1/2``, the
    largest ``+1/2``; ties by position), in ``fitness``'s dtype."""
    n = tf.shape(fitness)[0]
    ranks = tf.argsort(tf.argsort(fitness, stable=True), stable=True)
    return tf.cast(ranks, fitness.dtype) / tf.cast(tf.maximum(n - 1, 1), fitness.dtype) - 0.5


@gin.configurable
class EvolutionStrategies(OptimizerRule):
    """Antithetic evolution strategies on the meta-loss, applied by a Keras optimizer
    (the module's docstring has the estimate and the noise).

    Each member of the population is the meta-loss of the whole batch of tasks at
    perturbed values of every meta-variable (:meth:`Learner.objective`: model weights,
    learned inner rates, heads' and pieces' variables; nothing assigned, no tape), run
    by the formulation like any evaluation. Under ``tf.distribute`` every replica
    evaluates the whole population on its share of the tasks (the same noise
    everywhere); the optimizer averages the replicas' estimates, so the update is the
    whole meta-batch's (with ``centred_ranks`` the fitnesses are averaged over replicas
    before ranking).

    The figures reported are the per-task metrics averaged over the ``2 population``
    members: the smoothed meta-loss that ES descends (no extra evaluation at the
    unperturbed values).

    Args:
      optimizer: a Keras optimizer; defaults to Adam with learning rate 1e-3.
      population: antithetic pairs per step (``2 population`` evaluations), >= 1.
      sigma: the noise scale, > 0.
      centred_ranks: shape the fitness by centred ranks (then the estimate is a
        direction, not of the meta-loss's scale).
      seed: the noise stream's seed (``Runtime.seed`` does not reach it).
    """

    def __init__(self, optimizer: Optional[keras.optimizers.Optimizer] = None,
                 population: int = 8, sigma: float = 0.01, centred_ranks: bool = False,
                 seed: int = 0):
        super().__init__(optimizer)
        population = check_population(population, "EvolutionStrategies")
        sigma = check_sigma(sigma, "EvolutionStrategies")
        seed = check_range("EvolutionStrategies", "seed", seed, WHOLE)
        self.population, self.sigma = int(population), float(sigma)
        self.centred_ranks, self.seed = bool(centred_ranks), int(seed)
        self._compiled_evaluate: Optional[Callable] = None
        self._compiled_estimate: Optional[Callable] = None

    @classmethod
    def configured_class(cls) -> type:
        return EvolutionStrategies

    def step_seed(self, learner: Learner) -> tf.Tensor:
        """``[seed, learner.meta_step]`` (int64): the seed of this step's noise."""
        return tf.stack([tf.constant(self.seed, tf.int64),
                         tf.cast(learner.meta_step, tf.int64)])

    def perturbations(self, learner: Learner, seed: tf.Tensor, pair) -> List[tf.Tensor]:
        """Pair ``pair``'s noise ``eps_j``, one tensor per meta-variable (unscaled)."""
        variables = learner.meta_variables
        return noise(pair_seed(seed, pair), [v.shape for v in variables],
                     [v.dtype for v in variables])

    def evaluate(self, learner: Learner, episodes, formulation, seed: tf.Tensor
                 ) -> Tuple[tf.Tensor, tf.Tensor, Metrics]:
        """The population's meta-losses on this replica's tasks: ``F(theta + sigma
        eps_j)`` and ``F(theta - sigma eps_j)`` (``[population]`` each) and the per-task
        metrics averaged over the members."""
        values = [tf.convert_to_tensor(v) for v in learner.meta_variables]
        # one graph for the meta-loss at given values, called for both members of every
        # pair (traced inline, the first pair and the loop's body held four copies)
        at = tf.function(lambda moved: objective(learner, moved, episodes,
                                                 formulation=formulation), autograph=False)

        def member(pair):
            eps = self.perturbations(learner, seed, pair)
            plus = at([v + self.sigma * e for v, e in zip(values, eps)])
            minus = at([v - self.sigma * e for v, e in zip(values, eps)])
            summed = {name: plus[name] + minus[name] for name in plus}
            return tf.reduce_mean(plus["loss"]), tf.reduce_mean(minus["loss"]), summed

        # The first pair outside the loop gives the figures' structure and dtypes.
        first_plus, first_minus, sums = member(tf.constant(0, tf.int64))
        pluses = tf.TensorArray(first_plus.dtype, size=self.population).write(0, first_plus)
        minuses = tf.TensorArray(first_minus.dtype, size=self.population).write(
            0, first_minus)

        def body(pair, pluses, minuses, sums):
            plus, minus, summed = member(pair)
            return (pair + 1, pluses.write(tf.cast(pair, tf.int32), plus),
                    minuses.write(tf.cast(pair, tf.int32), minus),
                    {name: sums[name] + summed[name] for name in sums})

        _, pluses, minuses, sums = tf.while_loop(
            lambda pair, *_: pair < self.population, body,
            (tf.constant(1, tf.int64), pluses, minuses, sums))
        members = 2 * self.population
        metrics = {name: total / tf.cast(members, total.dtype) for name, total in sums.items()}
        return pluses.stack(), minuses.stack(), metrics

    def shaped(self, plus: tf.Tensor, minus: tf.Tensor) -> tf.Tensor:
        """Each pair's weight ``F+ - F-`` (``[population]``), after fitness shaping
        when ``centred_ranks`` (on the fitnesses averaged over replicas)."""
        if not self.centred_ranks:
            return plus - minus
        plus, minus = replicas.mean([plus, minus])
        ranks = centred_ranks(tf.concat([plus, minus], axis=0))
        return ranks[:self.population] - ranks[self.population:]

    def estimate(self, learner: Learner, weights: tf.Tensor, seed: tf.Tensor
                 ) -> Directions:
        """``sum_j weights_j eps_j / (2 N sigma)``, one tensor per meta-variable: the
        noise regenerated from the seed rather than kept from :meth:`evaluate`."""
        variables = learner.meta_variables
        scale = 1.0 / (2.0 * self.population * self.sigma)

        def body(pair, totals):
            eps = self.perturbations(learner, seed, pair)
            weight = weights[tf.cast(pair, tf.int32)]
            return pair + 1, [t + tf.cast(weight, t.dtype) * e for t, e in zip(totals, eps)]

        _, totals = tf.while_loop(
            lambda pair, _: pair < self.population, body,
            (tf.constant(0, tf.int64), [tf.zeros(v.shape, v.dtype) for v in variables]))
        return [t * tf.constant(scale, t.dtype) for t in totals]

    def directions(self, learner, episodes, formulation):
        """The ES estimate of the meta-gradient (one entry per
        :attr:`Learner.meta_variables`) and the population's mean per-task figures."""
        seed = self.step_seed(learner)
        plus, minus, metrics = self.evaluate(learner, episodes, formulation, seed)
        return self.estimate(learner, self.shaped(plus, minus), seed), metrics

    def step(self, learner, episodes, formulation, apply=None, jit_compile=False):
        """:meth:`directions` in three parts, so that under XLA on several replicas
        the fitnesses' all-reduce (centred ranks) runs between two compiled parts."""
        seed = self.step_seed(learner)
        plus, minus, metrics = self._part("evaluate", jit_compile)(
            learner, episodes, formulation, seed)
        weights = self.shaped(plus, minus)
        directions = self._part("estimate", jit_compile)(learner, weights, seed)
        return (apply or self.apply)(learner, directions, metrics)

    def _part(self, name: str, jit_compile: bool) -> Callable:
        """The method ``name``, compiled by XLA when ``jit_compile``."""
        if not jit_compile:
            return getattr(self, name)
        attribute = f"_compiled_{name}"
        if getattr(self, attribute) is None:
            setattr(self, attribute, tf.function(getattr(self, name), jit_compile=True))
        return getattr(self, attribute)
