"""TRPO as an outer rule: the meta-optimizer of MAML's reinforcement-learning experiments
(Finn et al. 2017, after Schulman et al. 2015).

One step on a batch of tasks, with ``theta`` the meta-variables before it:

1. the trajectories the step needs are collected at ``theta`` and held fixed
   (:meth:`metalearn.rl.PolicyLearner.collect`: every inner step's support
   trajectories and the adapted policy's query trajectories);
2. for meta-variable values ``theta'``, each task is adapted on its collected support
   trajectories, ``phi_i(theta')``, and compared with ``phi_i(theta)`` on its query
   trajectories: the surrogate ``L(theta') = mean_i E[ratio_t A_t]`` (``ratio_t =
   pi_phi_i(theta')(a_t | s_t) / pi_phi_i(theta)(a_t | s_t)``, the weighted mean over the
   steps taken) and the mean KL divergence ``D(theta') = mean_i E[KL(pi_phi_i(theta) ||
   pi_phi_i(theta'))]`` (as the MAML-TRPO code);
3. the natural-gradient direction ``x ~ F^-1 g`` by :func:`conjugate_gradient`, with
   ``g`` the gradient of ``L`` and ``F v`` the Hessian-vector products of ``D`` (plus
   ``damping * v``), both at ``theta`` and through the whole inner loop (to every
   order the adapter keeps);
4. the full step ``sqrt(2 max_kl / (x.Fx + 1e-8)) x`` shrunk by
   :func:`backtracking_line_search` (``backtrack_ratio ** k``, ``k < max_backtracks``)
   until the surrogate improves and ``D <= max_kl``; if no fraction passes, no step
   (rllab's ``ConjugateGradientOptimizer``, which the MAML code uses).

The direction handed to ``apply`` is ``theta - theta_new`` (zero if the line search
rejected every step); under ``tf.distribute`` the gradient, the products and the line
search's figures are means over the replicas, so every replica takes the same step.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence, Tuple

import gin
import keras
import tensorflow as tf

from metalearn.execution import Formulation
from metalearn.learners.learner import Learner
from metalearn.outer import replicas
from metalearn.outer.rule import Directions, Metrics, OuterRule
from metalearn.pieces import COUNT, NON_NEGATIVE, POSITIVE, Range, check_range
from metalearn.rl.learner import PolicyLearner
from metalearn.tasks.episode import Episode

Vector = List[tf.Tensor]


def _dot(a: Sequence[tf.Tensor], b: Sequence[tf.Tensor]) -> tf.Tensor:
    return tf.add_n([tf.reduce_sum(x * y) for x, y in zip(a, b)])


def conjugate_gradient(product: Callable[[Vector], Vector], b: Sequence[tf.Tensor],
                       iterations: int = 10, residual_tol: float = 1e-10) -> Vector:
    """Approximately solves ``A x = b`` for a symmetric positive-definite ``A`` given by
    its products ``product(v) = A v`` (vectors as lists of tensors, e.g. one per
    meta-variable), by at most ``iterations`` conjugate-gradient steps from ``x = 0``,
    stopping once the squared residual is below ``residual_tol`` (in a
    ``tf.while_loop``: ``product`` is traced once)."""
    b = [tf.convert_to_tensor(t) for t in b]
    zeros = [tf.zeros_like(t) for t in b]
    start = _dot(b, b)

    def body(i, x, r, p, rr):
        ap = product(p)
        alpha = rr / _dot(p, ap)
        x = [xi + alpha * pi for xi, pi in zip(x, p)]
        r = [ri - alpha * api for ri, api in zip(r, ap)]
        new = _dot(r, r)
        p = [ri + (new / rr) * pi for ri, pi in zip(r, p)]
        return i + 1, x, r, p, new

    _, x, _, _, _ = tf.while_loop(
        lambda i, x, r, p, rr: tf.logical_and(i < iterations, rr >= residual_tol), body,
        (tf.constant(0), zeros, list(b), list(b), start))
    return list(x)


def backtracking_line_search(evaluate: Callable[[tf.Tensor], Tuple[tf.Tensor, tf.Tensor]],
                             surrogate_before: tf.Tensor, max_kl: float,
                             backtrack_ratio: float = 0.8, max_backtracks: int = 15
                             ) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor]:
    """The first fraction ``backtrack_ratio ** k`` (``k = 0, 1, ...``, fewer than
    ``max_backtracks``) of a step at which ``evaluate(fraction) -> (surrogate, kl)``
    improves on ``surrogate_before`` with ``kl <= max_kl`` (both finite).

    Returns:
      ``(fraction, surrogate, kl, accepted)``: the accepted fraction (0 if none is,
      with the last one's figures), and ``accepted`` as a boolean scalar.
    """
    surrogate_before = tf.convert_to_tensor(surrogate_before)
    dtype = surrogate_before.dtype

    def body(k, fraction, surrogate, kl, accepted):
        fraction = tf.cast(backtrack_ratio, dtype) ** tf.cast(k, dtype)
        surrogate, kl = evaluate(fraction)
        surrogate, kl = tf.cast(surrogate, dtype), tf.cast(kl, dtype)
        accepted = tf.logical_and(tf.logical_and(surrogate > surrogate_before, kl <= max_kl),
                                  tf.logical_and(tf.math.is_finite(surrogate),
                                                 tf.math.is_finite(kl)))
        return k + 1, fraction, surrogate, kl, accepted

    zero = tf.zeros([], dtype)
    _, fraction, surrogate, kl, accepted = tf.while_loop(
        lambda k, f, s, d, accepted: tf.logical_and(k < max_backtracks,
                                                    tf.logical_not(accepted)),
        body, (tf.constant(0), zero, surrogate_before, zero, tf.constant(False)))
    return tf.where(accepted, fraction, zero), surrogate, kl, accepted


def query_ratios(learner: Any, episode: Episode, old_outputs: tf.Tensor
                 ) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor, Metrics]:
    """One collected task at the current meta-variable values: ``(outputs,
    old_outputs, ratio, weights, advantages, figures)``, the adapted policy's outputs on
    the query trajectories (``learner.outputs_of`` of its ``run_task``) and the collecting one's, the
    per-step likelihood ratios ``[n, T]``, the steps' weights (summing to 1 over the
    steps taken), the advantages and the task's figures."""
    run = learner.run_task(episode)
    outputs, batch, metrics = learner.outputs_of(run), run.query_y, run.metrics
    distribution = learner.distribution
    old_outputs = tf.stop_gradient(tf.cast(old_outputs, outputs.dtype))
    ratio = tf.exp(distribution.log_prob(outputs, batch.actions)
                   - distribution.log_prob(old_outputs, batch.actions))
    weights = tf.cast(batch.weights[:, None] * batch.mask, outputs.dtype)
    weights = weights / tf.reduce_sum(weights)
    return (outputs, old_outputs, ratio, weights, tf.cast(batch.advantages, outputs.dtype),
            metrics)


