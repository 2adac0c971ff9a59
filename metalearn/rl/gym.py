"""Python environments (Gymnasium, MuJoCo): task families whose dynamics run outside the
compiled step, a vectorised collector, and the data flow that feeds their trajectories
to the ordinary meta-step.

* :class:`PythonEnvironment`: a task sampler like the in-graph environments (its tasks
  are a pure function of a seed, in TensorFlow) whose dynamics are a Gymnasium
  environment; a task reaches the reward (``task_reward``) and, before each reset, the
  simulator itself (``set_task``, ``reset_options``); :class:`HalfCheetahVelocity` and
  :class:`HalfCheetahDirection` are the MAML paper's MuJoCo tasks (Finn et al. 2017,
  section 5.3), :class:`PendulumGravity` a gravity per task.
* :class:`GymCollector`: ``rollouts`` copies of the environment in one Gymnasium vector
  environment, or in ``workers`` processes or Ray actors (the same trajectories bit for
  bit), run by a policy for the horizon; it returns
  :class:`~metalearn.rl.learner.Collected` trajectories with the actions'
  log-probabilities under the collecting policy; ``collect_trials`` runs a policy with
  a state (:class:`TrialPolicy`: RL²'s recurrent one) through several episodes back to
  back.
* :class:`GymCollection` (and :func:`collect_episodes`): MAML-RL's data flow for such
  environments: every task's pre-update trajectories with the current weights, the
  adaptation in TensorFlow on them (``learner.adapt``), the post-update trajectories
  with the adapted weights; the result is an episode whose ``support_y`` / ``query_y``
  hold the collected trajectories (the learner says how it collects:
  ``policy_sampler()``), on which the meta-step (any outer rule) recomputes
  the adaptation in-graph and takes the DiCE meta-gradient (on collected data the
  surrogates weight by the likelihood ratio to the collecting policy: at the
  collecting weights, DiCE). It is what :meth:`PythonEnvironment.collection` gives the
  training loop and :func:`metalearn.evaluate` (the hook
  :meth:`metalearn.tasks.TaskSampler.collection`), so ``metalearn.train`` runs a
  Python environment's config with checkpoints, exact resume and summaries.

The policy's random actions use the seeds an in-graph :func:`~metalearn.rl.rollout`
would (the step keys of ``stateless_split(seed, 2 horizon + 1)``), so a Python
environment with the dynamics of an in-graph one gives the same trajectories
(``tests/rl/gym_test.py``). Gymnasium and MuJoCo are the ``rl`` extra:
``pip install -e '.[rl]'``.
"""

from __future__ import annotations

import abc
import builtins
import contextlib
import functools
import multiprocessing
import os
import signal
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import gin
import numpy as np
import tensorflow as tf

from metalearn import _ray
from metalearn.learners.learner import Learner
from metalearn.ranges import COUNT, POSITIVE, check_range
from metalearn.rl.environments import Environment, Trajectories, check_goal_range
from metalearn.rl.learner import Collected, PolicySampler, TrialPolicy
from metalearn.tasks.base import Collection
from metalearn.tasks.episode import Episode

EXTRA = ("install the rl extra: pip install -e '.[rl]' (Gymnasium with MuJoCo, "
         "gymnasium[mujoco])")


def require_gymnasium(what: str) -> Any:
    """The ``gymnasium`` module; ``ImportError`` naming the ``rl`` extra to install if
    it is missing (a missing MuJoCo is found when :class:`GymCollector` makes the
    environment, and named the same way)."""
    try:
        import gymnasium
    except ImportError as error:
        raise ImportError(f"{what} needs Gymnasium: {EXTRA}") from error
    return gymnasium


class SimulatorError(RuntimeError):
    """A Python simulator failed (raised, gave non-finite observations or rewards, or
    did not return within :class:`GymCollector`'s ``step_time_limit``) in the middle of
    a rollout; the message names the task, the seed, the step and the call (the
    environment's ``reset`` or ``step``, or the task family's ``task_reward``)."""


class _TimeLimitReached(BaseException):
    """Raised by ``SIGALRM`` inside a simulator call past its time limit: a
    ``BaseException``, so that an environment's own ``except Exception`` cannot swallow
    it."""


@contextlib.contextmanager
def _alarm(seconds: float) -> Iterator[None]:
    """Raises :class:`_TimeLimitReached` in the main thread's code under way after
    ``seconds`` (``SIGALRM`` of a real-time interval timer); any timer and handler found
    are put back afterwards."""
    armed = [True]  # off once the call is over, even if another signal's exception
                    # cuts the clean-up short (the handler is then inert)

    def reached(number, frame):
        if armed[0]:
            raise _TimeLimitReached()
    previous = signal.signal(signal.SIGALRM, reached)
    earlier, _ = signal.setitimer(signal.ITIMER_REAL, seconds)
    start = time.monotonic()
    try:
        yield
    finally:
        armed[0] = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if earlier > 0:  # someone else's timer: what was left of it
            signal.setitimer(signal.ITIMER_REAL,
                             max(earlier - (time.monotonic() - start), 1e-6))


