"""What iMAML's inner solve meets on real tasks: the inner fit and the linear system.

For a run's checkpoint (or the initial weights of a gin config), on a few training
tasks, prints per task and as medians:

- the inner fit: support loss at theta and at phi (after the inner steps), ||phi - theta||,
  and how far phi is from the proximal optimum, ``||F(phi)|| / ||F(theta)||`` with
  ``F(phi) = grad L_support(phi) + lambda (phi - theta)`` (0 at the optimum the implicit
  gradient assumes);
- the system ``(H + lambda I) u = grad L_query(phi)`` solved by the run's conjugate
  gradient: its diagnostics (relative residual, positive definite along the path, the
  smallest curvature ``p^T A p / p^T p``), and the direction's cosine with a 100-step solve;
- the extreme eigenvalues of the support Hessian ``H`` at phi (power iterations);
- the cosine between the implicit meta-gradient and the derivative of the very inner
  loop the run uses (its own inner solve, differentiated), i.e. how well the implicit
  gradient describes what the inner loop does.

  PYTHONPATH=. python benchmarks/imaml_diagnostics.py --workdir=runs/omniglot_min_imaml_5w1s
  PYTHONPATH=. python benchmarks/imaml_diagnostics.py \
      --gin_file=experiments/omniglot/minimal/imaml_5way_1shot.gin   # the initial weights
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from absl import app, flags

from metalearn.pieces.implicit_diff import ConjugateGradient, dot
from metalearn.runs.experiment import build_experiment, parse_config
from metalearn.runs.files import write_json_results
from metalearn.training.checkpoint import restore

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "a run's workdir (its newest checkpoint)")
flags.DEFINE_string("checkpoint", None, "a specific checkpoint of --workdir")
flags.DEFINE_multi_string("gin_file", [], "without --workdir: a config, at its initial weights")
flags.DEFINE_multi_string("gin_param", [], "extra bindings")
flags.DEFINE_integer("tasks", 6, "training tasks measured")
flags.DEFINE_integer("power_steps", 30, "power iterations per extreme eigenvalue")
flags.DEFINE_string("output", None, "write the per-task figures as JSON here")


def _cosine(a, b):
    return float(dot(a, b) / (tf.sqrt(dot(a, a) * dot(b, b)) + 1e-30))


def _norm(a):
    return float(tf.sqrt(dot(a, a)))


def _extreme_eigenvalues(hvp, like, steps):
    """(largest, smallest) eigenvalue of the symmetric map ``hvp`` by two power runs."""
    def power(apply):
        v = [tf.random.stateless_normal(t.shape, (1, 2), dtype=t.dtype) for t in like]
        value = 0.0
        for _ in range(steps):
            scale = tf.sqrt(dot(v, v))
            v = [t / scale for t in v]
            w = apply(v)
            value = float(dot(v, w))
            v = w
        return value
    top = power(hvp)  # the eigenvalue of largest magnitude
    shifted = power(lambda v: [abs(top) * t - h for t, h in zip(v, hvp(v))])
    other = abs(top) - shifted
    return max(top, other), min(top, other)


def task_figures(learner, episode, power_steps):
    adapter = learner.adapter
    lam = adapter.regularization
    support_x, support_y, query_x, query_y = learner.split(episode)
    weights = learner.task_initial_weights(learner.initial_weights(), support_x, support_y)
    paths = list(weights)
    theta = [tf.convert_to_tensor(weights[p]) for p in paths]

    def support_loss(values):
        return learner.support_loss(dict(zip(paths, values)), support_x, support_y)

    def gradient(fn, values):
        with tf.GradientTape() as tape:
            tape.watch(values)
            loss = fn(values)
        return loss, tape.gradient(loss, values)

    def hvp(at, v):
        with tf.GradientTape() as outer:
            outer.watch(at)
            _, g = gradient(support_loss, at)
        return outer.gradient(g, at, output_gradients=v)

    def query_loss(values):
        return learner.task_loss(query_y, learner.predict(dict(zip(paths, values)), query_x))

    loss_theta, grad_theta = gradient(support_loss, theta)
    adapted = adapter.adapt(dict(zip(paths, theta)), support_x, support_y, learner.support_loss)
    phi = [tf.convert_to_tensor(adapted[p]) for p in paths]
    loss_phi, grad_phi = gradient(support_loss, phi)
    optimality = [g + lam * (x - t) for g, x, t in zip(grad_phi, phi, theta)]
    query, grad_query = gradient(query_loss, phi)
    system = lambda v: [h + lam * t for h, t in zip(hvp(phi, v), v)]
    solver = ConjugateGradient(adapter.cg_steps, **({"damping": adapter.damping}
                                                    if getattr(adapter, "damping", 0) else {}))
    u, info = solver.solve(system, grad_query)
    reference, reference_info = ConjugateGradient(100, tolerance=1e-6).solve(system, grad_query)
    implicit = [lam * t for t in u]
    top, bottom = _extreme_eigenvalues(lambda v: hvp(phi, v), phi, power_steps)

    # The derivative of the inner loop as the run computes it: the adapter's own inner
    # solve (a GradientDescent of pieces, the proximal term included), differentiated.
    with tf.GradientTape() as tape:
        tape.watch(theta)
        x = adapter.inner.adapt(dict(zip(paths, theta)), support_x, support_y,
                                learner.support_loss)
        unrolled_query = query_loss([x[p] for p in paths])
    unrolled_grad = tape.gradient(unrolled_query, theta)
    accuracy = float(tf.reduce_mean(tf.cast(tf.equal(
        tf.argmax(learner.predict(adapted, query_x), -1, output_type=tf.int64),
        tf.cast(tf.reshape(query_y, [-1]), tf.int64)), tf.float32)))
    return {
        "support_loss_theta": float(loss_theta), "support_loss_phi": float(loss_phi),
        "query_loss_phi": float(query), "query_accuracy": accuracy,
        "distance": _norm([x - t for x, t in zip(phi, theta)]),
        "optimality": _norm(optimality) / _norm(grad_theta),
        "cg_residual": float(info["residual"]),
        "cg_positive_definite": float(info["positive_definite"]),
        "cg_min_curvature": float(info["min_curvature"]),
        "cg_cosine_to_100_steps": _cosine(u, reference),
        "reference_residual": float(reference_info["residual"]),
        "reference_positive_definite": float(reference_info["positive_definite"]),
        "reference_min_curvature": float(reference_info["min_curvature"]),
        "hessian_max": top, "hessian_min": bottom,
        "cosine_implicit_vs_unrolled": _cosine(implicit, unrolled_grad),
        "norm_ratio_implicit_to_unrolled": _norm(implicit) / (_norm(unrolled_grad) + 1e-30),
    }


def main(argv):
    del argv
    if FLAGS.workdir:
        experiment = restore(FLAGS.workdir, gin_params=FLAGS.gin_param,
                             checkpoint=FLAGS.checkpoint)
    else:
        parse_config(FLAGS.gin_file, FLAGS.gin_param)
        experiment = build_experiment()
    learner = experiment.learner
    step = int(learner.meta_step.numpy())
    batch = next(iter(experiment.sampler.dataset(FLAGS.tasks, seed=12345, split="train",
                                                 num_steps=1)))
    rows = [task_figures(learner, batch.task(i), FLAGS.power_steps)
            for i in range(FLAGS.tasks)]
    medians = {k: float(np.median([r[k] for r in rows])) for k in rows[0]}
    for k in rows[0]:
        values = " ".join(f"{r[k]:.3g}" for r in rows)
        print(f"step {step}  {k:32s} median {medians[k]:10.4g}   tasks: {values}")
    if FLAGS.output:  # the figures are printed above: a failed write names the file
        write_json_results(FLAGS.output, {"step": step, "medians": medians, "tasks": rows},
                           None, "iMAML diagnostics")


if __name__ == "__main__":
    app.run(main)