def trust_region_figures(learner: Any, episode: Episode, old_outputs: tf.Tensor
                         ) -> Metrics:
    """One collected task at the current meta-variable values (:func:`query_ratios`):
    its figures, ``"surrogate"`` (the weighted mean over the query trajectories' steps
    of ``ratio_t A_t``, the ratio against the policy whose outputs were
    ``old_outputs``) and ``"kl"`` (the weighted mean of ``KL(old || new)``)."""
    outputs, old_outputs, ratio, weights, advantages, metrics = query_ratios(
        learner, episode, old_outputs)
    return {**metrics, "surrogate": tf.reduce_sum(weights * ratio * advantages),
            "kl": tf.reduce_sum(weights * learner.distribution.kl(old_outputs, outputs))}


class TrustRegion:
    """One batch of tasks' trust-region problem (steps 1 and 2 of the module's
    docstring): the trajectories collected at the current meta-variable values
    :attr:`theta` and held fixed, and the functions of the meta-variables TRPO needs.

    Args:
      learner: a learner with ``collect`` and ``outputs_of`` (``PolicyLearner``).
      episodes: the batch of tasks (leading task axis).
      formulation: how the tasks run (resolved on ``episodes`` once).
      figures: ``figures(learner, collected episode, old outputs)`` of one task
        (:func:`trust_region_figures`; a clipped-ratio rule adds its objective).
    """

    def __init__(self, learner: Any, episodes: Episode, formulation: Formulation,
                 figures: Optional[Callable[[Any, Episode, tf.Tensor], Metrics]] = None):
        self.learner = learner
        self.formulation = formulation.resolve(learner, episodes)  # then given other nests
        self.variables = learner.meta_variables
        self.theta = [tf.convert_to_tensor(v) for v in self.variables]
        signature = self.formulation.signature_of  # None where none is needed
        self.collected = self.formulation.per_task(learner, learner.collect, episodes,
                                                   signature(learner.collect, episodes))
        outputs_of = lambda episode: learner.outputs_of(learner.run_task(episode))
        self.old_outputs = tf.stop_gradient(self.formulation.per_task(
            learner, outputs_of, self.collected, signature(outputs_of, self.collected)))
        self._data = (self.collected, self.old_outputs)
        figures = figures or trust_region_figures
        self._figures_of = lambda pair: figures(learner, *pair)
        self._spec = signature(self._figures_of, self._data)  # traced once, for every run
        # the figures at given values, one graph for every use in a step (the gradient
        # and Fisher products at theta, the line search's candidates), each use
        # differentiating through its call instead of tracing the tasks again
        self._at = tf.function(self._figures_with, autograph=False)

    def figures(self) -> Metrics:
        """Each task's :func:`trust_region_figures` at the meta-variables' current
        values (or those of an enclosing ``keras.StatelessScope``)."""
        return self.formulation.per_task(self.learner, self._figures_of, self._data,
                                         self._spec)

    def _figures_with(self, values: List[tf.Tensor]) -> Metrics:
        with keras.StatelessScope(state_mapping=list(zip(self.variables, values))):
            return self.figures()

    def figures_at(self, values: Sequence[tf.Tensor]) -> Metrics:
        """:meth:`figures` with the meta-variables at ``values`` (nothing assigned),
        differentiable in ``values``; every call in a step runs one traced function."""
        return self._at(list(values))

    @staticmethod
    def mean(values: Metrics, name: str) -> tf.Tensor:
        """The figure ``name``'s mean over the tasks of every replica."""
        return replicas.mean([tf.reduce_mean(values[name])])[0]

    def gradient(self) -> Tuple[Vector, Metrics, tf.Tensor]:
        """``(g, figures, L(theta))``: the surrogate's gradient by meta-variable (mean
        over replicas), the per-task figures and the surrogate, at :attr:`theta`."""
        with tf.GradientTape() as tape:
            tape.watch(self.theta)
            metrics = self.figures_at(self.theta)
            surrogate = self.mean(metrics, "surrogate")
        return replicas.mean(tape.gradient(surrogate, self.theta)), metrics, surrogate

    def fisher_product(self, v: Sequence[tf.Tensor], damping: float = 0.0) -> Vector:
        """``(H + damping I) v``, ``H`` the Hessian of the mean KL at the current values
        (at :attr:`theta`: the Fisher matrix of the adapted policies, through the inner
        loops), by double backpropagation."""
        with tf.GradientTape() as outer:
            outer.watch(self.theta)
            with tf.GradientTape() as inner:
                inner.watch(self.theta)
                kl = self.mean(self.figures_at(self.theta), "kl")
            grads = inner.gradient(kl, self.theta)
            product = _dot(grads, [tf.stop_gradient(t) for t in v])
        products = replicas.mean(outer.gradient(product, self.theta))
        return [p + damping * t for p, t in zip(products, v)]

    def evaluate(self, values: Sequence[tf.Tensor]) -> Tuple[tf.Tensor, tf.Tensor]:
        """``(L, D)`` with the meta-variables at ``values`` (nothing assigned)."""
        moved = self.figures_at(values)
        return self.mean(moved, "surrogate"), self.mean(moved, "kl")


