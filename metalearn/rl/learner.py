"""Meta-reinforcement learning through the one :class:`~metalearn.Learner`.

The data flow of MAML-RL (Finn et al. 2017) inside one compiled meta-step: before each
inner step, trajectories of the policy with that step's weights (the :class:`Rollouts`
step wrapper, a :class:`~metalearn.adapters.SupportFromWeights`); the inner steps of any
adapter on the DiCE surrogate of those trajectories; after adaptation, trajectories of
the adapted policy (:meth:`PolicyLearner.query_data`) whose surrogate is the task's
query loss; the meta-gradient through all of it by the ordinary meta-step. Sampling is
by the score function: actions and observations are stop-gradiented, the magic box of
:mod:`metalearn.rl.estimators` carries the dependence on the weights to every order.
"""

from __future__ import annotations

import abc
from typing import Any, Callable, Dict, NamedTuple, Optional, Tuple, Union

import gin
import keras
import numpy as np
import tensorflow as tf

from metalearn import configurables
from metalearn.adapters.base import Adapter
from metalearn.adapters.gradient_descent import GradientDescent
from metalearn.adapters.wrappers import StepWrapper, SupportFromWeights
from metalearn.functional import Weights
from metalearn.learners.learner import Learner, adapt_trajectory
from metalearn.learners.task import Adapted, TaskRun
from metalearn.rl.environments import Environment, Trajectories, rollout
from metalearn.rl.estimators import Batch, DiCE
from metalearn.rl.policies import Categorical, Gaussian
from metalearn.tasks.episode import Episode


class Collected(NamedTuple):
    """Trajectories collected ahead of the step, replayed instead of sampled: an
    episode's ``support_y`` (a leading axis of inner steps: ``[steps, n, T, ...]``, the
    trajectories each inner step sees) or ``query_y`` (``[n, T, ...]``). What a Python
    environment's collector gives the step (sampled outside it), and what an outer rule
    that evaluates the meta-objective at several meta-variable values on the same data
    (:class:`metalearn.rl.TRPO`) holds fixed (:meth:`PolicyLearner.collect`).

    Attributes:
      trajectories: :class:`~metalearn.rl.environments.Trajectories`.
      weights: ``[..., n]`` each trajectory's weight in the batch (``1 / n`` for sampled
        ones; for an exact enumeration its probability under the policy that collected
        it, held fixed).
      log_probs: ``[..., n, T]`` the log-probabilities of the actions under the policy
        that collected them (zero after an episode's end): the surrogates weight by the
        likelihood ratio to it (:class:`~metalearn.rl.estimators.Batch`).
    """

    trajectories: Trajectories
    weights: tf.Tensor
    log_probs: tf.Tensor


