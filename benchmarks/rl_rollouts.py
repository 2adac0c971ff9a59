r"""Environment steps per second: the in-graph 2D navigation rollouts, and (with
``--collector``) the Gymnasium collector against its number of worker processes.

    PYTHONPATH=. python benchmarks/rl_rollouts.py
    PYTHONPATH=. python benchmarks/rl_rollouts.py --collector --workers=1,2,4 --rounds=3

``metalearn.rl.rollout`` of ``PointNavigation`` (horizon 100) with the MAML paper's
policy (2-100-100-2 ReLU and a learned log std, ``gaussian_policy``), as one compiled
``tf.function``, with and without XLA: 20 rollouts of one task (what ``PolicyLearner``
samples per task and inner step) and 400 rollouts of 400 goals at once (20 tasks x 20,
the environment broadcasting per-rollout goals). Prints one JSON line.

``--collector``: ``GymCollector(environment, rollouts, workers=w).collect`` for each
``w`` of ``--workers`` (1: the copies stepped in this process), on HalfCheetah velocity
(MuJoCo, horizon 200) and Pendulum with a gravity per task (horizon 200), each with two
policies: ``policy``, the learner's (the configs' MLP and a learned log std, sampled by
one compiled call per environment step, as training collects) and ``numpy``, fixed
torques from NumPy (the simulators and the processes alone). Each figure is the median
over ``--rounds`` rounds (the worker counts alternate within a round) of
``--repeats`` collections of one task after one untimed collection; the workers'
start-up is timed apart. The trajectories of every worker count are checked equal to
the first's. Prints one JSON line.

``--ray_workers=2,4``: also each count as Ray actors (``GymCollector(ray_address=...)``)
on one local Ray instance started before the rounds (its own start-up not timed; the
actors' is), under the keys ``ray:2``, ``ray:4``; each actor reserves
``--ray_cpus_per_worker`` CPUs (default 0.5: four actors fit a 2-core instance).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Callable, Dict, Sequence

import keras
import numpy as np
import tensorflow as tf

import metalearn  # noqa: F401
from metalearn import functional, models
from metalearn.rl import Gaussian, PointNavigation, gaussian_policy, rollout


def measure(num: int, jit_compile: bool, repeats: int = 10) -> float:
    """Environment steps per second of ``num`` rollouts at once."""
    keras.utils.set_random_seed(0)
    model = gaussian_policy(models.mlp((2,), hidden=(100, 100), outputs=2))
    environment, distribution = PointNavigation(), Gaussian()
    weights = functional.weights(model)
    policy = lambda obs, seed: distribution.sample(functional.call(model, weights, obs), seed)
    goals = tf.random.stateless_uniform([num, 2], [0, 0], -0.5, 0.5)
    run = tf.function(lambda seed: rollout(environment, goals, policy, num, seed).rewards,
                      jit_compile=jit_compile)
    run(tf.constant([0, 0], tf.int64)).numpy()  # trace and compile
    start = time.perf_counter()
    for i in range(repeats):
        run(tf.constant([i, 1], tf.int64)).numpy()
    return num * environment.horizon * repeats / (time.perf_counter() - start)


def _policies(environment, hidden: Sequence[int]) -> Dict[str, Callable]:
    """The learner's sampled policy (compiled, one call per environment step) and fixed
    NumPy torques, for ``environment``."""
    from metalearn.adapters import GradientDescent
    from metalearn.rl import DiCE, PolicyLearner, PolicySampler, Rollouts
    keras.utils.set_random_seed(0)
    model = gaussian_policy(models.mlp((environment.observation_size,), hidden=hidden,
                                       outputs=environment.action_size))
    learner = PolicyLearner(model, environment,
                            GradientDescent(1, 0.1, wrappers=[Rollouts()]), estimator=DiCE())
    torques = np.linspace(-1, 1, environment.action_size, dtype=np.float32)

    def numpy_policy(observations, seed):
        n = len(observations)
        return np.tile(torques, (n, 1)), np.zeros([n], np.float32)
    return {"policy": PolicySampler(learner)(learner.initial_weights()),
            "numpy": numpy_policy}


def collector_rates(environment, task, hidden: Sequence[int], rollouts: int,
                    workers: Sequence[str], rounds: int, repeats: int,
                    ray_cpus: float = 0.5) -> Dict[str, dict]:
    """Per policy and worker count (``"2"``: processes; ``"ray:2"``: Ray actors on the
    Ray instance this process joined): the median environment steps per second and the
    seconds the collector took to start (its simulators, its worker processes)."""
    from metalearn.rl import GymCollector
    steps = rollouts * environment.horizon * repeats
    results = {}
    for name, policy in _policies(environment, hidden).items():
        rates = {w: [] for w in workers}
        starts = {w: [] for w in workers}
        first = None
        for _ in range(rounds):
            for w in workers:
                begin = time.perf_counter()
                count = int(w.split(":")[-1])
                collector = GymCollector(environment, rollouts=rollouts, workers=count,
                                         ray_address="auto" if w.startswith("ray:") else None,
                                         ray_cpus_per_worker=ray_cpus)
                starts[w].append(time.perf_counter() - begin)
                try:
                    run = collector.collect(policy, task, [0, 1])  # untimed
                    if first is None:
                        first = run
                    for x, y in zip(first.trajectories, run.trajectories):
                        assert np.array_equal(x, y), f"{w} workers collected other data"
                    begin = time.perf_counter()
                    for i in range(repeats):
                        collector.collect(policy, task, [0, 1])
                    rates[w].append(steps / (time.perf_counter() - begin))
                finally:
                    collector.close()
        results[name] = {str(w): {"env_steps_per_second": round(statistics.median(rates[w])),
                                  "each_round": [round(r) for r in rates[w]],
                                  "start_seconds": round(statistics.median(starts[w]), 3)}
                         for w in workers}
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--collector", action="store_true",
                        help="the Gymnasium collector against its worker processes")
    parser.add_argument("--workers", default="1,2,4", help="worker counts, comma-separated")
    parser.add_argument("--ray_workers", default="",
                        help="Ray actor counts, comma-separated (a local instance)")
    parser.add_argument("--ray_cpus_per_worker", type=float, default=0.5)
    parser.add_argument("--rollouts", type=int, default=20, help="copies per collection")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    if not args.collector:
        results = {f"{num}_rollouts{'_xla' if xla else ''}": round(measure(num, xla))
                   for num in (20, 400) for xla in (False, True)}
        print(json.dumps({"env_steps_per_second": results}))
        return
    from metalearn.rl import HalfCheetahVelocity, PendulumGravity
    workers = [str(int(w)) for w in args.workers.split(",")]
    if args.ray_workers:
        from metalearn import _ray
        _ray.connect("local", "--ray_workers")
        workers += [f"ray:{int(w)}" for w in args.ray_workers.split(",")]
    cases = {"HalfCheetahVelocity": (HalfCheetahVelocity(horizon=200), np.float32(1.0),
                                     (100, 100)),
             "PendulumGravity": (PendulumGravity(horizon=200), np.float32(12.0), (64, 64))}
    results = {name: collector_rates(environment, task, hidden, args.rollouts, workers,
                                     args.rounds, args.repeats, args.ray_cpus_per_worker)
               for name, (environment, task, hidden) in cases.items()}
    print(json.dumps({"rollouts": args.rollouts, "rounds": args.rounds,
                      "repeats": args.repeats, "collector": results}))


if __name__ == "__main__":
    main()
