"""RL² (Duan et al. 2016; Wang et al. 2016): meta-RL's model-based family, with no
gradient inner loop. A recurrent policy reads the task's past transitions and its
hidden state is the adaptation.

A *trial* is ``episodes`` episodes of one task run back to back. At each step the
policy takes ``[observation, previous action, previous reward, done]`` (the previous
action one-hot for discrete actions; all zeros at the trial's first step; ``done`` is 1
at the first step of every episode after the first, where the previous step ended an
episode), and its hidden state carries over the episode boundaries of the trial. It
starts at zero for every trial, so nothing carries from one task to the next. The
policy is any Keras model ``[inputs [n, in], hidden [n, units]] -> [outputs, hidden']``
(:func:`recurrent_policy`: a ``keras.layers.GRUCell`` and a ``Dense`` read-out).

Through the library's pieces:

* :class:`RecurrentTrial` is the adapter. It takes no gradient step (``adapt`` returns
  the weights, as the in-context adapter does), and its :meth:`~RecurrentTrial.forward`
  unrolls the model over a trial's inputs ``[n, T, in]`` from a zero hidden state.
  Every prediction of the learner goes through it: the log-probabilities of a trial's
  actions, hence the surrogate losses and the trust-region rules' ratios.
* :class:`RecurrentPolicyLearner` is a :class:`~metalearn.rl.PolicyLearner` whose
  query data are whole trials (:meth:`~RecurrentPolicyLearner.trajectories`, sampled
  with the same step function inside the compiled step). The loss is minus the
  estimator's objective over the trial, the returns-to-go running across its episodes
  (RL²'s objective: an early episode's exploration is credited with the later
  episodes' rewards). Every outer rule that runs a ``PolicyLearner`` runs it through
  :meth:`~metalearn.Learner.run_task`: the meta-gradient (DiCE), ``TRPO`` and
  ``ClippedRatio`` (PPO, RL²'s usual outer rule), whose collected trials are replayed
  with the likelihood ratio to the collecting policy.
* On a :class:`~metalearn.rl.PythonEnvironment` (Meta-World, MuJoCo) the trials are
  collected outside the step: :meth:`RecurrentPolicyLearner.policy_sampler` gives
  :class:`metalearn.rl.GymCollection` a :class:`RecurrentSampler`, which runs the policy
  one step at a time in the collecting process (its hidden state carried across the
  episodes) through :meth:`metalearn.rl.GymCollector.collect_trials`, with the in-graph
  trial's inputs and seeds; the meta-step replays those trials with the likelihood ratio
  to the collecting policy, the same objective as in-graph.

Evaluated after ``k`` "inner steps" (``evaluate.inner_steps = (0, 1, 2)``), a task's
``return`` is that of episode ``k + 1`` of its trial: the policy with ``k`` earlier
episodes of the task in its hidden state. It sits beside a gradient learner's return
after ``k`` inner steps, but a gradient step learns from ``rollouts`` trajectories and
RL² from one episode. In training ``return`` is the trial's mean episode return, and
``first_return`` and ``last_return`` are those of its first and last episodes.

An episode that ends early (``done`` from the environment) is padded to the horizon:
its later rewards are 0, and the policy keeps acting, its hidden state fed, so every
step of the trial counts in the log-probabilities (the trial's mask is all ones) and
the estimators stay unbiased.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple, Union

import gin
import keras
import numpy as np
import tensorflow as tf

from metalearn import functional
from metalearn.adapters.base import Adapter
from metalearn.functional import Weights
from metalearn.learners.task import TaskRun
from metalearn.pieces import COUNT, CallFn, Capabilities, LossFn, check_range
from metalearn.rl.environments import Environment, Trajectories
from metalearn.rl.estimators import Batch, DiCE
from metalearn.rl.learner import Collected, PolicyLearner, TrialPolicy
from metalearn.rl.policies import LogStd


def trial_input_size(environment: Environment) -> int:
    """Values of a recurrent policy's input per step in ``environment``: the
    observation, the previous action (its dimensions, or a one-hot of the actions),
    the previous reward and the done flag."""
    return int(environment.observation_size) + int(environment.action_size) + 2


@gin.configurable
def recurrent_policy(environment: Environment, units: int = 64,
                     initial_log_std: float = 0.0, dtype: Optional[str] = None,
                     name: str = "recurrent_policy") -> keras.Model:
    """An RL² policy for ``environment``: a Keras model ``[inputs [n, in], hidden [n,
    units]] -> [outputs [n, k], hidden' [n, units]]``, a ``keras.layers.GRUCell``
    (``"gru"``) and a ``Dense`` read-out of the new hidden state (``"policy"``): the
    logits of discrete actions, or a Gaussian's mean with a learned log standard
    deviation (:class:`~metalearn.rl.LogStd`, ``initial_log_std``).

    Args:
      environment: the environment (sets ``in`` by :func:`trial_input_size` and the
        outputs by its actions).
      units: the GRU's hidden units.
      dtype: the weights' dtype; by default the environment's.
    """
    units = check_range("recurrent_policy", "units", units, COUNT)
    dtype = tf.as_dtype(dtype or environment.dtype).name
    inputs = keras.Input((trial_input_size(environment),), dtype=dtype, name="inputs")
    hidden = keras.Input((units,), dtype=dtype, name="hidden")
    output, state = keras.layers.GRUCell(units, dtype=dtype, name="gru")(inputs, hidden)
    outputs = keras.layers.Dense(int(environment.action_size), dtype=dtype,
                                 name="policy")(output)
    if environment.action_kind == "continuous":
        outputs = LogStd(initial_log_std, dtype=dtype, name="log_std")(outputs)
    return keras.Model([inputs, hidden], [outputs, state], name=name)


@gin.configurable
class RecurrentTrial(Adapter):
    """RL²'s adapter: no gradient step; a task is learnt in the hidden state of a
    recurrent policy over a trial of ``episodes`` episodes (the module's docstring).

    The learner's model is a step ``[inputs, hidden] -> [outputs, hidden']``;
    :meth:`forward` unrolls it over a trial's inputs ``[n, T, in]`` from a zero hidden
    state, and :meth:`step` is one step of it (what sampling runs). Given ``steps=k``
    (evaluation), :meth:`adapt` still returns the weights: the learner measures the
    trial's episode ``k + 1``.

    Args:
      episodes: episodes per trial (>= 1; RL²'s 2 for bandits and MDPs).
    """

    def __init__(self, episodes: int = 2, name: Optional[str] = None):
        super().__init__(name=name)
        self.episodes = check_range("RecurrentTrial", "episodes", episodes, COUNT)
        self.units: Optional[int] = None

    def own_capabilities(self) -> Capabilities:
        return Capabilities(task_axis=False)  # one task's trials at a time

    def build(self, model: keras.Model, weights: Weights) -> None:
        """Reads the hidden state's size from the model's second input.

        Raises:
          ValueError: a model without two inputs and two outputs (a step's
            ``[inputs, hidden] -> [outputs, hidden']``).
        """
        if len(model.inputs) != 2 or len(model.outputs) != 2:
            raise ValueError(
                f"RecurrentTrial unrolls a recurrent step, a model [inputs, hidden] -> "
                f"[outputs, hidden']; {model.name!r} has {len(model.inputs)} inputs and "
                f"{len(model.outputs)} outputs (metalearn.rl.recurrent_policy makes one)")
        self.units = int(model.inputs[1].shape[-1])
        super().build(model, weights)

    def check_steps(self, steps: Optional[int]) -> None:
        """Raises ``ValueError`` unless ``steps`` is ``None`` or a whole number of
        earlier episodes, ``0 .. episodes - 1``."""
        if steps is None:
            return
        if isinstance(steps, bool) or not isinstance(steps, int) or not \
                0 <= steps < self.episodes:
            raise ValueError(
                f"RecurrentTrial takes no gradient steps: steps=k measures episode k + 1 "
                f"of a trial of {self.episodes} episodes, so k must be 0 .. "
                f"{self.episodes - 1}, got steps={steps!r} (evaluate.inner_steps, or "
                "RecurrentTrial.episodes)")

    def adapt(self, weights: Weights, support_x: Any, support_y: Any, loss_fn: LossFn,
              steps: Optional[int] = None) -> Weights:
        """``weights`` unchanged: the adaptation is the hidden state (:meth:`forward`)."""
        self.check_steps(steps)
        return dict(weights)

    def adapt_trajectory(self, weights: Weights, support_x: Any, support_y: Any,
                         loss_fn: LossFn, steps: Optional[int] = None) -> List[Weights]:
        """``[weights]``: no inner step (trajectories are never collected for one)."""
        self.check_steps(steps)
        return [dict(weights)]

    def initial_hidden(self, num: Any, dtype: tf.DType) -> tf.Tensor:
        """``[num, units]`` zeros: a trial's first hidden state."""
        return tf.zeros(tf.stack([num, self.units]), dtype)

    def step(self, call: CallFn, weights: Weights, inputs: tf.Tensor, hidden: tf.Tensor
             ) -> Tuple[tf.Tensor, tf.Tensor]:
        """One step: ``(outputs [n, k], hidden' [n, units])``."""
        outputs, hidden = call(weights, [inputs, tf.cast(hidden, inputs.dtype)])
        return outputs, hidden

    def forward(self, call: CallFn, weights: Weights, x: Any,
                state: Optional[Dict[str, Any]] = None) -> Any:
        """``[n, T, k]`` outputs of the model unrolled over ``x [n, T, in]`` (a
        ``tf.scan`` over time) from a zero hidden state."""
        x = tf.convert_to_tensor(x)
        if x.shape.rank != 3:
            raise ValueError(f"RecurrentTrial unrolls trials [n, T, inputs], got inputs "
                             f"of shape {x.shape.as_list()}")
        time_first = tf.transpose(x, [1, 0, 2])

        def body(carry, inputs):
            outputs, hidden = self.step(call, weights, inputs, carry[1])
            return outputs, hidden

        first, hidden = self.step(call, weights, time_first[0],
                                  self.initial_hidden(tf.shape(x)[0], x.dtype))
        outputs, _ = tf.scan(body, time_first[1:], initializer=(first, hidden))
        outputs = tf.concat([first[None], outputs], 0)
        return tf.transpose(outputs, [1, 0, 2])


@gin.configurable
class RecurrentPolicyLearner(PolicyLearner):
    """RL²: a recurrent policy, meta-trained on whole trials of each task, with no
    gradient inner loop (the module's docstring). Runs with every outer rule a
    :class:`~metalearn.rl.PolicyLearner` runs with (``MetaGradient`` on the DiCE
    objective, ``TRPO``, ``ClippedRatio``).

    Episodes are the environment's (``query_y`` the trials' seed; ``support_*`` are not
    read). The query data are ``rollouts`` trials of ``adapter.episodes`` episodes:
    ``x`` the inputs ``[n, T, in]`` (``T = episodes * horizon``), ``y`` the estimator's
    :class:`~metalearn.rl.Batch` of the whole trial.

    Args:
      model: a recurrent step (:func:`recurrent_policy`).
      environment: an :class:`~metalearn.rl.Environment`: in-graph (trials sampled in
        the step), or a :class:`~metalearn.rl.PythonEnvironment` (trials collected by
        a :class:`~metalearn.rl.GymCollection`, :class:`RecurrentSampler`).
      adapter: a :class:`RecurrentTrial` (default: 2 episodes).
      distribution, estimator, query_training: as :class:`~metalearn.rl.PolicyLearner`'s.
      rollouts: trials per task (sampled; ``"exact"`` is not available); on a Python
        environment the collector's copies (``GymCollector.rollouts``) are the trials.
    """

    inner_steps_sample = False

    def __init__(self, model: keras.Model, environment: Environment,
                 adapter: Optional[RecurrentTrial] = None, distribution: Any = None,
                 rollouts: Union[int, str] = 20, estimator: Optional[DiCE] = None,
                 query_training: bool = True, name: Optional[str] = None):
        adapter = RecurrentTrial() if adapter is None else adapter
        if not isinstance(adapter, RecurrentTrial):
            raise TypeError(f"RecurrentPolicyLearner's adaptation is a recurrent policy's "
                            f"hidden state over a trial: its adapter must be a "
                            f"metalearn.rl.RecurrentTrial, got {type(adapter).__name__}")
        if rollouts == "exact":
            raise ValueError("RecurrentPolicyLearner samples its trials: rollouts must be "
                             "a number of trials >= 1, got 'exact'")
        super().__init__(model, environment, adapter, distribution, rollouts, estimator,
                         query_training, name)

    def _check_policy(self, model: keras.Model) -> None:
        env = self.environment
        need = self.distribution.output_size(env.action_size)
        size = trial_input_size(env)
        if len(model.inputs) != 2 or len(model.outputs) != 2:
            raise ValueError(f"RecurrentPolicyLearner needs a recurrent step [inputs, "
                             f"hidden] -> [outputs, hidden'] (metalearn.rl.recurrent_policy"
                             f"), got {model.name!r} with {len(model.inputs)} inputs and "
                             f"{len(model.outputs)} outputs")
        given = model.inputs[0].shape[-1]
        if given != size:
            raise ValueError(
                f"the recurrent policy {model.name!r} takes inputs of {given} values, but "
                f"{type(env).__name__}'s steps give {size} (observation "
                f"{env.observation_size}, previous action {env.action_size}, previous "
                "reward and done 1 each): metalearn.rl.recurrent_policy(environment)")
        got = model.outputs[0].shape[-1]
        if got != need:
            raise ValueError(
                f"the recurrent policy {model.name!r} outputs {got} values, but a "
                f"{type(self.distribution).__name__} policy over {type(env).__name__}'s "
                f"{env.action_size} {env.action_kind} actions needs {need}")

    @property
    def metric_names(self) -> List[str]:
        return [*super().metric_names, "first_return", "last_return"]

    def policy_inputs(self, observations: tf.Tensor) -> tf.Tensor:
        """The trials' inputs ``[n, T, in]`` as they are (the adapter unrolls them)."""
        return observations

    def trajectories(self, weights: Weights, task: Any, seed: tf.Tensor
                     ) -> Tuple[Trajectories, Optional[tf.Tensor]]:
        """``rollouts`` trials of the policy with ``weights`` (stopped) in ``task``:
        :class:`~metalearn.rl.Trajectories` of ``T = episodes * horizon`` steps whose
        observations are the policy's inputs ``[n, T, in]`` and whose mask is all ones
        (an episode that ends early is padded with zero rewards; the module's
        docstring). A pure function of ``seed``; ``None``: sampled, ``1 / n`` each."""
        env, adapter = self.environment, self.adapter
        stopped = tf.nest.map_structure(tf.stop_gradient, weights)
        call = self.model_call
        n, horizon, episodes = int(self.rollouts), int(env.horizon), adapter.episodes
        dtype, discrete = env.dtype, env.action_kind == "discrete"
        keys = tf.random.experimental.stateless_split(tf.cast(seed, tf.int64),
                                                      episodes * (2 * horizon + 1))
        features = self.action_features
        hidden = adapter.initial_hidden(n, self.model.inputs[1].dtype)
        previous = tf.zeros([n, env.action_size], dtype)
        reward = tf.zeros([n], dtype)
        parts = []
        for episode in range(episodes):
            offset = episode * (2 * horizon + 1)
            state = env.reset(task, n, keys[offset])
            done_flag = tf.fill([n], tf.constant(float(episode > 0), dtype))
            arrays = [tf.TensorArray(d, size=horizon) for d in
                      (dtype, tf.int32 if discrete else dtype, dtype)]

            def body(t, state, hidden, previous, reward, done_flag, alive, arrays,
                     offset=offset):
                inputs = self.step_inputs(env.observe(task, state), previous, reward,
                                          done_flag)
                outputs, hidden = adapter.step(call, stopped, inputs, hidden)
                outputs = tf.cast(outputs, dtype)
                action = self.distribution.sample(outputs, keys[offset + 1 + 2 * t])
                state, step_reward, done = env.step(task, state, action,
                                                    keys[offset + 2 + 2 * t])
                step_reward = tf.cast(step_reward, dtype) * alive
                arrays = [a.write(t, v) for a, v in zip(arrays, (inputs, action,
                                                                  step_reward))]
                alive = alive * (1 - tf.cast(done, dtype))
                return (t + 1, state, hidden, features(action), step_reward,
                        tf.zeros_like(done_flag), alive, arrays)

            _, _, hidden, previous, reward, _, _, arrays = tf.while_loop(
                lambda t, *_: t < horizon, body,
                (tf.constant(0), state, hidden, previous, reward, done_flag,
                 tf.ones([n], dtype), arrays))
            parts.append([tf.experimental.numpy.moveaxis(a.stack(), 0, 1) for a in arrays])
        inputs, actions, rewards = (tf.stop_gradient(tf.concat(p, 1)) for p in zip(*parts))
        return Trajectories(inputs, actions, rewards, tf.ones_like(rewards)), None

    def action_features(self, actions: tf.Tensor) -> tf.Tensor:
        """``[n, action_size]`` what the next step's inputs hold of ``actions``: a one-hot
        of discrete actions, continuous ones as they are (the environment's dtype)."""
        env = self.environment
        if env.action_kind == "discrete":
            return tf.one_hot(actions, env.action_size, dtype=env.dtype)
        return tf.cast(actions, env.dtype)

    def step_inputs(self, observations: tf.Tensor, previous: tf.Tensor, rewards: tf.Tensor,
                    done: tf.Tensor) -> tf.Tensor:
        """``[n, in]`` a step's inputs: ``[observations, previous action features,
        previous reward, done]`` (the environment's dtype), in-graph and collected."""
        dtype = self.environment.dtype
        return tf.concat([tf.cast(observations, dtype), tf.cast(previous, dtype),
                          tf.cast(rewards, dtype)[:, None], tf.cast(done, dtype)[:, None]],
                         -1)

    def policy_sampler(self) -> "RecurrentSampler":
        """How this learner's trials are collected on a Python environment (what
        :class:`metalearn.rl.GymCollection` asks): a :class:`RecurrentSampler`."""
        return RecurrentSampler(self)

    def model_call(self, weights: Weights, inputs: Any) -> Any:
        """The model called with ``weights`` on ``inputs`` (one step)."""
        return functional.call(self.model, weights, inputs, training=self.query_training)

    def episode_returns(self, run: TaskRun) -> tf.Tensor:
        """``[episodes]`` the weighted mean return of each episode of a run's trials."""
        batch = run.query_y
        rewards = tf.reshape(batch.rewards * batch.mask,
                             [-1, self.adapter.episodes, self.environment.horizon])
        return tf.reduce_sum(batch.weights[:, None] * tf.reduce_sum(rewards, -1), 0)

    def episode_batch(self, batch: Batch, episode: int) -> Batch:
        """The part of a trial's :class:`~metalearn.rl.Batch` that is its ``episode``
        (``horizon`` steps on the time axis, ``weights`` whole)."""
        horizon = int(self.environment.horizon)
        part = lambda t: None if t is None else t[:, episode * horizon:
                                                  (episode + 1) * horizon]
        return Batch(part(batch.actions), part(batch.rewards), part(batch.mask),
                     part(batch.advantages), batch.weights, part(batch.behaviour),
                     {k: part(v) for k, v in batch.infos.items()})

    def objective_of(self, run: TaskRun) -> Dict[str, tf.Tensor]:
        """The query figures, with ``return`` the trial's mean episode return (or,
        given ``steps=k``, episode ``k + 1``'s) and ``first_return`` and
        ``last_return`` its first and last episode's. The environment's task metrics
        (Meta-World's ``success``) are taken per episode the same way: the mean over
        the trial's episodes, or episode ``k + 1``'s."""
        returns = tf.cast(self.episode_returns(run), self._metric_dtype)
        figures = dict(run.metrics)
        figures["return"] = tf.reduce_mean(returns) if run.steps is None \
            else returns[run.steps]
        figures["first_return"], figures["last_return"] = returns[0], returns[-1]
        horizon = int(self.environment.horizon)
        task_metrics = self.environment.task_metrics()
        outputs = self.outputs_of(run) if task_metrics else None
        for name, fn in task_metrics.items():
            values = tf.stack([tf.cast(fn(self.episode_batch(run.query_y, e),
                                          outputs[:, e * horizon:(e + 1) * horizon]),
                                       self._metric_dtype)
                               for e in range(self.adapter.episodes)])
            figures[name] = tf.reduce_mean(values) if run.steps is None \
                else values[run.steps]
        return figures


class RecurrentSampler:
    """A :class:`RecurrentPolicyLearner`'s policy collecting trials on a Python
    environment (:meth:`metalearn.rl.GymCollector.collect_trials`), what
    :class:`metalearn.rl.GymCollection` asks of the learner
    (:meth:`RecurrentPolicyLearner.policy_sampler`): one compiled step, ``(weights,
    observations, previous action features, previous rewards, done, hidden, seed) ->
    (actions, log-probabilities, inputs, hidden', action features)``, for every weight
    value; the inputs are built as in-graph (:meth:`RecurrentPolicyLearner.step_inputs`)
    and the hidden state is carried across the trial's episodes in this process.

    Args:
      learner: the recurrent policy learner.
    """

    def __init__(self, learner: RecurrentPolicyLearner):
        self.learner = learner
        self._fn = tf.function(self._step)

    def _step(self, weights, observations, previous, rewards, done, hidden, seed):
        learner = self.learner
        inputs = learner.step_inputs(observations, previous, rewards, done)
        outputs, hidden = learner.adapter.step(learner.model_call, weights, inputs, hidden)
        outputs = tf.cast(outputs, learner.environment.dtype)
        actions = learner.distribution.sample(outputs, seed)
        return (actions, learner.distribution.log_prob(outputs, actions), inputs, hidden,
                learner.action_features(actions))

    def __call__(self, weights: Weights) -> "TrialPolicy":
        """The policy with ``weights`` (a :class:`~metalearn.rl.TrialPolicy`), for
        :meth:`~metalearn.rl.GymCollector.collect_trials`."""
        return _RecurrentPolicy(self, weights)

    def collect(self, collector: Any, weights: Weights, task: Any, seed: Any) -> Collected:
        """``collector``'s ``rollouts`` trials of ``adapter.episodes`` episodes of the
        policy with ``weights`` in ``task`` (a :class:`~metalearn.rl.Collected`)."""
        return collector.collect_trials(self(weights), task, seed,
                                        self.learner.adapter.episodes)


class _RecurrentPolicy(TrialPolicy):
    """:class:`RecurrentSampler`'s policy with given weights: the hidden state, the
    previous action's features and the previous reward of every copy of a trial."""

    def __init__(self, sampler: RecurrentSampler, weights: Weights):
        self.sampler, self.weights = sampler, weights

    def start(self, n: int) -> None:
        learner = self.sampler.learner
        env = learner.environment
        self.hidden = learner.adapter.initial_hidden(n, learner.model.inputs[1].dtype)
        self.previous = tf.zeros([n, env.action_size], env.dtype)
        self.rewards = tf.zeros([n], env.dtype)
        self.features = None

    def __call__(self, observations, seed, done):
        actions, log_probs, inputs, self.hidden, self.features = self.sampler._fn(
            self.weights, tf.constant(observations), self.previous, self.rewards,
            tf.constant(done), self.hidden, tf.constant(seed))
        return actions.numpy(), log_probs.numpy(), inputs.numpy()

    def after(self, actions, rewards):
        env = self.sampler.learner.environment
        self.previous = self.features
        self.rewards = tf.constant(np.asarray(rewards), env.dtype)