def _call_within(seconds: Optional[float], function: Callable, *args: Any) -> Any:
    """``function(*args)``, raising :class:`_TimeLimitReached` if it has not returned
    after ``seconds`` (``None``: no limit).

    In the main thread (where the training loop and :func:`metalearn.evaluate` collect)
    ``SIGALRM`` interrupts the call itself: Python code, a ``time.sleep``, a wait on an
    ``"async"`` vector environment's workers. Code in a C extension that never returns
    to Python is not interrupted. Elsewhere (no signal reaches another thread, and
    Windows has no ``setitimer``) the call runs in a thread of its own and the caller
    stops waiting for it: past the limit that thread is left running, as a daemon."""
    if seconds is None:
        return function(*args)
    if (threading.current_thread() is threading.main_thread()
            and hasattr(signal, "setitimer")):  # not on Windows
        with _alarm(seconds):
            return function(*args)
    outcome: Dict[str, Any] = {}

    def run():
        try:
            outcome["value"] = function(*args)
        except BaseException as error:  # noqa: BLE001  (handed to the caller)
            outcome["error"] = error
    worker = threading.Thread(target=run, name="metalearn-simulator", daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise _TimeLimitReached()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


class PythonEnvironment(Environment):
    """A task family whose dynamics are a Gymnasium environment: a
    :class:`~metalearn.tasks.TaskSampler` (``tasks(seed, num_tasks)`` in TensorFlow, as
    the in-graph environments) for the episodes, and, for :class:`GymCollector`, how a
    simulator is made (:meth:`make_env`: :attr:`env_id` and :meth:`make_kwargs`), how a
    task reaches it before each reset (:meth:`set_task`: physical parameters;
    :meth:`reset_options`: the reset's ``options``, e.g. a start state) and the task's
    reward (:meth:`task_reward`).

    Subclasses set :attr:`env_id`, :attr:`observation_size`, :attr:`action_size`,
    :attr:`horizon` and implement :meth:`tasks` and :meth:`task_reward`; a task family
    whose tasks change the dynamics overrides :meth:`set_task` (or
    :meth:`reset_options`). The in-graph dynamics (``reset``, ``observe``, ``step``)
    raise: its trajectories come from a collector (:func:`collect_episodes`), not from
    rollouts inside the step.

    The collector hands the task to every copy's reset (``reset(seed=...,
    options={"task": task})``, through a wrapper around what :meth:`make_env` made), in
    the process that steps that copy: so :meth:`make_env`, :meth:`set_task` and
    :meth:`reset_options` run in worker processes with ``GymCollector(workers > 1)``.
    """

    env_id: str
    action_kind = "continuous"
    dtype = tf.float32
    step_infos: Tuple[str, ...] = ()
    """Keys of the simulator's ``info`` that :class:`GymCollector` records at every step
    (``Trajectories.infos``, ``[n, T]`` float32 each, zero after an episode's end), for
    the metrics of :meth:`~metalearn.rl.Environment.task_metrics` (Meta-World's
    ``success``)."""

    def make_kwargs(self) -> Dict[str, Any]:
        """Keywords of ``gymnasium.make`` for :attr:`env_id` (the same for every task)."""
        return {}

    def make_env(self) -> Any:
        """One simulator (a ``gymnasium.Env``): ``gymnasium.make(env_id,
        **make_kwargs())``. Override to build one another way (an environment class
        that is not registered); the collector makes one per copy, once."""
        return require_gymnasium(type(self).__name__).make(self.env_id,
                                                           **self.make_kwargs())

    def set_task(self, env: Any, task: np.ndarray) -> None:
        """Sets ``task`` (its parameters, NumPy, as :meth:`tasks` gives one) on one
        simulator ``env`` (what :meth:`make_env` made; the simulator itself is
        ``env.unwrapped``) before each of its resets: a physical parameter (a gravity,
        a mass), a goal the simulator reads. By default nothing: the task reaches the
        reward only (:meth:`task_reward`). Raise ``ValueError`` for a task it cannot
        take; the collector names the task, the seed and this method."""

    def reset_options(self, task: np.ndarray) -> Optional[Dict[str, Any]]:
        """The ``options`` of the simulator's ``reset`` for ``task`` (e.g. a start state
        the Gymnasium environment reads from them); ``None`` by default."""
        return None

    @abc.abstractmethod
    def task_reward(self, task: np.ndarray, reward: np.ndarray, info: Dict[str, Any]
                    ) -> np.ndarray:
        """``[n]`` rewards of one step of ``n`` copies for ``task`` (its parameters,
        NumPy) from the environment's own ``reward`` and ``info`` (arrays over copies)."""

    def _in_python(self, *args: Any) -> Any:
        raise NotImplementedError(
            f"{type(self).__name__} runs in Python: its trajectories come from a "
            f"metalearn.rl.GymCollector (metalearn.rl.collect_episodes), not from "
            f"rollouts inside the step")

    reset = observe = step = _in_python

    def collection(self, learner: Learner) -> "GymCollection":
        """Trajectories collected with ``learner``'s current weights by a
        :class:`GymCollector` of this environment (its gin bindings:
        ``GymCollector.rollouts``): the batches the training loop and
        :func:`metalearn.evaluate` give the meta-step (:class:`GymCollection`)."""
        return GymCollection(learner, GymCollector(self))


@gin.configurable
class HalfCheetahVelocity(PythonEnvironment):
    """HalfCheetah (MuJoCo) running at a target velocity per task, as in the MAML paper:
    reward ``-|v - v_goal| - ctrl_cost_weight |a|^2`` (``v``: the forward velocity),
    goals uniform in ``goal_range``.

    Args:
      goal_range: ``(low, high)`` of the goal velocity (the paper's ``(0, 2)``).
      horizon: steps per rollout (the MAML code's 200).
      ctrl_cost_weight: the control cost's weight (the MAML code's 0.05).
      env_id: the Gymnasium id.
    """

    observation_size, action_size = 17, 6

    def __init__(self, goal_range: Tuple[float, float] = (0.0, 2.0), horizon: int = 200,
                 ctrl_cost_weight: float = 0.05, env_id: str = "HalfCheetah-v5"):
        require_gymnasium(type(self).__name__)
        low, high = check_goal_range(goal_range, horizon, type(self).__name__)
        self.goal_range, self.horizon = (low, high), int(horizon)
        self.ctrl_cost_weight, self.env_id = float(ctrl_cost_weight), str(env_id)

    def make_kwargs(self):
        return {"ctrl_cost_weight": self.ctrl_cost_weight}

    def tasks(self, seed, num_tasks):
        return tf.random.stateless_uniform([num_tasks], seed, *self.goal_range,
                                           dtype=self.dtype)

    def task_reward(self, task, reward, info):
        return -np.abs(info["x_velocity"] - task) + info["reward_ctrl"]


@gin.configurable
class HalfCheetahDirection(HalfCheetahVelocity):
    """HalfCheetah running forward or backward per task (the MAML paper's direction
    tasks): reward ``d v - ctrl_cost_weight |a|^2`` with ``d = +1`` or ``-1``, each with
    probability 1/2. Arguments as :class:`HalfCheetahVelocity` (no ``goal_range``)."""

    def __init__(self, horizon: int = 200, ctrl_cost_weight: float = 0.05,
                 env_id: str = "HalfCheetah-v5"):
        super().__init__((-1.0, 1.0), horizon, ctrl_cost_weight, env_id)

    def tasks(self, seed, num_tasks):
        coin = tf.random.stateless_uniform([num_tasks], seed, dtype=self.dtype)
        return tf.where(coin < 0.5, -tf.ones_like(coin), tf.ones_like(coin))

    def task_reward(self, task, reward, info):
        return task * info["x_velocity"] + info["reward_ctrl"]


@gin.configurable
class PendulumGravity(PythonEnvironment):
    """Gymnasium's Pendulum (swing up and hold upright) with the gravity drawn per task:
    tasks that change the dynamics, not the reward. Each task is a gravity uniform in
    ``gravity_range`` (Gymnasium's default is 10), set on every copy before its reset
    (:meth:`set_task`); the reward is Pendulum's own, ``-(theta^2 + 0.1 theta_dot^2 +
    0.001 u^2)``. Observations ``[cos theta, sin theta, theta_dot]``, one action (the
    torque, clipped to ``[-2, 2]``).

    Args:
      gravity_range: ``(low, high)`` of the gravity, ``0 < low <= high``.
      horizon: steps per rollout (at most Pendulum's 200, after which Gymnasium
        truncates it).
      env_id: the Gymnasium id.
    """

    observation_size, action_size = 3, 1

    def __init__(self, gravity_range: Tuple[float, float] = (5.0, 15.0), horizon: int = 100,
                 env_id: str = "Pendulum-v1"):
        name = type(self).__name__
        require_gymnasium(name)
        low, high = (float(v) for v in gravity_range)
        if not 0 < low <= high < np.inf:
            raise ValueError(f"{name}.gravity_range must be (low, high) with 0 < low <= "
                             f"high, got {gravity_range!r}")
        self.gravity_range, self.env_id = (low, high), str(env_id)
        self.horizon = check_range(name, "horizon", horizon, COUNT)

    def tasks(self, seed, num_tasks):
        return tf.random.stateless_uniform([num_tasks], seed, *self.gravity_range,
                                           dtype=self.dtype)

    def set_task(self, env, task):
        gravity = float(task)
        if not (np.isfinite(gravity) and gravity > 0):
            raise ValueError(f"the gravity must be a finite number > 0, got {gravity!r}")
        env.unwrapped.g = gravity

    def task_reward(self, task, reward, info):
        return reward


TASK_OPTION = "task"
"""The key of the reset ``options`` in which :class:`GymCollector` hands the task to
every copy (the wrapper around each simulator takes it out before the simulator's own
reset, which gets :meth:`PythonEnvironment.reset_options` instead)."""


class _TaskRejected(ValueError):
    """A task that :meth:`PythonEnvironment.set_task` or
    :meth:`~PythonEnvironment.reset_options` could not take (raised where the copy runs,
    a worker process included; the collector adds the task, the seed and the step)."""


_TASK_RESET: List[type] = []


def _task_reset() -> type:
    """The Gymnasium wrapper that hands the task in a reset's ``options`` to its
    environment's :meth:`~PythonEnvironment.set_task` and
    :meth:`~PythonEnvironment.reset_options` (made once, Gymnasium imported then)."""
    if _TASK_RESET:
        return _TASK_RESET[0]
    gymnasium = require_gymnasium("GymCollector")

    class TaskReset(gymnasium.Wrapper):
        """One copy of a :class:`PythonEnvironment`: each reset sets the latest task
        given (``options["task"]``) on the simulator and resets it with the task's
        options; resets without a task (Gymnasium's autoreset) keep the latest."""

        def __init__(self, env: Any, environment: PythonEnvironment):
            super().__init__(env)
            self.environment, self.task = environment, None

        def reset(self, *, seed: Optional[int] = None,
                  options: Optional[Dict[str, Any]] = None) -> Any:
            options = dict(options or {})
            if TASK_OPTION in options:
                self.task = np.asarray(options.pop(TASK_OPTION))
            if self.task is not None:
                self._apply("set_task", self.env, self.task)
                options.update(self._apply("reset_options", self.task) or {})
            return self.env.reset(seed=seed, options=options or None)

        def _apply(self, method: str, *args: Any) -> Any:
            try:
                return getattr(self.environment, method)(*args)
            except Exception as error:  # noqa: BLE001  (named, with the task)
                raise _TaskRejected(
                    f"{type(self.environment).__name__}.{method} cannot take the task "
                    f"{self.task.tolist()!r}: {type(error).__name__}: {error}") from error

    _TASK_RESET.append(TaskReset)
    return TaskReset


def _make_copy(environment: PythonEnvironment) -> Any:
    """One copy for a vector environment: :meth:`PythonEnvironment.make_env` wrapped so
    that the task in a reset's ``options`` reaches it."""
    return _task_reset()(environment.make_env(), environment)


def _start_method() -> str:
    """How the collector starts its worker processes: ``fork`` where the platform has it
    (nothing to import or pickle: a worker starts in milliseconds), else ``spawn`` (then
    the environment must pickle)."""
    return "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"


def _portable(error: BaseException) -> BaseException:
    """``error`` as it crosses the pipe: a built-in exception (``ValueError``, ...) as
    its own type with its text, any other as a ``RuntimeError`` naming its type (an
    exception of a simulator's own class may not survive the trip, and nothing here
    unpickles objects to find out)."""
    kind = type(error)
    if getattr(builtins, kind.__name__, None) is kind:
        return kind(str(error))
    return RuntimeError(f"{kind.__name__}: {error}")


class _Simulators:
    """``size`` copies in one Gymnasium ``SyncVectorEnv``, commanded by a
    :class:`_WorkerPool` through its transport (a worker process, a Ray actor): every
    reply is ``("ok", result)`` or ``("error", exception)``."""

    def __init__(self, make_copy: Callable[[], Any], size: int):
        import gymnasium
        self.env, self.error = None, None
        try:
            self.env = gymnasium.vector.SyncVectorEnv([make_copy] * size)
        except Exception as error:  # noqa: BLE001  (handed to the pool)
            self.error = _portable(error)

    def started(self) -> Tuple[str, Any]:
        """The reply to the start: whether the copies were made."""
        return ("ok", None) if self.error is None else ("error", self.error)

    def handle(self, command: str, args: Any) -> Tuple[str, Any]:
        """``"reset"`` (``args``: its keywords), ``"step"`` (the copies' actions) or
        ``"close"``."""
        try:
            if command == "close":
                return "ok", self.env.close()
            return "ok", self.env.reset(**args) if command == "reset" else self.env.step(args)
        except Exception as error:  # noqa: BLE001  (handed to the pool)
            return "error", _portable(error)


def _simulator_worker(connection: Any, make_copy: Callable[[], Any], size: int) -> None:
    """A worker process of :class:`_Processes`: :class:`_Simulators` on the parent's
    commands. Stop signals are the parent's business (it ends its workers)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if hasattr(signal, "setitimer"):
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
    simulators = _Simulators(make_copy, size)
    connection.send(simulators.started())
    if simulators.env is None:
        return
    while True:
        try:
            command, args = connection.recv()
        except EOFError:  # the parent is gone
            break
        reply = simulators.handle(command, args)
        if command == "close":
            break
        connection.send(reply)


def _merge_infos(infos: Sequence[Dict[str, Any]], sizes: Sequence[int]) -> Dict[str, Any]:
    """The vector ``info`` of all copies from the workers' (each over its own copies,
    in order): every key's array concatenated, a worker without the key filling its
    rows as Gymnasium would (zeros, ``None`` for objects, ``False`` in its ``_key``
    mask)."""
    merged: Dict[str, Any] = {}
    for key in dict.fromkeys(k for info in infos for k in info):
        values = [info.get(key) for info in infos]
        if any(isinstance(v, dict) for v in values):
            merged[key] = _merge_infos([v or {} for v in values], sizes)
            continue
        like = next(np.asarray(v) for v in values if v is not None)
        parts = []
        for value, size in zip(values, sizes):
            if value is not None:
                parts.append(np.asarray(value))
            elif like.dtype == object:
                parts.append(np.full([size, *like.shape[1:]], None, object))
            else:
                parts.append(np.zeros([size, *like.shape[1:]], like.dtype))
        merged[key] = np.concatenate(parts)
    return merged


class _WorkerLost(Exception):
    """A transport's worker is gone (its detail in the text)."""


