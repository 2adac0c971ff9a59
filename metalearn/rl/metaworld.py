"""Meta-World v3 (Yu et al. 2019; the Farama Foundation's ``metaworld`` 3.x): its
meta-learning benchmarks as a :class:`~metalearn.rl.PythonEnvironment`, and its own
evaluator run on a trained :class:`~metalearn.rl.PolicyLearner`.

* :class:`MetaWorld`: ML1 (one manipulation task, e.g. ``reach-v3``, ``push-v3``,
  ``pick-place-v3``; 50 training and 50 test goals), ML10 and ML45 (50 goals of each of
  10 or 45 training tasks, 5 held-out test tasks), the train and test task sets exactly
  Meta-World's (``metaworld.ML1(env_name, seed)``, ``ML10(seed)``, ``ML45(seed)``): a
  task is an index into them, drawn as a pure function of the seed (the ``"train"``
  split from the training tasks, ``"validation"`` and ``"test"`` from the test ones),
  set on the simulator before each reset (:meth:`MetaWorld.set_task`). Observations
  39, actions 4, the reward Meta-World's own (its ``v2`` reward functions by default),
  ``success`` (``info["success"]`` at any step of the episode) a metric beside
  ``return`` in training logs and :func:`metalearn.evaluate`.
* :class:`MetaWorldAgent`: Meta-World's ``MetaLearningAgent`` protocol around a
  :class:`~metalearn.rl.PolicyLearner`: it samples the current policy while Meta-World
  runs its adaptation episodes, records them per vector-environment copy (one test task
  each) and adapts each copy's weights with the learner's own inner loop (in
  TensorFlow, on those trajectories, as in training); evaluation acts with the adapted
  weights.
* :func:`metaworld_evaluation`: builds Meta-World's test environments
  (``gymnasium.make_vec("Meta-World/<benchmark>-test", ...)``) and runs its
  ``metaworld.evaluation.metalearning_evaluation`` on the agent: the figures are the
  protocol's (mean success rate, mean return, success rate per test task). ``python -m
  metalearn.evaluate --workdir=... --metaworld`` runs it on a trained run.

Meta-World is in the ``rl`` extra (``pip install -e '.[rl]'``: ``metaworld>=3.1``, which
pins its MuJoCo version).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import gin
import numpy as np
import tensorflow as tf

from metalearn.ranges import COUNT, WHOLE, Range, check_range
from metalearn.rl.environments import Trajectories
from metalearn.rl.gym import PythonEnvironment, require_gymnasium
from metalearn.rl.learner import Collected, PolicyLearner, PolicySampler, success_rate
from metalearn.rl.policies import Gaussian
from metalearn.tasks.base import SPLITS

INSTALL = "pip install -e '.[rl]' (or: pip install 'metaworld>=3.1')"
BENCHMARKS = ("ML1", "ML10", "ML45")
MAX_HORIZON = 500
"""Meta-World's episode length (``max_path_length``): its simulators refuse a step past
it."""
HORIZON = Range(1, MAX_HORIZON, whole=True)


def require_metaworld(what: str) -> Any:
    """The ``metaworld`` module; ``ImportError`` naming the install command if it is
    missing."""
    require_gymnasium(what)
    try:
        import metaworld
    except ImportError as error:
        raise ImportError(f"{what} needs Meta-World (metaworld>=3.1): {INSTALL}") from error
    return metaworld


def make_benchmark(benchmark: str, env_name: Optional[str], seed: int) -> Any:
    """Meta-World's benchmark object (``metaworld.ML1(env_name, seed)``, ``ML10(seed)``,
    ``ML45(seed)``), its ``train_tasks`` / ``test_tasks`` and classes, with the
    arguments checked and named."""
    if benchmark not in BENCHMARKS:
        raise ValueError(f"MetaWorld.benchmark must be one of {BENCHMARKS}, got "
                         f"{benchmark!r}")
    metaworld = require_metaworld("MetaWorld")
    if benchmark == "ML1":
        names = list(metaworld.ML1.ENV_NAMES)
        if env_name not in names:
            raise ValueError(f"MetaWorld.env_name must be a Meta-World v3 environment for "
                             f"ML1 (e.g. 'reach-v3', 'push-v3', 'pick-place-v3'; all "
                             f"{len(names)}: metaworld.ML1.ENV_NAMES), got {env_name!r}")
        return metaworld.ML1(env_name, seed=seed)
    if env_name is not None:
        raise ValueError(f"MetaWorld.env_name is for ML1 only ({benchmark} holds its own "
                         f"tasks): leave it None, got {env_name!r}")
    return getattr(metaworld, benchmark)(seed=seed)


_SIMULATORS: List[type] = []


def _simulators_env() -> type:
    """The Gymnasium environment :meth:`MetaWorld.make_env` makes (the class made once,
    Gymnasium imported then)."""
    if _SIMULATORS:
        return _SIMULATORS[0]
    gymnasium = require_gymnasium("MetaWorld")

    class Simulators(gymnasium.Env):
        """One copy of a Meta-World benchmark: a simulator per environment class (made
        when a task of that class first comes), the one of the latest task
        (:meth:`select`) reset and stepped."""

        def __init__(self, classes: Dict[str, type], reward_function_version: str):
            self.classes, self.version = classes, reward_function_version
            self.simulators: Dict[str, Any] = {}
            self.current = self._simulator(next(iter(classes)))
            self.observation_space = self.current.observation_space
            self.action_space = self.current.action_space
            self.task = None

        def _simulator(self, name: str) -> Any:
            if name not in self.simulators:
                self.simulators[name] = self.classes[name](
                    reward_function_version=self.version)
            return self.simulators[name]

        def select(self, task: Any) -> None:
            """Makes ``task`` (a ``metaworld.Task``) this copy's: its class's simulator,
            the task's goal set on it."""
            self.current = self._simulator(task.env_name)
            self.current.set_task(task)
            self.task = task

        def reset(self, *, seed: Optional[int] = None,
                  options: Optional[Dict[str, Any]] = None) -> Tuple[Any, Dict[str, Any]]:
            if self.task is None:
                raise RuntimeError("a Meta-World simulator needs a task before its reset "
                                   "(MetaWorld.set_task)")
            return self.current.reset(seed=seed, options=options)

        def step(self, action: Any) -> Tuple[Any, ...]:
            return self.current.step(action)

        def close(self) -> None:
            for simulator in self.simulators.values():
                simulator.close()

    _SIMULATORS.append(Simulators)
    return Simulators


