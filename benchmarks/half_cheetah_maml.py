"""MAML with a Python environment (HalfCheetah velocity or direction, MuJoCo): the
trajectories collected outside the step by a Gymnasium vector collector, the meta-step
on the collected episodes (metalearn.rl.gym). The returns before and after one
adaptation step on held-out tasks, before and after meta-training, with 95 % intervals
over the tasks; environment steps per second of the collector.

    python benchmarks/half_cheetah_maml.py --gin_file=experiments/rl/half_cheetah_vel_maml.gin --output=runs/half_cheetah_vel.json
"""

from __future__ import annotations

import json
import os
import time
from typing import Dict, List, Sequence

import numpy as np
import tensorflow as tf
from absl import app, flags

from metalearn.flags import define_gin_flags
from metalearn.rl.gym import GymCollector, PolicySampler, collect_episodes
from metalearn.training import build_experiment, make_meta_step, parse_config

FLAGS = flags.FLAGS


def define_flags() -> None:
    """The script's flags, defined when it runs (not when ``run`` is imported, so that
    an entry point's own flags in the same process do not clash)."""
    define_gin_flags()  # --gin_file, --gin_param: the entry points' own definitions
    flags.DEFINE_integer("eval_tasks", 10, "held-out tasks for the returns")
    flags.DEFINE_string("output", "", "where to write the results (JSON)")


def returns(collected) -> Dict[str, List[float]]:
    """Each task's mean return before (the first inner step's support trajectories) and
    after adaptation (the query trajectories)."""
    total = lambda c: np.sum(c.trajectories.rewards.numpy(), -1).mean(-1)
    result = {"after": total(collected.query_y).tolist()}
    if collected.support_y.weights.shape[1] > 0:
        result["before"] = total(tf.nest.map_structure(lambda t: t[:, 0],
                                                       collected.support_y)).tolist()
    return result


def interval(values: Sequence[float]) -> Dict[str, float]:
    """Mean and 95 % half-width (normal) over tasks."""
    values = np.asarray(values, np.float64)
    return {"mean": float(values.mean()),
            "ci95": float(1.96 * values.std(ddof=1) / np.sqrt(len(values)))}


def run(gin_files: Sequence[str], gin_params: Sequence[str], eval_tasks: int) -> Dict:
    """Meta-trains for ``Loop.num_steps`` and evaluates before and after."""
    parse_config(list(gin_files), list(gin_params))
    experiment = build_experiment()
    learner, environment = experiment.learner, experiment.sampler
    collector = GymCollector(environment)
    sampler = PolicySampler(learner)
    step = make_meta_step(learner, experiment.outer_rule, experiment.formulation,
                          skip_non_finite=True)
    held_out = environment.sample(tf.constant([experiment.seed, 10 ** 6], tf.int64),
                                  eval_tasks, "test")

    def evaluate() -> Dict:
        collected = collect_episodes(learner, collector, held_out, steps=1, sampler=sampler)
        return {k: interval(v) for k, v in returns(collected).items()}

    results = {"before_training": evaluate(), "steps": []}
    start, taken = time.time(), collector.steps_taken
    collect_time = 0.0
    for k in range(experiment.loop.num_steps):
        episodes = environment.sample(tf.constant([experiment.seed, k], tf.int64),
                                      experiment.meta_batch_size)
        t = time.time()
        collected = collect_episodes(learner, collector, episodes, sampler=sampler)
        collect_time += time.time() - t
        metrics = step(collected)
        train = {name: float(np.mean(v)) for name, v in returns(collected).items()}
        results["steps"].append({"step": k + 1, **train,
                                 "loss": float(metrics["loss"])})
        print(f"step {k + 1}: return before {train.get('before', float('nan')):.1f}, "
              f"after {train['after']:.1f} ({time.time() - start:.0f} s)", flush=True)
    results["env_steps_per_second"] = (collector.steps_taken - taken) / collect_time
    results["seconds"] = time.time() - start
    results["after_training"] = evaluate()
    collector.close()
    return results


def main(argv):
    del argv
    results = run(FLAGS.gin_file, FLAGS.gin_param, FLAGS.eval_tasks)
    print(json.dumps({k: v for k, v in results.items() if k != "steps"}, indent=1))
    if FLAGS.output:
        os.makedirs(os.path.dirname(os.path.abspath(FLAGS.output)), exist_ok=True)
        with open(FLAGS.output, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    define_flags()
    app.run(main)
