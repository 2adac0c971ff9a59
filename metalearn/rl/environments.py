"""Environments written in TensorFlow, so that rollouts run inside the compiled step.

An :class:`Environment` is a task family and its dynamics at once: as a
:class:`~metalearn.tasks.TaskSampler` it samples tasks (a goal, an MDP) as a pure
function of a seed, like the supervised samplers, so its ``tf.data`` stream is seeded,
stateless and resumable; as dynamics it resets and steps a batch of rollouts of one task
(``reset``, ``observe``, ``step``), each a TensorFlow function that broadcasts over
leading axes. :func:`rollout` runs a policy in it for a horizon, in a ``tf.while_loop``.

An episode of an environment holds no examples: ``support_x`` and ``query_x`` are the
task's parameters, ``support_y`` and ``query_y`` the ``[2]`` int64 seeds of its
pre-update and post-update rollouts; the trajectories are sampled inside the step, from
the weights the learner has there (:class:`metalearn.rl.PolicyLearner`).
"""

from __future__ import annotations

import abc
import itertools
from typing import Any, Callable, Dict, NamedTuple, Optional, Tuple

import gin
import numpy as np
import tensorflow as tf

from metalearn.tasks.base import TaskSampler
from metalearn.tasks.episode import Episode
from metalearn.ranges import COUNT, NON_NEGATIVE, POSITIVE, check_range

Policy = Callable[[tf.Tensor, tf.Tensor], tf.Tensor]
"""``policy(observations [n, obs], seed [2]) -> actions [n, ...]``."""


class Trajectories(NamedTuple):
    """A batch of rollouts of one task, time on the second axis.

    Attributes:
      observations: ``[n, horizon, observation_size]``, the state each action was taken in.
      actions: ``[n, horizon, action_size]`` (continuous) or ``[n, horizon]`` int32.
      rewards: ``[n, horizon]``, zero after the end of an episode.
      mask: ``[n, horizon]``, 1 for the steps taken (up to and including the one that
        ended the episode), 0 after.
      infos: per-step figures of the simulator by name (``[n, horizon]`` each, zero
        after the end of an episode) that a Python environment records for its metrics
        (:attr:`metalearn.rl.PythonEnvironment.step_infos`, e.g. Meta-World's
        ``success``); empty for the in-graph environments.
    """

    observations: tf.Tensor
    actions: tf.Tensor
    rewards: tf.Tensor
    mask: tf.Tensor
    infos: Dict[str, tf.Tensor] = {}  # never mutated: a new dict for every value


class Environment(TaskSampler):
    """A task family whose dynamics are TensorFlow functions.

    Subclasses set :attr:`observation_size`, :attr:`action_kind` (``"continuous"`` or
    ``"discrete"``), :attr:`action_size` (dimensions, or number of actions),
    :attr:`horizon` and :attr:`dtype`, and implement :meth:`tasks`, :meth:`reset`,
    :meth:`observe` and :meth:`step`.
    """

    observation_size: int
    action_kind: str
    action_size: int
    horizon: int
    dtype: tf.DType

    def task_metrics(self) -> Dict[str, Callable[[Any, Any], tf.Tensor]]:
        """Metrics of a task's query trajectories beside ``return``, by name, each
        ``fn(batch, outputs)`` as :func:`metalearn.rl.mean_return` (the
        :class:`metalearn.rl.PolicyLearner` reports them in training and evaluation);
        none by default (Meta-World's ``success``: :func:`metalearn.rl.success_rate`)."""
        return {}

    @abc.abstractmethod
    def tasks(self, seed: tf.Tensor, num_tasks: int) -> Any:
        """The parameters of ``num_tasks`` tasks (a nest of ``[tasks, ...]`` tensors)."""

    def split_tasks(self, seed: tf.Tensor, num_tasks: int, split: str) -> Any:
        """The tasks of :meth:`sample` for ``split``: :meth:`tasks` (every split draws
        from one family, the seeds keeping them apart) unless a family's splits hold
        different tasks (Meta-World's train and test goals: :class:`metalearn.rl.
        MetaWorld`)."""
        del split
        return self.tasks(seed, num_tasks)

    @abc.abstractmethod
    def reset(self, task: Any, num: int, seed: tf.Tensor) -> Any:
        """The start state (a nest of ``[num, ...]`` tensors) of ``num`` rollouts of one task."""

    @abc.abstractmethod
    def observe(self, task: Any, state: Any) -> tf.Tensor:
        """``[num, observation_size]`` observations of the states."""

    @abc.abstractmethod
    def step(self, task: Any, state: Any, action: tf.Tensor,
             seed: tf.Tensor) -> Tuple[Any, tf.Tensor, tf.Tensor]:
        """``(next state, reward [num], done [num] bool)`` after ``action``."""

    def sample(self, seed: tf.Tensor, num_tasks: int, split: str = "train") -> Episode:
        """Tasks and their rollout seeds: ``Episode(task, support seed, task, query seed)``
        (the seeds ``[tasks, 2]`` int64)."""
        seeds = tf.random.experimental.stateless_split(seed, 3)
        task = self.split_tasks(seeds[0], int(num_tasks), split)
        rollout_seeds = lambda s: tf.random.stateless_uniform(
            [int(num_tasks), 2], s, minval=None, maxval=None, dtype=tf.int64)
        return Episode(task, rollout_seeds(seeds[1]), task, rollout_seeds(seeds[2]))