@gin.configurable
class MetaWorld(PythonEnvironment):
    """A Meta-World v3 meta-learning benchmark as a task sampler (module docstring).

    A task is ``[split, index]`` (int64): ``split`` 0 for the benchmark's training
    tasks, 1 for its test tasks, ``index`` into that list (``benchmark.train_tasks`` /
    ``test_tasks``, each a goal of one environment class); the ``"train"`` split draws
    uniformly from the training tasks, ``"validation"`` and ``"test"`` from the test
    tasks (Meta-World has two sets). :meth:`set_task` sets the task on each simulator
    before its reset (the class's simulator, the goal), so every rollout of a task has
    its goal, whatever the process that steps it.

    Args:
      benchmark: ``"ML1"``, ``"ML10"`` or ``"ML45"``.
      env_name: ML1's environment (any v3 name: ``"reach-v3"``, ``"push-v3"``,
        ``"pick-place-v3"``, ...), which ML1 needs; ``None`` for ML10 and ML45.
      seed: the seed of Meta-World's goals (its benchmark's ``seed``: ML1's test goals
        use ``seed + 1``), and of the test environments of :func:`metaworld_evaluation`.
      horizon: steps per rollout, ``1 <= horizon <= 500`` (Meta-World's episode length;
        fewer make a cheaper, shorter task).
      reward_function_version: Meta-World's reward functions, ``"v2"`` (its default) or
        ``"v1"``.
    """

    observation_size, action_size = 39, 4
    step_infos = ("success",)

    def __init__(self, benchmark: str = "ML1", env_name: Optional[str] = None,
                 seed: int = 0, horizon: int = MAX_HORIZON,
                 reward_function_version: str = "v2"):
        name = type(self).__name__
        self.horizon = check_range(name, "horizon", horizon, HORIZON)
        seed = check_range(name, "seed", seed, WHOLE)
        if reward_function_version not in ("v1", "v2"):
            raise ValueError(f"{name}.reward_function_version must be 'v1' or 'v2', got "
                             f"{reward_function_version!r}")
        self.bench = make_benchmark(benchmark, env_name, int(seed))
        self.benchmark, self.env_name, self.seed = benchmark, env_name, int(seed)
        self.reward_function_version = reward_function_version
        self.env_id = f"Meta-World/{benchmark}" + (f" {env_name}" if env_name else "")
        self.task_sets = (list(self.bench.train_tasks), list(self.bench.test_tasks))
        self.classes = {**self.bench.train_classes, **self.bench.test_classes}

    def __repr__(self) -> str:
        return (f"MetaWorld({self.benchmark!r}, env_name={self.env_name!r}, "
                f"seed={self.seed}, horizon={self.horizon})")

    # --- the task sampler ----------------------------------------------------------

    def tasks(self, seed: tf.Tensor, num_tasks: int, split: str = "train") -> tf.Tensor:
        """``[num_tasks, 2]`` int64 tasks ``[set, index]`` drawn uniformly from the
        ``split``'s set (``"train"``: the training tasks; else the test tasks)."""
        which = 0 if split == "train" else 1
        size = len(self.task_sets[which])
        index = tf.random.stateless_uniform([int(num_tasks)], seed, 0, size, tf.int64)
        return tf.stack([tf.fill([int(num_tasks)], tf.constant(which, tf.int64)), index], -1)

    def split_tasks(self, seed: tf.Tensor, num_tasks: int, split: str) -> tf.Tensor:
        """:meth:`tasks` from ``split``'s set (what :meth:`sample` draws)."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        return self.tasks(seed, num_tasks, split)

    def task(self, task: Any) -> Any:
        """The ``metaworld.Task`` of ``task`` (``[set, index]``)."""
        which, index = (int(v) for v in np.asarray(task).reshape(-1)[:2])
        if which not in (0, 1) or not 0 <= index < len(self.task_sets[which]):
            raise ValueError(f"a {self.benchmark} task is [set (0 train, 1 test), index < "
                             f"{[len(t) for t in self.task_sets]}], got "
                             f"{np.asarray(task).tolist()!r}")
        return self.task_sets[which][index]

    # --- the simulators ------------------------------------------------------------

    def make_env(self) -> Any:
        """One copy: a simulator per environment class of the benchmark (made on first
        use), switched by :meth:`set_task`."""
        return _simulators_env()(self.classes, self.reward_function_version)

    def set_task(self, env: Any, task: np.ndarray) -> None:
        """Sets Meta-World's task (its class and goal) on the copy before its reset."""
        env.unwrapped.select(self.task(task))

    def task_reward(self, task, reward, info):
        return reward

    def task_metrics(self):
        return {"success": success_rate}


