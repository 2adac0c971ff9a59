r"""The compiled meta-step, configuration by configuration: one JSON line each.

    python -m benchmarks.meta_step                       # the full grid (~1 hour on 2 cores)
    python -m benchmarks.meta_step --meta_batch=32 --inner_steps=1 --order=second \
        --formulation=map_fn,unrolled --xla=false        # one row of the table

Workload (the issue's reference step): the MAML paper's Omniglot net
(``metalearn.models.omniglot_conv_net``: 4 x [conv 64 stride 2, BatchNorm on batch
statistics, ReLU], mean-pool, linear), 28x28x1, 5-way 1-shot with 15 queries per class,
inner learning rate 0.4, Adam outer update, float32. The images are random (the data do
not change the cost). Each configuration runs in a fresh process, so compile time and
peak memory are its own, and prints:

- ``compile_s``: the first call (tracing, graph optimisation or XLA compilation, and one
  execution) minus one median step;
- ``ms_median``: median wall time of ``--steps`` meta-steps (each ends with a host read
  of the loss, so it waits for the whole step); ``tasks_per_s`` = meta-batch / median;
- ``peak_rss_mib``: the process's peak resident memory (``ru_maxrss``), and
  ``step_rss_mib``: that peak minus the resident memory just before the first step
  (TensorFlow, the model and the data already loaded), i.e. what the step itself adds;
- the memory's breakdown: ``import_rss_mib`` (TensorFlow, Keras and metalearn imported),
  ``before_step_rss_mib`` (plus the model, optimizer slots and data),
  ``first_call_peak_mib`` (the peak up to the end of the first call: tracing, graph
  optimisation, one execution), ``after_first_call_rss_mib`` and ``steady_peak_mib``
  (the peak over the later steps alone: the peak is reset after the first call through
  ``/proc/self/clear_refs``, so this is what the executing step's live tensors reach);
- ``ms_min`` / ``ms_median`` / ``ms_max``: the spread of the timed steps within the run;
  ``cpu_ms_median``: the process's CPU time (user + system, all threads) per step, which
  other jobs on shared cores inflate far less than wall time (it counts spinning
  threads, so it also shows thread pools that busy-wait);
- ``threads`` (intra-op, inter-op pool sizes; ``--intra_op``/``--inter_op``, 0 is
  TensorFlow's default of one thread per core), ``onednn`` (``TF_ENABLE_ONEDNN_OPTS``),
  ``replicas`` (``--replicas=all``: ``MirroredStrategy`` over every GPU);
- ``gflop``: floating-point operations of one meta-step, counted by TensorFlow's profiler
  (``tf.compat.v1.profiler``, ``float_operation``) on the graph of the *unrolled*
  formulation for one task (fully static shapes: forward, inner gradient, second-order
  backward, optimizer update), times the meta-batch. The same count is used for every
  formulation, as they do the same arithmetic; ``gflop_per_s`` = gflop / median.

``--formulation`` names the formulation (``metalearn.execution``: ``map_fn`` is
``MapFn()``, ``unrolled`` ``Unrolled()``, ``batched`` ``Batched()``, ``accumulate``
``Accumulate()``, ``auto`` ``Auto()``); ``recompute`` is ``map_fn``
with ``GradientDescent(wrappers=[Recompute()])`` (inner steps recomputed in the backward
pass), ``accumulate_recompute`` the same with ``accumulate``; ``accumulate_while``,
``map_fn_while`` and ``batched_while`` run the inner steps in a ``tf.while_loop``
(``GradientDescent(wrappers=[WhileLoop()])``).
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys

from absl import app, flags

from benchmarks import rss_mib, time_steps

flags.DEFINE_list("meta_batch", ["8", "32"], "Meta-batch sizes.")
flags.DEFINE_list("inner_steps", ["1", "5"], "Inner steps.")
flags.DEFINE_list("order", ["second", "first"], "Meta-gradient order.")
flags.DEFINE_list("formulation", ["map_fn", "unrolled", "batched"],
                  "Formulation names (metalearn.execution: map_fn, unrolled, batched, "
                  "accumulate, auto), or 'recompute' / 'accumulate_recompute' "
                  "(map_fn / accumulate with recomputed inner steps), 'accumulate_while' / "
                  "'map_fn_while' / 'batched_while' (inner steps in a tf.while_loop).")
flags.DEFINE_list("xla", ["false", "true"], "jit_compile the meta-step.")
flags.DEFINE_integer("steps", 10, "Timed meta-steps (median reported).")
flags.DEFINE_integer("warmup", 2, "Untimed meta-steps after the first (compiling) call.")
flags.DEFINE_integer("timeout", 600, "Seconds per configuration before it is reported "
                     "as timed out.")
flags.DEFINE_string("policy", "float32", "Keras dtype policy, e.g. 'mixed_bfloat16' or "
                    "'mixed_float16' (GPU).")
flags.DEFINE_list("intra_op", ["0"], "Intra-op thread-pool sizes (0: TensorFlow's "
                  "default, one per core).")
flags.DEFINE_list("inter_op", ["0"], "Inter-op thread-pool sizes (0: TensorFlow's default).")
flags.DEFINE_list("onednn", ["default"], "TF_ENABLE_ONEDNN_OPTS for the child: 'default' "
                  "(unset), '0' or '1'.")
flags.DEFINE_list("replicas", ["1"], "'1', or 'all' (MirroredStrategy over every GPU; "
                  "one device where there is one).")
flags.DEFINE_list("parallel_iterations", ["2"], "parallel_iterations of MapFn, Accumulate "
                  "and Auto.")
flags.DEFINE_string("memory_budget", "", "Auto.memory_budget for --formulation=auto "
                    "(e.g. '150MiB'; empty: Auto's default, no budget).")
flags.DEFINE_string("output", "", "Also append the JSON lines to this file.")
flags.DEFINE_string("child", "", "Internal: run one configuration (JSON).")
FLAGS = flags.FLAGS

WAYS, SHOTS, QUERIES, SIZE = 5, 1, 15, 28


def formulation_of(name: str, parallel_iterations: int = 2, memory_budget=None):
    """The formulation object (``metalearn.execution``) a ``--formulation`` name stands
    for, its suffix (``_recompute``, ``_while``) left off; ``parallel_iterations`` and
    ``memory_budget`` go to the formulations that take them."""
    from metalearn import execution
    options = {"map_fn": lambda: execution.MapFn(parallel_iterations),
               "accumulate": lambda: execution.Accumulate(parallel_iterations),
               "auto": lambda: execution.Auto(memory_budget, parallel_iterations)}
    return options[name]() if name in options else execution.formulation(name)


def benchmarked_learner(formulation: str, steps: int, order: str,
                        parallel_iterations: int = 2, memory_budget=None):
    """The benchmarked learner and the formulation that runs it, from a
    ``--formulation`` name."""
    import keras
    import metalearn
    model = metalearn.models.omniglot_conv_net(outputs=WAYS)
    batching, wrappers = formulation, []
    for suffix, wrapper in (("recompute", metalearn.adapters.Recompute),
                            ("while", metalearn.adapters.WhileLoop)):
        if formulation == suffix or formulation.endswith("_" + suffix):
            batching = formulation[:-len(suffix)].rstrip("_") or "map_fn"
            wrappers = [wrapper()]
    adapter = metalearn.adapters.GradientDescent(
        steps=steps, learning_rate=0.4, first_order=order == "first", wrappers=wrappers)
    learner = metalearn.Learner(
        model, adapter, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return learner, formulation_of(batching, parallel_iterations, memory_budget)


def _episodes(tasks: int, seed: int = 0):
    import numpy as np
    import tensorflow as tf
    from metalearn.tasks import Episode
    rng = np.random.default_rng(seed)
    labels = lambda n: tf.constant(np.tile(np.repeat(np.arange(WAYS), n), (tasks, 1)),
                                   tf.int32)
    images = lambda n: tf.constant(rng.random((tasks, WAYS * n, SIZE, SIZE, 1), np.float32))
    return Episode(images(SHOTS), labels(SHOTS), images(QUERIES), labels(QUERIES))


def count_flops(steps: int, order: str, tasks: int = 1) -> float:
    """FLOPs of one meta-step of ``tasks`` tasks, by TensorFlow's profiler on the unrolled
    graph (static shapes)."""
    import keras
    import tensorflow as tf
    import metalearn
    from metalearn.training.step import make_meta_step
    keras.utils.set_random_seed(0)
    learner, formulation = benchmarked_learner("unrolled", steps, order)
    step = make_meta_step(learner, metalearn.MetaGradient(), formulation)
    episodes = _episodes(tasks)
    spec = tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), episodes)
    graph = step.get_concrete_function(spec).graph
    options = tf.compat.v1.profiler.ProfileOptionBuilder.float_operation()
    options["output"] = "none"
    return float(tf.compat.v1.profiler.profile(graph, options=options).total_float_ops)




def _set_threads(tf, config: dict) -> None:
    """Thread pools before TensorFlow's runtime starts (0 = TensorFlow's default: one
    thread per core for each pool)."""
    tf.config.threading.set_intra_op_parallelism_threads(config.get("intra_op", 0))
    tf.config.threading.set_inter_op_parallelism_threads(config.get("inter_op", 0))


def run_one(config: dict) -> dict:
    """Times one configuration in this process."""
    import tensorflow as tf
    _set_threads(tf, config)
    import keras
    import metalearn
    from metalearn.training import distribute
    from metalearn.training.step import make_meta_step
    imported = rss_mib()
    keras.mixed_precision.set_global_policy(config["policy"])
    keras.utils.set_random_seed(0)
    gpus = tf.config.list_physical_devices("GPU")
    strategy = None
    if config.get("replicas", 1) == "all" and len(gpus) > 1:
        strategy = distribute.make_strategy(
            "mirrored", [f"/gpu:{i}" for i in range(len(gpus))])
    with (strategy or tf.distribute.get_strategy()).scope():
        learner, formulation = benchmarked_learner(
            config["formulation"], config["inner_steps"], config["order"],
            config.get("parallel_iterations", 2), config.get("memory_budget") or None)
        rule = metalearn.MetaGradient()
    step = make_meta_step(learner, rule, formulation, jit_compile=config["xla"],
                          strategy=strategy)
    batches = [_episodes(config["meta_batch"], seed) for seed in range(2)]
    if strategy is not None:
        batches = [distribute.split_episodes(strategy, b) for b in batches]
    result = dict(config)
    result.update(time_steps(lambda batch: float(step(batch)["loss"]), batches, FLAGS.steps,
                             FLAGS.warmup, config["meta_batch"], imported))
    result.update(
        replicas=result_replicas(strategy),
        threads=[tf.config.threading.get_intra_op_parallelism_threads(),
                 tf.config.threading.get_inter_op_parallelism_threads()],
        onednn=os.environ.get("TF_ENABLE_ONEDNN_OPTS", "default"),
        resolved=formulation.resolve(learner, _episodes(
            config["meta_batch"] // result_replicas(strategy))).name,
        device="gpu" if gpus else "cpu")
    return result


def result_replicas(strategy) -> int:
    return strategy.num_replicas_in_sync if strategy is not None else 1


def _configs():
    for (batch, steps, order, formulation, xla, intra, inter, onednn, replicas,
         parallel) in itertools.product(
            FLAGS.meta_batch, FLAGS.inner_steps, FLAGS.order, FLAGS.formulation, FLAGS.xla,
            FLAGS.intra_op, FLAGS.inter_op, FLAGS.onednn, FLAGS.replicas,
            FLAGS.parallel_iterations):
        yield dict(meta_batch=int(batch), inner_steps=int(steps), order=order,
                   formulation=formulation, xla=xla.lower() in ("1", "true", "yes"),
                   policy=FLAGS.policy, intra_op=int(intra), inter_op=int(inter),
                   onednn=onednn, replicas="all" if replicas == "all" else int(replicas),
                   parallel_iterations=int(parallel), memory_budget=FLAGS.memory_budget)


def measure(config: dict, steps: int, warmup: int, timeout: float) -> dict:
    """Runs one configuration (a dict as :func:`_configs` gives) in a fresh process and
    returns its JSON result, or the configuration with ``error`` (the last line of its
    stderr, or the timeout)."""
    child = [sys.executable, "-m", "benchmarks.meta_step", "--child", json.dumps(config),
             f"--steps={steps}", f"--warmup={warmup}"]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    if config.get("onednn", "default") != "default":
        env["TF_ENABLE_ONEDNN_OPTS"] = config["onednn"]
    try:
        out = subprocess.run(child, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return dict(config, error=f"timed out after {timeout} s")
    lines = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")]
    if lines:
        return json.loads(lines[-1][len("RESULT "):])
    return dict(config, error=(out.stderr.strip().splitlines() or ["?"])[-1])


def main(argv):
    del argv
    if FLAGS.child:
        print("RESULT " + json.dumps(run_one(json.loads(FLAGS.child))), flush=True)
        return
    flops = {}
    for config in _configs():
        key = (config["inner_steps"], config["order"])
        if key not in flops:  # one task; a fresh process keeps it off the timings
            out = subprocess.run(
                [sys.executable, "-c", "import json,sys; from benchmarks.meta_step import "
                 "count_flops; print('FLOPS', count_flops(%d, %r))" % key],
                capture_output=True, text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
            lines = [l for l in out.stdout.splitlines() if l.startswith("FLOPS ")]
            flops[key] = float(lines[-1].split()[1]) if lines else float("nan")
        result = measure(config, FLAGS.steps, FLAGS.warmup, FLAGS.timeout)
        gflop = flops[key] * config["meta_batch"] / 1e9
        result["gflop"] = round(gflop, 2)
        if "ms_median" in result:
            result["gflop_per_s"] = round(gflop / (result["ms_median"] / 1000), 1)
        line = json.dumps(result)
        print(line, flush=True)
        if FLAGS.output:
            with open(FLAGS.output, "a") as f:
                f.write(line + "\n")


if __name__ == "__main__":
    app.run(main)