def rollout(environment: Environment, task: Any, policy: Policy, num: int,
            seed: tf.Tensor, horizon: Optional[int] = None) -> Trajectories:
    """``num`` rollouts of ``policy`` in one task for ``horizon`` steps (the
    environment's by default), in one ``tf.while_loop``. A pure function of ``seed``;
    nothing differentiable leaves it (every output is stop-gradiented: the score-function
    estimators of :mod:`metalearn.rl.estimators` carry the dependence on the policy).

    Raises:
      HyperparameterRangeError: ``num`` or ``horizon`` not a whole number >= 1.
    """
    num = check_range("rollout", "num", num, COUNT)
    horizon = check_range("rollout", "horizon",
                          environment.horizon if horizon is None else horizon, COUNT)
    seed = tf.cast(seed, tf.int64)
    keys = tf.random.experimental.stateless_split(seed, 2 * horizon + 1)
    state = environment.reset(task, int(num), keys[0])
    dtype = environment.dtype
    arrays = [tf.TensorArray(d, size=horizon, element_shape=None)
              for d in (dtype, tf.int32 if environment.action_kind == "discrete" else dtype,
                        dtype, dtype)]

    def body(t, state, alive, arrays):
        observation = environment.observe(task, state)
        action = policy(observation, keys[1 + 2 * t])
        next_state, reward, done = environment.step(task, state, action, keys[2 + 2 * t])
        values = (observation, action, reward * alive, alive)
        arrays = [a.write(t, v) for a, v in zip(arrays, values)]
        alive = alive * (1 - tf.cast(done, dtype))
        return t + 1, next_state, alive, arrays

    _, _, _, arrays = tf.while_loop(
        lambda t, *_: t < horizon, body,
        (tf.constant(0), state, tf.ones([int(num)], dtype), arrays))
    time_second = lambda a: tf.stop_gradient(tf.experimental.numpy.moveaxis(
        a.stack(), 0, 1))
    return Trajectories(*[time_second(a) for a in arrays])


def check_goal_range(goal_range: Tuple[float, float], horizon: int,
                     owner: str = "Environment") -> Tuple[float, float]:
    """``(low, high)`` of a goal range as floats; ``ValueError`` for ``low > high``, a
    :class:`~metalearn.ranges.HyperparameterRangeError` naming ``owner`` for a
    ``horizon`` that is not a whole number >= 1 (what every goal-per-task environment
    checks)."""
    low, high = (float(v) for v in goal_range)
    if not low <= high:
        raise ValueError(f"{owner}.goal_range must be (low, high) with low <= high, got "
                         f"{goal_range!r}")
    check_range(owner, "horizon", horizon, COUNT)
    return low, high


# --- 2D point navigation ------------------------------------------------------------

@gin.configurable
class PointNavigation(Environment):
    """2D point navigation, as in the MAML paper (Finn et al. 2017, section 5.3; the MAML
    code's ``PointEnvRandGoal`` under rllab's ``normalize``): the agent starts at the
    origin and moves by its action, clipped to ``[-1, 1]`` and scaled by ``max_step``
    (0.1); the reward is minus the distance to the task's goal after the move; an episode
    ends after ``horizon`` steps, or early when both coordinates are within ``tolerance``
    of the goal. Goals are uniform in ``goal_range`` squared. Observations: the position
    (and the goal, with ``observe_goal``: the goal-aware oracle's environment).

    Args:
      goal_range: ``(low, high)`` of each goal coordinate.
      horizon: steps per episode (100 in the paper).
      max_step: the largest move per coordinate and step.
      tolerance: the early-stop distance per coordinate (0 never stops early).
      observe_goal: observations ``[position, goal]`` (4 values) instead of the position.
      dtype: the dtype of positions, rewards and observations.
    """

    action_kind = "continuous"
    action_size = 2

    def __init__(self, goal_range: Tuple[float, float] = (-0.5, 0.5), horizon: int = 100,
                 max_step: float = 0.1, tolerance: float = 0.01, observe_goal: bool = False,
                 dtype: str = "float32"):
        low, high = check_goal_range(goal_range, horizon, type(self).__name__)
        self.goal_range = (low, high)
        self.horizon = check_range("PointNavigation", "horizon", horizon, COUNT)
        self.max_step = check_range("PointNavigation", "max_step", max_step, POSITIVE)
        self.tolerance = check_range("PointNavigation", "tolerance", tolerance,
                                     NON_NEGATIVE)
        self.observe_goal = bool(observe_goal)
        self.observation_size = 4 if self.observe_goal else 2
        self.dtype = tf.as_dtype(dtype)

    def tasks(self, seed, num_tasks):
        return tf.random.stateless_uniform([num_tasks, 2], seed, *self.goal_range,
                                           dtype=self.dtype)

    def reset(self, task, num, seed):
        return tf.zeros([num, 2], self.dtype)

    def observe(self, task, state):
        if not self.observe_goal:
            return state
        return tf.concat([state, tf.broadcast_to(task, tf.shape(state))], -1)

    def step(self, task, state, action, seed):
        move = tf.clip_by_value(tf.cast(action, self.dtype), -1.0, 1.0) * self.max_step
        position = state + move
        offset = position - task
        reward = -tf.norm(offset, axis=-1)
        done = tf.reduce_all(tf.abs(offset) < self.tolerance, axis=-1)
        return position, reward, done