class TrialPolicy(abc.ABC):
    """A policy with a state carried across the episodes of a trial, as
    :meth:`metalearn.rl.GymCollector.collect_trials` runs it (RL²'s recurrent policy:
    :class:`metalearn.rl.recurrent.RecurrentSampler`)."""

    @abc.abstractmethod
    def start(self, n: int) -> None:
        """A new trial of ``n`` copies: the state back to its start."""

    @abc.abstractmethod
    def __call__(self, observations: np.ndarray, seed: np.ndarray, done: np.ndarray
                 ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One step: ``(actions [n, ...], log-probabilities [n], inputs [n, ...])`` for
        ``observations [n, obs]``, the step's ``seed [2]`` and ``done [n]`` (1 where
        the previous step ended an episode of the trial); ``inputs`` are what the
        policy read (recorded as the trajectories' observations)."""

    @abc.abstractmethod
    def after(self, actions: np.ndarray, rewards: np.ndarray) -> None:
        """The step's sampled ``actions`` and ``rewards [n]`` (zero after an episode's
        end), for the next step."""


class PolicySampler:
    """A learner's policy with given weights as a NumPy function for a collector:
    ``(observations [n, obs], seed [2]) -> (actions [n, ...], log-probabilities [n])``,
    one compiled function for every weight value."""

    def __init__(self, learner: Learner):
        self.learner = learner
        self._fn = tf.function(self._sample)

    def _sample(self, weights, observations, seed):
        outputs = self.learner.predict(weights, observations)
        distribution = self.learner.distribution
        actions = distribution.sample(outputs, seed)
        return actions, distribution.log_prob(outputs, actions)

    def __call__(self, weights: Dict[str, tf.Tensor]) -> Callable:
        """The policy with ``weights``."""
        def policy(observations, seed):
            actions, log_probs = self._fn(weights, tf.constant(observations), seed)
            return actions.numpy(), log_probs.numpy()
        return policy

    def collect(self, collector: Any, weights: Dict[str, tf.Tensor], task: Any,
                seed: Any) -> Collected:
        """``collector``'s trajectories of the policy with ``weights`` in ``task``
        (:meth:`metalearn.rl.GymCollector.collect`): what
        :class:`metalearn.rl.GymCollection` asks of its sampler
        for every batch of trajectories."""
        return collector.collect(self(weights), task, seed)


@gin.configurable
class Rollouts(SupportFromWeights):
    """The support set of every inner step: fresh trajectories of the policy with the
    weights that step starts from (seeded by the episode's support seed and the step).
    Put it in the adapter of a :class:`PolicyLearner`, which binds it to its
    environment and policy::

        GradientDescent(1, 0.1, wrappers=[Rollouts()])
    """

    def __init__(self, name: Optional[str] = None):
        StepWrapper.__init__(self, name=name)
        self.fn = None
        self.bound_to = None  # the id of the learner

    def bind_to(self, learner: "PolicyLearner") -> None:
        """Samples the support trajectories with ``learner`` (one learner per wrapper)."""
        if self.fn is not None and self.bound_to != id(learner):
            raise ValueError("this Rollouts wrapper is already bound to another "
                             "PolicyLearner: give every learner its own adapter")
        self.fn = learner.support_data
        self.bound_to = id(learner)

    def wrap(self, step_fn):
        if self.fn is None:
            raise ValueError("Rollouts() samples with a metalearn.rl.PolicyLearner's policy"
                             ": use it in the adapter of a PolicyLearner")
        return super().wrap(step_fn)


def mean_return(batch: Batch, outputs: Any) -> tf.Tensor:
    """The batch's weighted mean (undiscounted) return: the learner's ``return`` metric."""
    return tf.reduce_sum(batch.weights * tf.reduce_sum(batch.rewards * batch.mask, -1))


def success_rate(batch: Batch, outputs: Any) -> tf.Tensor:
    """The batch's weighted fraction of trajectories that succeeded: whose simulator
    reported ``info["success"]`` at any step of the episode (recorded as
    ``batch.infos["success"]``, :attr:`metalearn.rl.PythonEnvironment.step_infos`);
    Meta-World's ``success`` metric."""
    if "success" not in batch.infos:
        raise ValueError(f"success_rate needs the trajectories' per-step 'success' (a "
                         f"Python environment with 'success' in its step_infos), got "
                         f"infos {sorted(batch.infos)}")
    success = tf.cast(batch.infos["success"], batch.mask.dtype) * batch.mask
    reached = tf.cast(tf.reduce_max(success, -1) > 0, batch.weights.dtype)
    return tf.reduce_sum(batch.weights * reached)


@gin.configurable
@configurables.moved_members({"query_outputs": "run_task(episode) (run.query_y: the query "
                                               "trajectories' Batch; run.metrics) and "
                                               "outputs_of(run)"})
class PolicyLearner(Learner):
    """A policy (any Keras model mapping observations to a distribution's parameters),
    an inner loop and a policy-gradient estimator, on an in-graph :class:`Environment`.

    Episodes come from the environment (as a task sampler): ``support_x``/``query_x``
    hold a task, ``support_y``/``query_y`` the seeds of its pre- and post-update
    rollouts. What the adapter and the query see are trajectories sampled inside the
    step: ``x`` the observations ``[rollouts * horizon, observation_size]``, ``y`` a
    :class:`~metalearn.rl.estimators.Batch`. The query ``loss`` is minus the
    estimator's objective (in value, minus the mean return, over the horizon with
    ``DiCE.mean_over_steps``); ``return`` is the mean return of the (post-update) query
    trajectories; the environment's own :meth:`~metalearn.rl.Environment.task_metrics`
    (Meta-World's ``success``) join it. Evaluated with ``steps=k``, ``return`` is the
    return after ``k`` adaptation steps (0: the meta-learned policy itself).

    Args:
      model: a built Keras model from ``[batch, observation_size]`` observations to the
        distribution's parameters (:func:`~metalearn.rl.policies.gaussian_policy` for a
        Gaussian around a mean network).
      environment: the :class:`Environment` whose tasks the episodes hold.
      adapter: the inner loop; it must hold a :class:`Rollouts` wrapper (default:
        ``GradientDescent(1, 0.1, wrappers=[Rollouts()])``).
      distribution: :class:`~metalearn.rl.policies.Gaussian` or ``Categorical``; by
        default the one of the environment's action kind.
      rollouts: trajectories per task and inner step (the paper's 20), or ``"exact"``:
        every trajectory of an environment that can enumerate them (``TabularMDP``),
        weighted by its probability under the current policy (then every figure is
        the exact expectation, and the estimator's derivatives are exact).
      estimator: the surrogate loss (:class:`~metalearn.rl.estimators.DiCE`, default;
        :class:`~metalearn.rl.estimators.LVC`, ProMP's, for the inner steps and the
        query alike).
      query_training: as :class:`~metalearn.Learner`'s.
    """

    def __init__(self, model: keras.Model, environment: Environment,
                 adapter: Optional[Adapter] = None, distribution: Any = None,
                 rollouts: Union[int, str] = 20, estimator: Optional[DiCE] = None,
                 query_training: bool = True, name: Optional[str] = None):
        if not isinstance(environment, Environment):
            raise TypeError(f"environment must be a metalearn.rl.Environment, got "
                            f"{environment!r}")
        if rollouts == "exact":
            if not callable(getattr(environment, "enumerate", None)):
                raise ValueError(f"rollouts='exact' needs an environment that enumerates "
                                 f"its trajectories (TabularMDP), got "
                                 f"{type(environment).__name__}")
        elif isinstance(rollouts, bool) or not isinstance(rollouts, int) or rollouts < 1:
            raise ValueError(f"rollouts must be a number of trajectories >= 1 or 'exact', "
                             f"got {rollouts!r}")
        if distribution is None:
            distribution = Gaussian() if environment.action_kind == "continuous" \
                else Categorical()
        if distribution.kind != environment.action_kind:
            raise ValueError(f"a {type(distribution).__name__} policy samples "
                             f"{distribution.kind} actions, but {type(environment).__name__}"
                             f" takes {environment.action_kind} ones")
        if adapter is None:
            adapter = GradientDescent(1, 0.1, wrappers=[Rollouts()])
        estimator = DiCE() if estimator is None else estimator
        extra = dict(environment.task_metrics())
        clash = sorted(set(extra) & {"return", "loss"})
        if clash:
            raise ValueError(f"{type(environment).__name__}.task_metrics names {clash}, "
                             f"which the learner reports itself: give them other names")
        super().__init__(model, adapter, loss=estimator,
                         metrics={"return": mean_return, **extra},
                         query_training=query_training, name=name)
        self.environment = environment
        self.distribution = distribution
        self.estimator = estimator
        self.rollouts = rollouts
        self._check_policy(model)
        wrappers = [m for m in [self.adapter, *self.adapter.submodules]
                    if isinstance(m, Rollouts)]
        if not wrappers and self.inner_steps_sample:
            raise ValueError(
                f"PolicyLearner's adapter {type(self.adapter).__name__} holds no Rollouts "
                "wrapper, so its inner steps would see no trajectories: use e.g. "
                "GradientDescent(1, 0.1, wrappers=[Rollouts()]) (gin: "
                "GradientDescent.wrappers = [@Rollouts()])")
        for wrapper in wrappers:
            wrapper.bind_to(self)

    inner_steps_sample: bool = True
    """Whether the adapter's inner steps see trajectories (it must hold a
    :class:`Rollouts` wrapper); a learner whose adaptation is not a gradient step
    (:class:`metalearn.rl.RecurrentPolicyLearner`, RL²) says ``False``."""

    def policy_sampler(self) -> Any:
        """How this learner's policy collects trajectories outside the step, on a
        Python environment (:class:`metalearn.rl.GymCollection` asks it): a
        :class:`metalearn.rl.PolicySampler`, one episode per trajectory."""
        return PolicySampler(self)

    def _check_policy(self, model: keras.Model) -> None:
        env = self.environment
        need = self.distribution.output_size(env.action_size)
        try:
            dtype = model.inputs[0].dtype
        except (AttributeError, IndexError, TypeError, ValueError):  # a subclassed model
            dtype = model.compute_dtype
        try:
            outputs = model(tf.zeros([1, env.observation_size], dtype))
        except (ValueError, TypeError, tf.errors.InvalidArgumentError) as error:
            raise ValueError(f"the policy model {model.name!r} does not take "
                             f"{type(env).__name__}'s observations of size "
                             f"{env.observation_size}: {error}") from error
        shape = list(outputs.shape)
        if shape[-1] != need:
            raise ValueError(
                f"the policy model {model.name!r} outputs {shape[-1]} values (shape "
                f"{shape}), but a {type(self.distribution).__name__} policy over "
                f"{type(env).__name__}'s {env.action_size} {env.action_kind} actions needs "
                f"{need}" + (" (a mean and a log std per dimension: "
                             "metalearn.rl.gaussian_policy(model) adds the log std)"
                             if isinstance(self.distribution, Gaussian) else ""))

    # --- trajectories from given weights -------------------------------------------

    def trajectories(self, weights: Weights, task: Any,
                     seed: tf.Tensor) -> Tuple[Trajectories, Optional[tf.Tensor]]:
        """Trajectories of the policy with ``weights`` (stopped) in ``task`` and their
        weights in the batch (``None``: sampled, ``1 / n`` each; for ``"exact"`` every
        trajectory with its probability)."""
        stopped = tf.nest.map_structure(tf.stop_gradient, weights)
        if self.rollouts == "exact":
            trajectories, dynamics = self.environment.enumerate(task)
            log_probs = self.policy_log_probs(stopped, trajectories.observations,
                                              trajectories.actions, trajectories.mask)
            return trajectories, dynamics * tf.exp(tf.reduce_sum(log_probs, -1))
        policy = lambda observations, seed: self.distribution.sample(
            self.predict(stopped, observations), seed)
        return rollout(self.environment, task, policy, self.rollouts, seed), None

    def policy_log_probs(self, weights: Weights, observations: tf.Tensor, actions: tf.Tensor,
                         mask: tf.Tensor) -> tf.Tensor:
        """``[n, T]`` log-probabilities of the actions, zero where ``mask`` is."""
        outputs = self.predict(weights, self.policy_inputs(observations))
        outputs = tf.reshape(outputs, tf.concat([tf.shape(mask), [-1]], 0))
        return self.distribution.log_prob(outputs, actions) * tf.cast(mask, outputs.dtype)

    def policy_inputs(self, observations: tf.Tensor) -> tf.Tensor:
        """What :meth:`predict` takes for ``[n, T, ...]`` observations: here the flat
        ``[n * T, observation_size]`` (a policy of the current observation alone; a
        recurrent policy takes the sequences)."""
        return tf.reshape(observations, [-1, self.environment.observation_size])

    def rollout_data(self, weights: Weights, task: Any, seed: Any) -> Tuple[tf.Tensor, Batch]:
        """``(x, y)`` of trajectories sampled with ``weights``: the flat observations and
        the estimator's :class:`~metalearn.rl.estimators.Batch` (``seed`` a
        :class:`Collected`: those trajectories, replayed)."""
        behaviour = None
        if isinstance(seed, Collected):
            trajectories, probabilities, behaviour = seed
        else:
            trajectories, probabilities = self.trajectories(weights, task, seed)
        cast = lambda t: tf.cast(t, self._metric_dtype) if t.dtype.is_floating else t
        trajectories = Trajectories(*[cast(t) for t in trajectories[:4]],
                                    {k: cast(v) for k, v in trajectories.infos.items()})
        if probabilities is not None:
            probabilities = cast(probabilities)
        batch = self.estimator.targets(trajectories, probabilities,
                                       None if behaviour is None else cast(behaviour))
        return self.policy_inputs(trajectories.observations), batch

    def support_data(self, weights: Weights, x: Any, y: Any, step: Any) -> Tuple[tf.Tensor, Batch]:
        """What :class:`Rollouts` gives inner step ``step``: trajectories with its
        weights, seeded by the support seed ``y`` folded with the step (``y`` a
        :class:`Collected`: its trajectories of that step)."""
        if isinstance(y, Collected):
            available = y.weights.shape[0]
            if isinstance(step, int) and available is not None and step >= available:
                raise ValueError(f"inner step {step} needs collected trajectories, but the "
                                 f"episode holds them for {available} inner steps")
            return self.rollout_data(weights, x, tf.nest.map_structure(
                lambda t: tf.gather(t, tf.cast(step, tf.int32)), y))
        seed = tf.random.experimental.stateless_fold_in(tf.cast(y, tf.int64),
                                                        tf.cast(step, tf.int64))
        return self.rollout_data(weights, x, seed)

    def query_data(self, adapted: Adapted, query_x: Any, query_y: Any) -> Tuple[Any, Any]:
        """Trajectories of the adapted policy, seeded by the query seed."""
        return self.rollout_data(Adapted.of(adapted, "query_data").weights, query_x, query_y)

    def task_loss(self, y_true: Batch, y_pred: tf.Tensor) -> tf.Tensor:
        """Minus the estimator's objective of the trajectories ``y_true`` under the
        policy's outputs ``y_pred`` on their observations."""
        outputs = tf.reshape(y_pred, tf.concat([tf.shape(y_true.mask), [-1]], 0))
        log_probs = self.distribution.log_prob(outputs, y_true.actions)
        return tf.cast(self.loss(log_probs, y_true), self._metric_dtype)

    # --- collected trajectories (fixed data) -----------------------------------------

    def collect(self, episode: Episode, steps: Optional[int] = None,
                weights: Optional[Weights] = None) -> Episode:
        """One episode (no task axis) with the trajectories its meta-step would sample
        at ``weights`` (default: the current ones) collected: ``support_y`` and
        ``query_y`` become :class:`Collected` (every inner step's support trajectories,
        sampled with that step's weights and seed; the adapted policy's query ones).
        On the collected episode at the same weights the learner's figures and
        meta-gradient, to every order, are those of the original episode; at other
        weights the data stay the ones collected, weighted by the likelihood ratio to
        the collecting policy (importance sampling: what TRPO's line search
        evaluates)."""
        support_x, support_y, query_x, query_y = self.split(episode)
        if isinstance(support_y, Collected):
            return episode
        path = adapt_trajectory(self, support_x, support_y, steps, weights)
        path = [tf.nest.map_structure(tf.stop_gradient, w) for w in path]

        def gathered(w, task, seed):
            trajectories, probabilities = self.trajectories(w, task, seed)
            if probabilities is None:
                n = tf.shape(trajectories.rewards)[0]
                probabilities = tf.ones([n], trajectories.rewards.dtype) / tf.cast(
                    n, trajectories.rewards.dtype)
            log_probs = self.policy_log_probs(w, trajectories.observations,
                                              trajectories.actions, trajectories.mask)
            return Collected(trajectories, tf.stop_gradient(probabilities),
                             tf.stop_gradient(log_probs))

        support = [gathered(w, support_x, tf.random.experimental.stateless_fold_in(
            tf.cast(support_y, tf.int64), tf.constant(k, tf.int64)))
            for k, w in enumerate(path[:-1])]
        query = gathered(path[-1], query_x, query_y)
        if support:
            support = tf.nest.map_structure(lambda *t: tf.stack(t), *support)
        else:  # no inner step: an empty step axis of the query's shapes
            support = tf.nest.map_structure(lambda t: tf.zeros([0, *t.shape], t.dtype),
                                            query)
        return Episode(support_x, support, query_x, query)

    def outputs_of(self, run: TaskRun) -> tf.Tensor:
        """A run's adapted-policy outputs ``[n, T, k]`` on its query trajectories
        (``run.query_y``, a :class:`~metalearn.rl.estimators.Batch`, holds them): what a
        trust-region rule compares between meta-variable values."""
        return tf.reshape(run.predictions, tf.concat([tf.shape(run.query_y.mask), [-1]], 0))
