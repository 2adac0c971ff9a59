r"""Tasks/s of the distributed meta-step with 1 and 2 replicas on this machine.

    python -m benchmarks.distribute --replicas=1,2 --workload=sinusoid,conv

Each configuration runs in a fresh process (logical devices must be set before
TensorFlow starts) and prints one JSON line: workload, replicas, meta-batch, median ms
per meta-step over --steps steps after --warmup, tasks/s. On a CPU, replicas are logical
devices sharing the same cores and thread pools, so this measures the overhead of the
replicated step and all-reduce, not a speed-up; on GPUs each replica is a device.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from absl import app, flags

flags.DEFINE_list("replicas", ["1", "2"], "Replica counts to measure.")
flags.DEFINE_list("workload", ["sinusoid", "conv"], "sinusoid: MAML paper's MLP, "
                  "meta-batch 24; conv: the Omniglot conv net, 5-way 1-shot, 15 queries, "
                  "meta-batch 8, one inner step, second order.")
flags.DEFINE_integer("steps", 20, "Timed meta-steps.")
flags.DEFINE_integer("warmup", 3, "Untimed meta-steps (compilation).")
flags.DEFINE_string("devices", "cpu", "'cpu' (logical CPU devices) or 'gpu'.")
flags.DEFINE_integer("child", 0, "Internal: run one configuration with this many replicas.")
flags.DEFINE_string("child_workload", "", "Internal.")
FLAGS = flags.FLAGS


def _run_one(replicas: int, workload: str) -> dict:
    import tensorflow as tf
    if FLAGS.devices == "cpu":
        tf.config.set_logical_device_configuration(
            tf.config.list_physical_devices("CPU")[0],
            [tf.config.LogicalDeviceConfiguration()] * max(replicas, 1))
    import keras
    import metalearn
    from metalearn.training import distribute
    from metalearn.training import step as step_builder
    device = "/cpu" if FLAGS.devices == "cpu" else "/gpu"
    strategy = tf.distribute.get_strategy() if replicas == 1 and FLAGS.devices == "cpu" \
        else distribute.make_strategy("mirrored", [f"{device}:{i}" for i in range(replicas)])
    keras.utils.set_random_seed(0)
    with strategy.scope():
        if workload == "sinusoid":
            model, batch = metalearn.models.mlp(), 24
            loss, rate = "mse", 0.01
            sampler = metalearn.tasks.Sinusoid()
        else:
            model, batch = metalearn.models.omniglot_conv_net(), 8
            loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
            rate = 0.4
            sampler = _SyntheticImages()
        learner = metalearn.Learner(model, metalearn.adapters.GradientDescent(1, rate),
                                    loss=loss)
        rule = metalearn.MetaGradient()
    step = step_builder.make_distributed_meta_step(strategy, learner, rule)
    stream = iter(distribute.episode_stream(strategy, sampler, batch, seed=0))
    for _ in range(FLAGS.warmup):
        float(step(next(stream))["loss"])
    times = []
    for _ in range(FLAGS.steps):
        episodes = next(stream)
        start = time.perf_counter()
        float(step(episodes)["loss"])
        times.append(time.perf_counter() - start)
    times.sort()
    median = times[len(times) // 2]
    return {"workload": workload, "replicas": replicas, "meta_batch": batch,
            "devices": FLAGS.devices, "ms_per_step": round(1000 * median, 2),
            "tasks_per_second": round(batch / median, 1)}


class _SyntheticImages:
    """5-way 1-shot episodes of random 28x28 images (the data do not change the cost)."""

    def dataset(self, num_tasks, seed=0, split="train", start_step=0, num_steps=None,
                streams=(0,), num_streams=1):
        import tensorflow as tf
        from metalearn.tasks import Episode
        labels = lambda n: tf.tile(tf.range(5)[None], [num_tasks, n])
        episode = Episode(tf.random.normal([num_tasks, 5, 28, 28, 1]), labels(1),
                          tf.random.normal([num_tasks, 75, 28, 28, 1]), labels(15))
        return tf.data.Dataset.from_tensors(episode).repeat()


def main(argv) -> None:
    del argv
    if FLAGS.child:
        print(json.dumps(_run_one(FLAGS.child, FLAGS.child_workload)), flush=True)
        return
    for workload in FLAGS.workload:
        for replicas in FLAGS.replicas:
            out = subprocess.run(
                [sys.executable, "-m", "benchmarks.distribute", f"--child={replicas}",
                 f"--child_workload={workload}", f"--steps={FLAGS.steps}",
                 f"--warmup={FLAGS.warmup}", f"--devices={FLAGS.devices}"],
                check=True, capture_output=True, text=True,
                env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
            print(out.stdout.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    app.run(main)