# --- tabular MDPs and bandits ------------------------------------------------------

class MDP(NamedTuple):
    """One tabular task: ``transitions [states, actions, states]`` (rows sum to 1) and
    ``rewards [states, actions]``; every episode starts in state 0."""

    transitions: tf.Tensor
    rewards: tf.Tensor


@gin.configurable
class TabularMDP(Environment):
    """Random tabular MDPs (as in Duan et al. 2016's RL² experiments): each task's
    transition rows drawn from a flat Dirichlet, its mean rewards from N(1, 1); episodes
    of ``horizon`` steps from state 0, observations the one-hot state. With
    ``states=1`` and ``horizon=1`` it is a multi-armed bandit.

    Small enough to be exact: :meth:`enumerate` lists every trajectory with its
    probability under the dynamics, and :meth:`expected_return` computes a policy's
    expected return by dynamic programming, both differentiable in the policy.

    Args:
      states, actions, horizon: sizes.
      dtype: float dtype of observations, rewards and probabilities.
    """

    action_kind = "discrete"

    def __init__(self, states: int = 2, actions: int = 2, horizon: int = 3,
                 dtype: str = "float32"):
        self.states, self.action_size, self.horizon = (
            check_range("TabularMDP", name, value, COUNT) for name, value in
            (("states", states), ("actions", actions), ("horizon", horizon)))
        self.observation_size = self.states
        self.dtype = tf.as_dtype(dtype)

    def tasks(self, seed, num_tasks):
        keys = tf.random.experimental.stateless_split(seed, 2)
        shape = [num_tasks, self.states, self.action_size]
        gamma = tf.random.stateless_gamma(shape + [self.states], keys[0], alpha=1.0,
                                          dtype=self.dtype)
        transitions = gamma / tf.reduce_sum(gamma, -1, keepdims=True)
        rewards = 1.0 + tf.random.stateless_normal(shape, keys[1], dtype=self.dtype)
        return MDP(transitions, rewards)

    def reset(self, task, num, seed):
        return tf.zeros([num], tf.int32)

    def observe(self, task, state):
        return tf.one_hot(state, self.states, dtype=self.dtype)

    def step(self, task, state, action, seed):
        action = tf.cast(action, tf.int32)
        reward = tf.gather_nd(task.rewards, tf.stack([state, action], -1))
        probs = tf.gather_nd(task.transitions, tf.stack([state, action], -1))
        next_state = tf.random.stateless_categorical(tf.math.log(probs), 1, seed,
                                                     dtype=tf.int32)[:, 0]
        return next_state, reward, tf.zeros_like(state, tf.bool)

    def enumerate(self, task: MDP) -> Tuple[Trajectories, tf.Tensor]:
        """Every trajectory of one task, and its probability under the dynamics alone
        (``[count]``; times the policy's probabilities of its actions, the trajectory's
        probability): ``actions ** horizon * states ** (horizon - 1)`` of them (the last
        next state changes no reward)."""
        A, S, H = self.action_size, self.states, self.horizon
        rows = list(itertools.product(*([range(A)] + [range(S), range(A)] * (H - 1))))
        table = np.array(rows, np.int32).reshape(len(rows), -1)
        actions = tf.constant(table[:, 0::2])                       # [count, H]
        states = tf.constant(np.concatenate(
            [np.zeros((len(rows), 1), np.int32), table[:, 1::2]], 1))  # [count, H]
        pairs = tf.stack([states, actions], -1)
        rewards = tf.gather_nd(task.rewards, pairs)
        moves = tf.gather_nd(task.transitions, pairs[:, :-1])        # [count, H-1, S]
        step_probs = tf.gather(moves, states[:, 1:], batch_dims=2)   # [count, H-1]
        probability = tf.reduce_prod(step_probs, -1)
        trajectories = Trajectories(tf.one_hot(states, S, dtype=self.dtype), actions,
                                    rewards, tf.ones_like(rewards))
        return trajectories, probability

    def expected_return(self, task: MDP, policy: tf.Tensor) -> tf.Tensor:
        """The exact expected (undiscounted) return of a stationary policy ``policy
        [states, actions]`` (rows: action probabilities), by dynamic programming over
        the state distribution; differentiable in ``policy`` to every order."""
        occupancy = tf.one_hot(0, self.states, dtype=self.dtype)
        total = tf.zeros([], self.dtype)
        for _ in range(self.horizon):
            joint = occupancy[:, None] * policy                      # [S, A]
            total += tf.reduce_sum(joint * task.rewards)
            occupancy = tf.einsum("sa,sat->t", joint, task.transitions)
        return total