class _Processes:
    """:class:`_WorkerPool`'s workers as processes on this machine, one pipe each,
    started by ``fork`` where the platform has it (else ``spawn``: the environment
    must then pickle)."""

    def __init__(self, make_copy: Callable[[], Any], sizes: Sequence[int]):
        context = multiprocessing.get_context(_start_method())
        self.pipes, self.processes = [], []
        for k, size in enumerate(sizes):
            parent, child = context.Pipe()
            process = context.Process(target=_simulator_worker, args=(child, make_copy, size),
                                      name=f"metalearn-simulators-{k}", daemon=True)
            process.start()
            child.close()
            self.pipes.append(parent)
            self.processes.append(process)

    def send(self, messages: Sequence[Tuple[str, Any]]) -> None:
        for pipe, message in zip(self.pipes, messages):
            pipe.send(message)

    def receive(self) -> List[Tuple[str, Any]]:
        try:
            return [pipe.recv() for pipe in self.pipes]
        except EOFError:
            raise _WorkerLost(f"a simulator worker process ended unexpectedly (exit codes "
                              f"{[p.exitcode for p in self.processes]})") from None

    def close(self, terminate: bool) -> None:
        for pipe, process in zip(self.pipes, self.processes):
            if not terminate and process.is_alive():
                with contextlib.suppress(OSError, BrokenPipeError):
                    pipe.send(("close", None))
        for process in self.processes:
            if not terminate:
                process.join(5)
            if process.is_alive():
                process.terminate()
                process.join(5)
        for pipe in self.pipes:
            pipe.close()