def _episodes(records: Sequence[Tuple[np.ndarray, ...]], horizon: int
              ) -> Optional[Collected]:
    """The complete episodes of one copy's stream of ``(observation, action, reward,
    done, log_prob)`` as a :class:`Collected` (``[episodes, horizon, ...]``, zero-padded
    after each episode's end); ``None`` if none ended."""
    episodes, current = [], []
    for record in records:
        current.append(record)
        if record[3]:
            episodes.append(current)
            current = []
    if not episodes:
        return None
    n = len(episodes)
    observations = np.zeros([n, horizon, len(records[0][0])], np.float32)
    actions = np.zeros([n, horizon, len(records[0][1])], np.float32)
    rewards, mask, log_probs = (np.zeros([n, horizon], np.float32) for _ in range(3))
    for i, episode in enumerate(episodes):
        if len(episode) > horizon:
            raise ValueError(f"an adaptation episode ran {len(episode)} steps, past the "
                             f"learner environment's horizon {horizon}")
        for t, (observation, action, reward, _, log_prob) in enumerate(episode):
            observations[i, t], actions[i, t] = observation, action
            rewards[i, t], mask[i, t], log_probs[i, t] = reward, 1.0, log_prob
    return Collected(Trajectories(observations, actions, rewards, mask),
                     np.full([n], 1.0 / n, np.float32), log_probs)