@gin.configurable
class TRPO(OuterRule):
    """Trust-region policy optimisation on the meta-objective (the module's docstring),
    for a learner with collectable trajectories and a policy distribution with a KL
    (:class:`metalearn.rl.PolicyLearner`).

    The figures reported are the learner's per-task figures before the update (on the
    collected trajectories, equal to the on-policy ones) and ``"kl"``, the mean KL of
    the step taken (0 if none was), and ``"accepted"`` (1 or 0), each broadcast over
    the tasks.

    Args:
      max_kl: the trust region: the largest mean KL a step may reach (the MAML paper's
        0.01).
      cg_iters: conjugate-gradient iterations (10).
      cg_damping: ``damping`` added to the Fisher products (``F + damping I``; rllab's
        ``reg_coeff``, 1e-5).
      residual_tol: conjugate gradient stops at this squared residual.
      backtrack_ratio, max_backtracks: the line search's shrink factor (0.8) and
        number of tries (15).

    Not compiled with XLA (:attr:`xla_unsupported`): ``make_meta_step`` refuses
    ``jit_compile=True`` for it, naming the reason. Not on several replicas
    (:attr:`replicas_unsupported`): refused by ``make_meta_step`` the same way.
    """

    replicas_unsupported = ("its line search is a tf.while_loop whose body all-reduces "
                            "the surrogate and the KL over the replicas, a synchronisation "
                            "TensorFlow does not allow inside control flow in a replica "
                            "context (seen on two replicas, tests/rl/trpo_test.py)")

    xla_unsupported = ("XLA cannot compile the KL's Hessian-vector products, a double "
                       "backward pass through the formulation's loops (a shape computed "
                       "at run time; tests/rl/trpo_test.py)")

    def __init__(self, max_kl: float = 0.01, cg_iters: int = 10, cg_damping: float = 1e-5,
                 residual_tol: float = 1e-10, backtrack_ratio: float = 0.8,
                 max_backtracks: int = 15):
        super().__init__()
        self.max_kl = check_range("TRPO", "max_kl", max_kl, POSITIVE)
        self.cg_iters = check_range("TRPO", "cg_iters", cg_iters, COUNT)
        self.max_backtracks = check_range("TRPO", "max_backtracks", max_backtracks, COUNT)
        self.cg_damping = check_range("TRPO", "cg_damping", cg_damping, NON_NEGATIVE)
        self.residual_tol = check_range("TRPO", "residual_tol", residual_tol, NON_NEGATIVE)
        self.backtrack_ratio = check_range("TRPO", "backtrack_ratio", backtrack_ratio,
                                           Range(0, 1, low_open=True, high_open=True))
        # applies theta - theta_new as it is (a plain subtraction, replica-aware)
        self.optimizer = keras.optimizers.SGD(learning_rate=1.0)

    @staticmethod
    def check(learner: Learner) -> None:
        """Raises ``TypeError`` for a learner TRPO cannot run: one that is not a
        :class:`~metalearn.rl.PolicyLearner` (whose trajectories it collects and
        compares) or whose ``distribution`` has no ``kl``."""
        if not isinstance(learner, PolicyLearner):
            raise TypeError(
                f"TRPO needs a learner whose trajectories can be collected and compared: "
                f"TRPO and the clipped ratio run on a metalearn.rl.PolicyLearner "
                f"(collect, outputs_of); got {type(learner).__name__}")
        if not callable(getattr(learner.distribution, "kl", None)):
            raise TypeError(f"TRPO needs a policy distribution with kl; "
                            f"{type(learner.distribution).__name__} has none")

    def build(self, learner: Learner) -> None:
        self.check(learner)
        if not self.optimizer.built:
            self.optimizer.build(learner.meta_variables)

    def directions(self, learner, episodes, formulation: Formulation
                   ) -> Tuple[Directions, Metrics]:
        """``theta - theta_new`` by meta-variable (the module's docstring) and the
        per-task figures before the step."""
        self.check(learner)
        region = TrustRegion(learner, episodes, formulation)
        g, metrics, surrogate_before = region.gradient()
        # one graph for the damped Fisher product, called by conjugate gradient's loop
        # and for the step's scale (traced inline twice, it doubled the step's tracing)
        product = tf.function(lambda v: region.fisher_product(v, self.cg_damping),
                              autograph=False)
        x = conjugate_gradient(product, g, self.cg_iters, self.residual_tol)
        scale = tf.sqrt(2.0 * self.max_kl / (_dot(x, product(x)) + 1e-8))
        step = [scale * t for t in x]
        fraction, _, kl, accepted = backtracking_line_search(
            lambda f: region.evaluate([w + tf.cast(f, w.dtype) * s
                                       for w, s in zip(region.theta, step)]),
            surrogate_before, self.max_kl, self.backtrack_ratio, self.max_backtracks)
        directions = [-tf.cast(fraction, s.dtype) * s for s in step]
        dtype, tasks = metrics["loss"].dtype, tf.shape(metrics["loss"])
        reported = {k: v for k, v in metrics.items() if k not in ("surrogate", "kl")}
        reported["kl"] = tf.fill(tasks, tf.where(accepted, tf.cast(kl, dtype),
                                                 tf.zeros([], dtype)))
        reported["accepted"] = tf.fill(tasks, tf.cast(accepted, dtype))
        return directions, reported

    def apply(self, learner: Learner, directions: Directions, metrics: Metrics) -> Metrics:
        replicas.apply_gradients(self.optimizer, directions, learner.meta_variables)
        return metrics