class _RayActors:
    """:class:`_WorkerPool`'s workers as Ray actors, wherever the cluster places them
    (:func:`metalearn._ray.connect`; Ray is shut down at :meth:`close` when this joined
    it). Each reserves ``cpus`` of the cluster's CPUs; the environment must pickle."""

    def __init__(self, make_copy: Callable[[], Any], sizes: Sequence[int], address: str,
                 cpus: float):
        self.ray, self.started = _ray.connect(address, "GymCollector(ray_address=...)")
        try:
            actor = self.ray.remote(num_cpus=cpus, max_restarts=0)(_Simulators)
            self.actors = [actor.remote(make_copy, size) for size in sizes]
            self.pending = [a.started.remote() for a in self.actors]
        except BaseException:
            self._leave()
            raise

    def send(self, messages: Sequence[Tuple[str, Any]]) -> None:
        self.pending = [a.handle.remote(*m) for a, m in zip(self.actors, messages)]

    def receive(self) -> List[Tuple[str, Any]]:
        try:
            return self.ray.get(self.pending)
        except self.ray.exceptions.RayActorError as error:
            raise _WorkerLost(f"a simulator worker (Ray actor) ended unexpectedly: "
                              f"{error}") from None

    def close(self, terminate: bool) -> None:
        try:
            if not terminate:
                with contextlib.suppress(Exception):
                    self.ray.get([a.handle.remote("close", None) for a in self.actors],
                                 timeout=5)
            for actor in self.actors:
                with contextlib.suppress(Exception):
                    self.ray.kill(actor)
        finally:
            self._leave()

    def _leave(self) -> None:
        if self.started:
            self.started = False
            self.ray.shutdown()