class MetaWorldAgent:
    """Meta-World's ``MetaLearningAgent`` protocol (``metaworld.evaluation``) around a
    trained :class:`~metalearn.rl.PolicyLearner`: each copy of the vector environment
    holds one test task and gets weights of its own.

    * :meth:`init`: every copy back to the learner's (meta-learned) weights;
    * :meth:`adapt_action`: actions sampled from each copy's current policy (the seed
      a function of ``seed`` and a step counter); :meth:`step` records each copy's
      timesteps;
    * :meth:`adapt`: after each of Meta-World's adaptation steps, each copy's complete
      episodes become that inner step's support trajectories and the copy's weights are
      the learner's own adaptation (:meth:`~metalearn.Learner.adapt`, ``k`` inner steps
      after ``k`` calls, from the meta-learned weights, every step on its own
      trajectories with the likelihood ratio to the policy that collected them: what
      training's collection does);
    * :meth:`eval_action`: actions of the adapted policy (sampled, or its mean with
      ``deterministic``); :meth:`reset`: nothing to reset (the policy has no state).

    A learner whose adaptation is not a gradient step on trajectories
    (``learner.inner_steps_sample`` false: RL²'s
    :class:`~metalearn.rl.RecurrentPolicyLearner`, whose adaptation is a hidden state)
    is refused with a ``TypeError``: this agent does not run it (an RL² policy reads
    the previous reward at every step, and Meta-World's evaluation episodes give an
    agent no rewards: ``eval_action`` sees observations only).

    Args:
      learner: the trained policy learner.
      seed: the seed of the sampled actions.
      deterministic: evaluate with the policy's mean action instead of a sample.
    """

    def __init__(self, learner: PolicyLearner, seed: int = 0, deterministic: bool = False):
        if not isinstance(learner, PolicyLearner):
            raise TypeError(f"MetaWorldAgent needs a metalearn.rl.PolicyLearner, got "
                            f"{learner!r}")
        if not learner.inner_steps_sample:
            raise TypeError(
                f"MetaWorldAgent adapts a policy's weights with the learner's inner loop on "
                f"its adaptation episodes; {type(learner).__name__} (RL²) adapts in a "
                f"recurrent policy's hidden state, which reads the previous reward at "
                f"every step, and Meta-World's evaluation episodes give an agent no "
                f"rewards: evaluate it with python -m metalearn.evaluate (without "
                f"--metaworld), where steps=k is episode k + 1 of each trial")
        self.learner, self.deterministic = learner, bool(deterministic)
        self.sampler = PolicySampler(learner)
        self.seed = tf.constant([int(seed), 0], tf.int64)
        self.calls = 0
        self._adapt = tf.function(lambda x, y, k: learner.adapt(x, y, steps=k).weights,
                                  reduce_retracing=True)
        if self.deterministic and not isinstance(learner.distribution, Gaussian):
            raise ValueError(f"MetaWorldAgent(deterministic=True) acts with a Gaussian "
                             f"policy's mean; the learner's policy is a "
                             f"{type(learner.distribution).__name__}")
        self._mean = tf.function(lambda w, o: tf.split(learner.predict(w, o), 2, -1)[0])
        self.init()

    def init(self) -> None:
        """Every copy back to the meta-learned weights, no trajectories."""
        self.weights: Optional[List[Any]] = None
        self.rounds: List[List[Collected]] = []  # per adaptation step, per copy
        self.records: Optional[List[List[Tuple[np.ndarray, ...]]]] = None

    def _policies(self, count: int) -> List[Any]:
        if self.weights is None:
            self.weights = [self.learner.initial_weights()] * count
        if len(self.weights) != count:
            raise ValueError(f"the vector environment has {count} copies, the agent "
                             f"holds weights for {len(self.weights)}")
        return self.weights

    def _sample(self, observations: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        observations = np.asarray(observations, np.float32)
        seed = tf.random.experimental.stateless_fold_in(self.seed, self.calls)
        self.calls += 1
        actions, log_probs = [], []
        for i, weights in enumerate(self._policies(len(observations))):
            a, lp = self.sampler(weights)(observations[i:i + 1],
                                          tf.random.experimental.stateless_fold_in(seed, i))
            actions.append(a[0])
            log_probs.append(lp[0])
        return np.stack(actions), np.asarray(log_probs, np.float32)

    def adapt_action(self, observations: np.ndarray) -> Tuple[np.ndarray, Dict[str, Any]]:
        """Actions sampled from each copy's current policy and their log-probabilities
        (``aux["log_probs"]``)."""
        actions, log_probs = self._sample(observations)
        return actions.astype(np.float64), {"log_probs": log_probs}

    def step(self, timestep: Any) -> None:
        """Records one timestep of every copy (Meta-World's ``Timestep``)."""
        count = len(timestep.observation)
        if self.records is None:
            self.records = [[] for _ in range(count)]
        done = np.logical_or(timestep.terminated, timestep.truncated)
        log_probs = timestep.aux_policy_outputs["log_probs"]
        for i in range(count):
            self.records[i].append((timestep.observation[i], timestep.action[i],
                                    float(timestep.reward[i]), bool(done[i]),
                                    float(log_probs[i])))

    def adapt(self) -> None:
        """One more inner step per copy on its recorded episodes (module docstring)."""
        if self.records is None:
            raise RuntimeError("MetaWorldAgent.adapt before any adaptation step was "
                               "recorded (Meta-World's evaluator calls step first)")
        horizon = self.learner.environment.horizon
        collected = []
        for i, records in enumerate(self.records):
            episodes = _episodes(records, horizon)
            if episodes is None:
                raise RuntimeError(f"copy {i} completed no episode to adapt on")
            collected.append(episodes)
        self.rounds.append(collected)
        self.records = None
        steps = len(self.rounds)
        task = tf.zeros([2], tf.int64)  # read by nothing: the trajectories are collected
        weights = []
        for i in range(len(collected)):
            rounds = [r[i] for r in self.rounds]
            n = min(len(r.weights) for r in rounds)  # the same episodes count per step
            rounds = [tf.nest.map_structure(lambda t: t[:n], r._replace(
                weights=np.full([n], 1.0 / n, np.float32))) for r in rounds]
            support = tf.nest.map_structure(lambda *t: tf.constant(np.stack(t)), *rounds)
            weights.append(self._adapt(task, support, steps))
        self.weights = weights

    def eval_action(self, observations: np.ndarray) -> np.ndarray:
        """Actions of each copy's adapted policy (sampled, or the mean with
        ``deterministic``)."""
        if not self.deterministic:
            return self._sample(observations)[0].astype(np.float64)
        observations = np.asarray(observations, np.float32)
        return np.concatenate([self._mean(w, tf.constant(observations[i:i + 1])).numpy()
                               for i, w in enumerate(self._policies(len(observations)))]
                              ).astype(np.float64)

    def reset(self, env_mask: np.ndarray) -> None:
        """Nothing: the policy has no state between episodes."""


def make_test_envs(environment: MetaWorld, meta_batch_size: int,
                   vector_strategy: str = "sync") -> Any:
    """Meta-World's own test environments of ``environment``'s benchmark:
    ``gymnasium.make_vec("Meta-World/<benchmark>-test", seed=environment.seed,
    meta_batch_size=..., max_episode_steps=environment.horizon, ...)`` (one copy per
    test task slot; its goals Meta-World's test goals for that seed)."""
    gymnasium = require_gymnasium("metaworld_evaluation")
    require_metaworld("metaworld_evaluation")
    kwargs = {"env_name": environment.env_name} if environment.benchmark == "ML1" else {}
    return gymnasium.make_vec(f"Meta-World/{environment.benchmark}-test",
                              vector_strategy=vector_strategy, seed=environment.seed,
                              meta_batch_size=int(meta_batch_size),
                              max_episode_steps=environment.horizon,
                              reward_function_version=environment.reward_function_version,
                              **kwargs)


@gin.configurable
def metaworld_evaluation(learner: PolicyLearner, environment: Optional[MetaWorld] = None,
                         num_evals: int = 10, adaptation_steps: int = 1,
                         adaptation_episodes: int = 10, evaluation_episodes: int = 3,
                         meta_batch_size: int = 10, seed: int = 0,
                         deterministic: bool = False,
                         agent: Optional[MetaWorldAgent] = None) -> Dict[str, Any]:
    """Meta-World's own evaluation (``metaworld.evaluation.metalearning_evaluation``) of
    ``learner`` through :class:`MetaWorldAgent`, on the test environments of
    ``environment``'s benchmark (default: the learner's environment; the same
    benchmark seed gives the same test goals).

    For each of ``num_evals`` rounds Meta-World draws a test goal per copy, runs
    ``adaptation_steps`` times ``adaptation_episodes`` episodes of the current policy
    (each time followed by one inner step of the learner), then ``evaluation_episodes``
    episodes of the adapted policy, which end at their first success.

    Args:
      learner: the trained policy learner (its environment a :class:`MetaWorld`).
      environment: the benchmark to evaluate on (default: the learner's).
      num_evals, adaptation_steps, adaptation_episodes, evaluation_episodes: those of
        ``metalearning_evaluation`` (Meta-World's defaults: 10, 1, 10, 3).
      meta_batch_size: copies of the test environment (Meta-World's ``meta_batch_size``:
        it must divide each test class's 50 goals evenly, e.g. 5, 10, 25 or 50 for ML1;
        a multiple of 5 test classes for ML10 / ML45).
      seed: the seed of the agent's sampled actions.
      deterministic: evaluate with the policy's mean action.
      agent: the agent to run (default: ``MetaWorldAgent(learner, seed,
        deterministic)``), e.g. one whose adapted weights are read afterwards.

    Returns:
      ``{"benchmark", "env_name", "seed", "horizon", "protocol" (the arguments),
      "mean_success_rate", "mean_return", "success_rate_per_task" {task name: rate}}``.
    """
    metaworld = require_metaworld("metaworld_evaluation")
    from metaworld.evaluation import metalearning_evaluation
    environment = learner.environment if environment is None else environment
    if not isinstance(environment, MetaWorld):
        raise TypeError(f"metaworld_evaluation needs a metalearn.rl.MetaWorld environment "
                        f"(the learner's, or given), got {environment!r}")
    del metaworld
    for name, value in (("num_evals", num_evals), ("adaptation_steps", adaptation_steps),
                        ("adaptation_episodes", adaptation_episodes),
                        ("evaluation_episodes", evaluation_episodes),
                        ("meta_batch_size", meta_batch_size)):
        check_range("metaworld_evaluation", name, value, COUNT)
    classes = len(environment.bench.test_classes)
    per_class = len(environment.task_sets[1]) // classes
    if meta_batch_size % classes or per_class % (meta_batch_size // classes):
        raise ValueError(f"metaworld_evaluation.meta_batch_size must be a multiple of the "
                         f"{classes} test classes of {environment.benchmark} that splits "
                         f"each one's {per_class} goals evenly, got {meta_batch_size!r}")
    if agent is None:  # before the simulators: an agent the learner cannot have raises
        agent = MetaWorldAgent(learner, seed, deterministic)
    elif agent.learner is not learner:
        raise ValueError("metaworld_evaluation: the agent wraps another learner")
    envs = make_test_envs(environment, meta_batch_size)
    try:
        success, mean_return, per_task = metalearning_evaluation(
            agent, envs, num_evals=int(num_evals), adaptation_steps=int(adaptation_steps),
            adaptation_episodes=int(adaptation_episodes),
            evaluation_episodes=int(evaluation_episodes))
    finally:
        envs.close()
    return {"benchmark": environment.benchmark, "env_name": environment.env_name,
            "seed": environment.seed, "horizon": environment.horizon,
            "protocol": {"num_evals": int(num_evals),
                         "adaptation_steps": int(adaptation_steps),
                         "adaptation_episodes": int(adaptation_episodes),
                         "evaluation_episodes": int(evaluation_episodes),
                         "meta_batch_size": int(meta_batch_size), "agent_seed": int(seed),
                         "deterministic": bool(deterministic)},
            "mean_success_rate": float(success), "mean_return": float(mean_return),
            "success_rate_per_task": {str(k): float(v) for k, v in per_task.items()}}


def metaworld_figures(report: Dict[str, Any]) -> str:
    """:func:`metaworld_evaluation`'s report as lines to print: what was evaluated, the
    mean success rate and return, the success rate per test task."""
    protocol = ", ".join(f"{k} {v}" for k, v in report["protocol"].items())
    name = report["benchmark"] + (f" {report['env_name']}" if report["env_name"] else "")
    lines = [f"Meta-World {name} test tasks (benchmark seed {report['seed']}, horizon "
             f"{report['horizon']}), metaworld.evaluation.metalearning_evaluation: "
             f"{protocol}",
             f"mean success rate {report['mean_success_rate']:.4f}, mean return "
             f"{report['mean_return']:.2f}"]
    lines += [f"  {task}: success rate {rate:.4f}"
              for task, rate in sorted(report["success_rate_per_task"].items())]
    return "\n".join(lines)