class _WorkerPool:
    """``num_envs`` copies (``make_copy()`` each) split over ``workers`` workers in
    order (the first ``num_envs % workers`` take one more), with a Gymnasium vector
    environment's ``reset`` / ``step`` / ``close``: copy ``i`` is reset with
    ``seed + i`` wherever it runs and every worker gets the same ``options``, so what
    the copies do does not depend on ``workers``, nor on where the workers run
    (processes on this machine, :class:`_Processes`; Ray actors, :class:`_RayActors`,
    with ``ray_address``). The collector's own policy samples every copy's actions at
    once in its process."""

    def __init__(self, make_copy: Callable[[], Any], num_envs: int, workers: int,
                 ray_address: Optional[str] = None, ray_cpus: float = 1.0):
        probe = make_copy()  # the spaces, and any error of making one, here
        self.single_observation_space = probe.observation_space
        self.single_action_space = probe.action_space
        probe.close()
        self.num_envs = int(num_envs)
        self.sizes = [num_envs // workers + (k < num_envs % workers) for k in range(workers)]
        self.starts = [sum(self.sizes[:k]) for k in range(workers)]
        self.closed = False
        self.owner = os.getpid()  # a worker forked later holds a copy of this object
        self.workers = (_Processes(make_copy, self.sizes) if ray_address is None
                        else _RayActors(make_copy, self.sizes, ray_address, ray_cpus))
        self._replies()

    def _send(self, messages: Sequence[Tuple[str, Any]]) -> List[Any]:
        """``messages[k]`` to worker ``k``, then :meth:`_replies`."""
        if self.closed:
            raise RuntimeError("this GymCollector's worker processes were ended (after "
                               "an interruption, a time limit or close()): make a new "
                               "GymCollector")
        self.workers.send(messages)
        return self._replies()

    def _replies(self) -> List[Any]:
        """Every worker's reply to the last command, in order; the first error raised
        after all replies are in. An interruption (a time limit, a stop signal) or a
        worker gone ends every worker: the pool is closed."""
        try:
            replies = self.workers.receive()
        except _WorkerLost as error:
            self.close(terminate=True)
            raise RuntimeError(str(error)) from None
        except BaseException:
            self.close(terminate=True)
            raise
        for status, payload in replies:
            if status == "error":
                raise payload
        return [payload for _, payload in replies]

    def reset(self, seed: Optional[int] = None,
              options: Optional[Dict[str, Any]] = None) -> Tuple[np.ndarray, Dict[str, Any]]:
        """All copies reset: copy ``i`` with ``seed + i``."""
        replies = self._send([("reset", {"seed": None if seed is None else int(seed) + start,
                                         "options": options}) for start in self.starts])
        return (np.concatenate([r[0] for r in replies]),
                _merge_infos([r[1] for r in replies], self.sizes))

    def step(self, actions: np.ndarray) -> Tuple[Any, ...]:
        """All copies stepped, ``actions[i]`` in copy ``i``."""
        actions = np.asarray(actions)
        replies = self._send([("step", actions[start:start + size])
                              for start, size in zip(self.starts, self.sizes)])
        columns = [np.concatenate([r[i] for r in replies]) for i in range(4)]
        return (*columns, _merge_infos([r[4] for r in replies], self.sizes))

    def close(self, terminate: bool = False) -> None:
        """Ends the workers (at once with ``terminate``, else after closing their
        simulators)."""
        if self.closed or os.getpid() != self.owner:
            return
        self.closed = True
        if hasattr(self, "workers"):
            self.workers.close(terminate)

    def __del__(self) -> None:
        if not getattr(self, "closed", True):
            self.close(terminate=True)


@gin.configurable
class GymCollector:
    """``rollouts`` copies of a :class:`PythonEnvironment` in one Gymnasium vector
    environment; :meth:`collect` runs a policy in one task for the horizon.

    Each copy is what :meth:`PythonEnvironment.make_env` makes, wrapped so that the task
    given to :meth:`collect` reaches it at every reset
    (:meth:`PythonEnvironment.set_task`, :meth:`~PythonEnvironment.reset_options`).
    With ``workers > 1`` the copies are stepped in that many worker processes (copies
    split in order; each worker a Gymnasium ``SyncVectorEnv`` of its share), the
    policy sampling every copy's actions at once in the collecting process: copy ``i``
    is reset with the same seed and gets the same actions whatever ``workers`` is, so
    the trajectories are the same bit for bit (``tests/rl/dynamics_test.py``). Workers
    start by ``fork`` where the platform has it (else ``spawn``: the environment must
    then pickle) and end with :meth:`close`, an interruption or the process. With
    ``ray_address`` the workers are Ray actors instead, placed by the cluster (on
    other machines too), with the same trajectories bit for bit; the environment must
    pickle, and the policy still runs here.

    Args:
      environment: the task family.
      rollouts: copies, i.e. trajectories per task and inner step.
      vectorization_mode: ``"sync"`` (the copies stepped in turn) or ``"async"``
        (Gymnasium's ``AsyncVectorEnv``: a process per copy; ``workers`` must be 1).
      workers: processes that step the copies, ``1 <= workers <= rollouts``; 1 (the
        default) steps them in the collecting process (unless ``ray_address``).
      ray_address: step the copies in ``workers`` Ray actors on the cluster at this
        address (``"auto"``, ``"host:6379"``, or ``"local"`` for a new instance on
        this machine; Ray is joined unless this process has joined it already, and
        left at :meth:`close` if the collector joined it); ``None`` (the default):
        local processes. Ray is the ``ray`` extra.
      ray_cpus_per_worker: CPUs each actor reserves on the cluster, ``> 0``.
      step_time_limit: seconds each call into the simulators may take (the vector
        environment's ``reset`` or ``step`` of all copies, or the task's
        ``task_reward``), ``> 0``; past it the collection raises
        :class:`SimulatorError` naming the task, the seed and the step, so a hung
        simulator ends the run (with its checkpoint) instead of hanging it. ``None``:
        no limit. The default, 300, is far above a MuJoCo step (milliseconds). In the
        main thread, where training and evaluation collect, ``SIGALRM`` interrupts the
        call (Python code, sleeps, waits on ``"async"`` workers; not C code that never
        returns to Python), so this collector takes the process's ``SIGALRM`` and
        real-time interval timer during each call; in another thread the call runs in a
        thread of its own, which is left running past the limit.
    """

    def __init__(self, environment: PythonEnvironment, rollouts: int = 20,
                 vectorization_mode: str = "sync",
                 step_time_limit: Optional[float] = 300.0, workers: int = 1,
                 ray_address: Optional[str] = None, ray_cpus_per_worker: float = 1.0):
        gymnasium = require_gymnasium("GymCollector")
        if not isinstance(environment, PythonEnvironment):
            raise TypeError(f"GymCollector needs a metalearn.rl.PythonEnvironment, got "
                            f"{environment!r}")
        if isinstance(rollouts, bool) or int(rollouts) != rollouts or rollouts < 1:
            raise ValueError(f"GymCollector.rollouts must be a whole number >= 1, got "
                             f"{rollouts!r}")
        self.step_time_limit = None if step_time_limit is None else check_range(
            "GymCollector", "step_time_limit", step_time_limit, POSITIVE)
        self.workers = check_range("GymCollector", "workers", workers, COUNT)
        if self.workers > rollouts:
            raise ValueError(f"GymCollector.workers must be at most rollouts ({rollouts}): "
                             f"each worker steps one copy or more, got {workers!r}")
        if vectorization_mode not in ("sync", "async"):
            raise ValueError(f"GymCollector.vectorization_mode must be 'sync' or 'async', "
                             f"got {vectorization_mode!r}")
        if vectorization_mode == "async" and (self.workers > 1 or ray_address):
            raise ValueError(f"GymCollector: vectorization_mode='async' is a process per "
                             f"copy already; give workers={workers!r} and "
                             f"ray_address={ray_address!r} with 'sync'")
        if ray_address is not None and (not isinstance(ray_address, str) or
                                        not ray_address):
            raise ValueError(f"GymCollector.ray_address must be a Ray address ('auto', "
                             f"'host:6379' or 'local') or None, got {ray_address!r}")
        ray_cpus = check_range("GymCollector", "ray_cpus_per_worker", ray_cpus_per_worker,
                               POSITIVE)
        if ray_address is not None:
            _ray.require("GymCollector(ray_address=...)")  # before any simulator starts
        self.environment, self.rollouts = environment, int(rollouts)
        make_copy = functools.partial(_make_copy, environment)
        try:
            if self.workers > 1 or ray_address is not None:
                self.env = _WorkerPool(make_copy, self.rollouts, self.workers,
                                       ray_address, ray_cpus)
            else:
                vector = (gymnasium.vector.SyncVectorEnv if vectorization_mode == "sync"
                          else gymnasium.vector.AsyncVectorEnv)
                self.env = vector([make_copy] * self.rollouts)
        except (ImportError, gymnasium.error.DependencyNotInstalled) as error:  # MuJoCo
            raise ImportError(f"{type(environment).__name__} ({environment.env_id}) needs "
                              f"MuJoCo: {EXTRA}") from error
        except gymnasium.error.Error as error:
            raise ValueError(f"{type(environment).__name__}: Gymnasium cannot make "
                             f"{environment.env_id!r}: {error}") from error
        shape = self.env.single_observation_space.shape
        if tuple(shape) != (environment.observation_size,):
            self.env.close()
            raise ValueError(f"{environment.env_id} gives observations of shape "
                             f"{tuple(shape)}, {type(environment).__name__} declares "
                             f"({environment.observation_size},)")
        self.low = self.env.single_action_space.low
        self.high = self.env.single_action_space.high
        self.steps_taken = 0

    def close(self) -> None:
        """Closes the vector environment."""
        self.env.close()

    def _call(self, where: Callable[[int], str], t: int, phase: str, name: str,
              function: Callable, *args: Any, **kwargs: Any) -> Any:
        """``function(*args, **kwargs)``, one call into the simulators (``name``), within
        :attr:`step_time_limit`; a failure or an overrun is a :class:`SimulatorError`
        naming ``where(t)`` (the task, the seed, the step) and the call."""
        subject = name if "." in name else f"the simulator's {name}"
        try:
            return _call_within(self.step_time_limit, lambda: function(*args, **kwargs))
        except _TaskRejected as error:
            raise ValueError(f"{error} ({where(t)})") from None
        except _TimeLimitReached:
            if isinstance(self.env, _WorkerPool):  # a reply may still come: end them
                self.env.close(terminate=True)
            raise SimulatorError(
                f"{subject} did not return within {self.step_time_limit:g} s "
                f"({where(t)}): raise GymCollector.step_time_limit if it is only "
                f"slow") from None
        except Exception as error:  # noqa: BLE001  (any simulator failure, re-raised)
            raise SimulatorError(f"{subject} failed {phase} ({where(t)}): "
                                 f"{type(error).__name__}: {error}") from error

    def collect(self, policy: Callable, task: Any, seed: Any) -> Collected:
        """``rollouts`` trajectories of ``policy(observations, seed) -> (actions,
        log_probs)`` in ``task`` for the horizon (NumPy arrays in a :class:`Collected`;
        actions clipped to the action space for the simulator, recorded as sampled).
        The policy's seed at step ``t`` is the one :func:`~metalearn.rl.rollout` uses;
        the simulators are reset with a seed derived from ``seed`` (copy ``i``: that
        seed ``+ i``), each after the task is set on it
        (:meth:`PythonEnvironment.set_task`, :meth:`~PythonEnvironment.reset_options`).

        Raises:
          ValueError: the environment's ``set_task`` or ``reset_options`` could not
            take ``task`` (the task, the seed and the method named).
          SimulatorError: the simulator (its ``reset`` or ``step``, or the task's
            ``task_reward``) raised, gave non-finite values or did not return within
            ``step_time_limit`` (the task, the seed, the step and the call named).
        """
        task = np.asarray(task)
        seed = tf.cast(tf.convert_to_tensor(seed), tf.int64)
        keys = tf.random.experimental.stateless_split(
            seed, 2 * self.environment.horizon + 1).numpy()
        columns = self._episode(lambda observations, key, done: (
            *policy(observations, key), observations), task, seed, np.asarray(seed), keys,
            0, None)
        alive = columns.pop("alive")
        columns["log_probs"] = columns["log_probs"] * alive
        return self._collected(columns, alive)

    def collect_trials(self, policy: "TrialPolicy", task: Any, seed: Any,
                       episodes: int) -> Collected:
        """``rollouts`` trials of ``episodes`` episodes of ``task`` each, back to back,
        of a policy with a state carried across a trial's episodes (RL²'s recurrent
        policy: :class:`TrialPolicy`): a :class:`Collected` of ``T = episodes *
        horizon`` steps whose ``observations`` are what the policy recorded as its
        inputs (``policy.__call__``'s third result), whose mask is all ones and whose
        rewards and ``step_infos`` are zero after an episode's early end (the policy
        keeps acting on the simulator's observations, a Gymnasium autoreset's after a
        ``terminated``, so every step counts in the log-probabilities, as the in-graph
        :meth:`metalearn.rl.RecurrentPolicyLearner.trajectories` pads).

        The seeds are those of the in-graph trial: ``keys = stateless_split(seed,
        episodes * (2 horizon + 1))``; episode ``e`` resets every copy with a seed
        derived from ``keys[e (2 horizon + 1)]`` (as :meth:`collect` derives one from
        its seed; the task set before each reset, as there) and step ``t`` of it
        samples with ``keys[e (2 horizon + 1) + 1 + 2 t]``. ``policy.start(rollouts)``
        begins the trial; ``policy(observations, key, done)`` is called at every step,
        ``done`` ``[n]`` 1 at the first step of each episode after the first; then
        ``policy.after(actions, rewards)`` with the step's rewards (zero after an
        episode's end).

        Raises:
          ValueError, SimulatorError: as :meth:`collect` (the episode named too).
        """
        episodes = check_range("GymCollector.collect_trials", "episodes", episodes, COUNT)
        task = np.asarray(task)
        seed = tf.cast(tf.convert_to_tensor(seed), tf.int64)
        width = 2 * self.environment.horizon + 1
        keys = tf.random.experimental.stateless_split(seed, episodes * width).numpy()
        policy.start(self.rollouts)
        parts = [self._episode(policy, task, seed, keys[e * width], keys[e * width:],
                               float(e > 0), policy.after, e) for e in range(episodes)]
        columns = {k: np.concatenate([p[k] for p in parts], 1) for k in parts[0]}
        del columns["alive"]
        return self._collected(columns, np.ones_like(columns["rewards"]))

    def _collected(self, columns: Dict[str, np.ndarray], mask: np.ndarray) -> Collected:
        n = self.rollouts
        infos = {k[5:]: v for k, v in columns.items() if k.startswith("info:")}
        return Collected(Trajectories(columns["observations"], columns["actions"],
                                      columns["rewards"], mask.astype(np.float32), infos),
                         np.full([n], 1.0 / n, np.float32), columns["log_probs"])

    def _episode(self, policy: Callable, task: np.ndarray, seed: tf.Tensor,
                 reset_key: np.ndarray, keys: np.ndarray, done: float,
                 after: Optional[Callable], episode: Optional[int] = None
                 ) -> Dict[str, np.ndarray]:
        """One episode of every copy: reset with a seed from ``reset_key`` (the task set
        first), then ``policy(observations, keys[1 + 2 t], done_t) -> (actions,
        log_probs, recorded)`` at step ``t`` (``done_t``: ``done`` at ``t = 0``, else 0)
        and ``after(actions, rewards)`` once the step's rewards are in. ``[n, horizon,
        ...]`` arrays: the recorded observations, actions, rewards (zero after the
        episode's end), ``alive`` (1 up to and including the step that ended it), the
        log-probabilities as given, each ``step_infos`` key as ``info:key`` (zero after
        the end)."""
        env, n, horizon = self.environment, self.rollouts, self.environment.horizon
        reset_seed = int(np.asarray(reset_key)[0] % (2 ** 31 - 1))
        where = lambda t: (f"{type(env).__name__} task {task.tolist()!r}, seed "
                           f"{np.asarray(seed).tolist()}, "
                           + ("" if episode is None else f"episode {episode}, ")
                           + f"step {t}")
        observation, _ = self._call(where, 0, "at reset", "reset", self.env.reset,
                                    seed=reset_seed, options={TASK_OPTION: task})
        columns = {name: [] for name in ("observations", "actions", "rewards", "alive",
                                         "log_probs", *(f"info:{k}" for k in env.step_infos))}
        alive = np.ones([n], np.float32)
        for t in range(horizon):
            flags = np.full([n], done if t == 0 else 0.0, np.float32)
            actions, log_probs, recorded = policy(observation.astype(np.float32),
                                                  keys[1 + 2 * t], flags)
            following, reward, terminated, truncated, info = self._call(
                where, t, "mid-rollout", "step", self.env.step,
                np.clip(actions, self.low, self.high))
            reward = np.asarray(self._call(
                where, t, "mid-rollout", f"{type(env).__name__}.task_reward",
                env.task_reward, task, reward, info), np.float32)
            if not (np.all(np.isfinite(following)) and np.all(np.isfinite(reward))):
                raise SimulatorError(f"the simulator gave non-finite observations or "
                                     f"rewards mid-rollout ({where(t)})")
            for name, value in (("observations", recorded), ("actions", actions),
                                ("rewards", reward * alive), ("alive", alive),
                                ("log_probs", log_probs)):
                columns[name].append(np.asarray(value, np.float32))
            for key in env.step_infos:
                if key not in info:
                    raise SimulatorError(f"the simulator's info has no {key!r} (one of "
                                         f"{type(env).__name__}.step_infos; it has "
                                         f"{sorted(info)}) mid-rollout ({where(t)})")
                columns[f"info:{key}"].append(np.asarray(info[key], np.float32) * alive)
            if after is not None:
                after(actions, reward * alive)
            alive = alive * (1.0 - np.logical_or(terminated, truncated).astype(np.float32))
            observation = following
        self.steps_taken += n * horizon
        return {k: np.stack(v, axis=1) for k, v in columns.items()}  # [n, T, ...]


def _stack(items):
    return tf.nest.map_structure(lambda *t: np.stack(t), *items)


class GymCollection(Collection):
    """MAML-RL's data flow outside the step, for batches of a
    :class:`PythonEnvironment`'s episodes (leading task axis): for every task, the
    support trajectories of inner step ``k`` collected with the weights after ``k``
    steps (seeded by the support seed folded with ``k``, as
    :class:`~metalearn.rl.Rollouts`), the adaptation recomputed in TensorFlow on them,
    then the query trajectories with the adapted weights (the query seed). Calling it
    returns the episodes with ``support_y`` (``[tasks, steps, n, T, ...]``) and
    ``query_y`` (``[tasks, n, T, ...]``) the collected trajectories, for the meta-step.
    The weights are the learner's when called; every seed comes from the episodes, so
    the result is a function of the episodes and the weights (a resumed run collects
    what an uninterrupted one would).

    The learner says how its policy collects (its ``policy_sampler()``: a
    :class:`PolicySampler`, or RL²'s :class:`~metalearn.rl.recurrent.RecurrentSampler`,
    whose query data are whole trials) and whether its inner steps see trajectories
    (``inner_steps_sample``; RL² adapts in a hidden state, so its episodes get no
    support trajectories, whatever the number of steps evaluated).

    Args:
      learner: the policy learner whose weights collect.
      collector: the simulators.
      sampler: what collects with given weights (``sampler.collect(collector, weights,
        task, seed)``; default: ``learner.policy_sampler()``).
    """

    def __init__(self, learner: Learner, collector: GymCollector,
                 sampler: Optional[PolicySampler] = None):
        self.learner, self.collector = learner, collector
        self.sampler = sampler or learner.policy_sampler()
        if not callable(getattr(self.sampler, "collect", None)):
            raise TypeError(f"GymCollection's sampler collects with given weights: it needs "
                            f"collect(collector, weights, task, seed) -> Collected (a "
                            f"metalearn.rl.PolicySampler, or learner.policy_sampler()), got "
                            f"{type(self.sampler).__name__}")
        self._adapt = tf.function(lambda x, y, k: learner.adapt(x, y, steps=k).weights,
                                  reduce_retracing=True)

    @property
    def depends_on_steps(self) -> bool:
        """Whether a batch depends on the number of inner steps: the learner's
        ``inner_steps_sample`` (``False`` for RL², whose trials are the same at every
        count)."""
        return bool(self.learner.inner_steps_sample)

    def close(self) -> None:
        """Closes the collector's simulators."""
        self.collector.close()

    def __call__(self, episodes: Episode, steps: Optional[int] = None) -> Episode:
        learner, collector, sampler = self.learner, self.collector, self.sampler
        if not learner.inner_steps_sample:  # no inner step sees trajectories (RL²)
            steps = 0
        else:
            steps = learner.adapter.steps if steps is None else int(steps)
        supports, queries = [], []
        for i in range(episodes.num_tasks):
            task = episodes.task(i)
            weights, collected = learner.initial_weights(), []
            for k in range(steps):
                seed = tf.random.experimental.stateless_fold_in(
                    tf.cast(task.support_y, tf.int64), tf.constant(k, tf.int64))
                collected.append(sampler.collect(collector, weights, task.support_x, seed))
                weights = self._adapt(task.support_x, tf.nest.map_structure(
                    tf.constant, _stack(collected)), k + 1)
            query = sampler.collect(collector, weights, task.query_x, task.query_y)
            if not collected:  # no inner step: an empty step axis of the query's shapes
                collected = tf.nest.map_structure(
                    lambda t: np.zeros([0, *t.shape], t.dtype), query)
            else:
                collected = _stack(collected)
            supports.append(collected)
            queries.append(query)
        to_tensors = lambda items: tf.nest.map_structure(tf.constant, _stack(items))
        return Episode(episodes.support_x, to_tensors(supports), episodes.query_x,
                       to_tensors(queries))


def collect_episodes(learner: Learner, collector: GymCollector, episodes: Episode,
                     steps: Optional[int] = None, sampler: Optional[PolicySampler] = None
                     ) -> Episode:
    """One call of a :class:`GymCollection` (MAML-RL's data flow outside the step) on
    ``episodes``: their ``support_y`` (``[tasks, steps, n, T, ...]``) and ``query_y``
    (``[tasks, n, T, ...]``) the trajectories collected with ``learner``'s current
    weights, for the meta-step. A loop that collects repeatedly keeps one
    :class:`GymCollection` (its adaptation is compiled once)."""
    return GymCollection(learner, collector, sampler)(episodes, steps)
