"""Implicit MAML: the meta-gradient equals the exact implicit gradient on a quadratic task,
where the regularised inner optimum and its derivative have closed forms."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import metalearn
from metalearn import execution, models
from metalearn.adapters import ImplicitGradientDescent
from metalearn.adapters.implicit import CURVATURES, conjugate_gradient
from metalearn.testing import LearnerContract, classification_learner
from metalearn.testing import regression_episodes, mse
from metalearn.testing import finite_difference_gradient, relative_error
from metalearn.repository import ROOT

LAMBDA = 1.0


def _linear_learner(steps=250, cg_steps=3, learning_rate=0.12, clip_norm=None):
    keras.utils.set_random_seed(5)
    model = models.mlp((2,), hidden=(), outputs=1, dtype="float64")
    adapter = ImplicitGradientDescent(steps=steps, learning_rate=learning_rate,
                                      regularization=LAMBDA, cg_steps=cg_steps,
                                      clip_norm=clip_norm)
    return metalearn.Learner(model, adapter, loss=mse)


def _adapted(learner, task):
    """One task's adapted weights, compiled: eagerly, the inner steps' tf.while_loop runs
    step by step at several times the cost (the weights are the same)."""
    return tf.function(lambda x, y: learner.adapt(x, y).weights)(task.support_x,
                                                                  task.support_y)


def _closed_form(theta, episodes):
    """phi* and the exact meta-gradient d mean_i L_query(phi*_i) / d theta (theta = [w; b])."""
    augment = lambda x: np.concatenate([x, np.ones((len(x), 1))], axis=1)
    phis, grads = [], []
    for i in range(episodes.num_tasks):
        xs, ys = augment(episodes.support_x[i].numpy()), episodes.support_y[i].numpy()
        xq, yq = augment(episodes.query_x[i].numpy()), episodes.query_y[i].numpy()
        hessian = 2 * xs.T @ xs / len(xs)
        system = hessian + LAMBDA * np.eye(3)
        phi = np.linalg.solve(system, LAMBDA * theta + 2 * xs.T @ ys / len(xs))
        query_grad = 2 * xq.T @ (xq @ phi - yq) / len(xq)
        grads.append(LAMBDA * np.linalg.solve(system, query_grad))  # (I + H/lam)^-1 g
        phis.append(phi)
    return phis, np.mean(grads, axis=0)


@pytest.mark.parametrize("task_batching,clip_norm",
                         [("map_fn", None), ("unrolled", None), ("unrolled", 0.05)])
def test_meta_gradient_equals_exact_implicit_gradient(task_batching, clip_norm):
    # clip_norm=0.05 clips the first inner steps (another trajectory, the same optimum):
    # the implicit meta-gradient depends only on the point reached.
    learner = _linear_learner(clip_norm=clip_norm, steps=250 if clip_norm is None else 600)
    formulation = execution.formulation(task_batching)
    episodes = regression_episodes(tasks=3, shots=5)
    w, b = learner.meta_variables

    def meta_gradient(batch):
        with tf.GradientTape() as tape:
            loss = learner.meta_loss(batch, formulation=formulation)
        return tape.gradient(loss, learner.meta_variables)

    grad_w, grad_b = tf.function(meta_gradient)(episodes)
    theta = np.concatenate([w.numpy(), b.numpy()[None]], axis=0)  # [3, 1]
    phis, expected = _closed_form(theta, episodes)
    np.testing.assert_allclose(np.concatenate([grad_w, grad_b[None]]), expected, rtol=1e-8)
    fast = _adapted(learner, episodes.task(0))
    np.testing.assert_allclose(
        np.concatenate([fast["mlp/head/kernel"], fast["mlp/head/bias"][None]]), phis[0],
        rtol=1e-9)


def test_meta_gradient_on_a_nonlinear_net_equals_finite_differences():
    # Beyond the quadratic: a tanh MLP, whose support loss has a Hessian that changes with
    # the weights. With the inner loop run to the regularised optimum and conjugate
    # gradient run to convergence, the implicit meta-gradient is the exact derivative of
    # the query loss at phi*(theta), which central differences of the meta-loss measure.
    keras.utils.set_random_seed(3)
    model = models.mlp((2,), hidden=(4,), outputs=1, activation="tanh", dtype="float64")
    # (100 steps reach the regularised optimum here: short of it, the implicit gradient
    # would miss the differences of the meta-loss the steps compute; 30 steps miss them
    # by 8e-4. Conjugate gradient on the 17 unknowns converges within its 20 steps; 5
    # stop 9e-3 short. The meta-gradient is taken eagerly: compiling the 100 steps and
    # the solve's backward costs more than running them; the differences are compiled.)
    adapter = ImplicitGradientDescent(steps=100, learning_rate=0.3, regularization=1.0,
                                      cg_steps=20)
    learner = metalearn.Learner(model, adapter, loss=mse)
    episodes = regression_episodes(tasks=2, shots=5)

    with tf.GradientTape() as tape:
        loss = learner.meta_loss(episodes)
    gradient = tape.gradient(loss, learner.meta_variables)
    analytic = {v.path: g.numpy() for v, g in zip(learner.meta_variables, gradient)}
    numeric = finite_difference_gradient(lambda w: learner.meta_loss(episodes, weights=w),
                                         learner.initial_weights())
    assert relative_error(analytic, numeric) < 1e-6


def test_conjugate_gradient_solves_a_small_system():
    rng = np.random.default_rng(0)
    m = rng.normal(size=(4, 4))
    a = m @ m.T + 4 * np.eye(4)
    b = rng.normal(size=(4,))
    x = conjugate_gradient(lambda v: [tf.linalg.matvec(a, v[0])], [tf.constant(b)], 4)[0]
    np.testing.assert_allclose(x, np.linalg.solve(a, b), rtol=1e-10)


def test_differs_from_unrolled_maml_and_uses_proximal_term():
    learner = _linear_learner()
    task = regression_episodes(shots=5).task(0)
    start = learner.initial_weights()
    near = _adapted(learner, task)
    learner.adapter.regularization = 1e-3  # weak prox: phi moves further from theta
    far = _adapted(learner, task)  # traced anew: it reads the regularization then
    distance = lambda fast: np.sqrt(sum(np.sum((fast[p] - start[p]) ** 2) for p in start))
    assert distance(far) > 1.5 * distance(near)


def test_clipping_keeps_an_unstable_inner_loop_finite():
    # learning_rate 1.5 is above 2 / (largest curvature + lambda) for these tasks: plain
    # gradient descent blows up; clipped, every step is at most 1.5 * clip_norm long.
    task = regression_episodes(shots=5).task(0)
    blown = _adapted(_linear_learner(steps=200, learning_rate=1.5), task)
    assert not all(np.all(np.abs(w) < 1e6) for w in blown.values())
    learner = _linear_learner(steps=200, learning_rate=1.5, clip_norm=1.0)
    start = learner.initial_weights()
    clipped = _adapted(learner, task)
    distance = np.sqrt(sum(np.sum((clipped[p] - start[p]) ** 2) for p in start))
    assert np.isfinite(distance) and distance <= 200 * 1.5 * 1.0


def test_clipping_applies_to_the_whole_update():
    # A first step from theta (no proximal term yet) is -lr * clip(g): its norm is
    # lr * min(||g||, clip_norm).
    task = regression_episodes(shots=5).task(0)
    learner = _linear_learner(steps=1, learning_rate=0.1, clip_norm=1e-3)
    start = learner.initial_weights()
    moved = learner.adapt(task.support_x, task.support_y).weights
    distance = np.sqrt(sum(np.sum((moved[p] - start[p]) ** 2) for p in start))
    np.testing.assert_allclose(distance, 0.1 * 1e-3, rtol=1e-9)


def test_bad_arguments():
    with pytest.raises(ValueError, match=r"ImplicitGradientDescent.regularization must be > 0, got 0"):
        ImplicitGradientDescent(regularization=0)
    with pytest.raises(ValueError, match="ImplicitGradientDescent.cg_steps must be a whole number >= 1, got 0"):
        ImplicitGradientDescent(cg_steps=0)
    with pytest.raises(ValueError, match=r"ImplicitGradientDescent.clip_norm must be > 0, got -1"):
        ImplicitGradientDescent(clip_norm=-1)


class TestImplicitMAML(LearnerContract):
    covers = (metalearn.adapters.ImplicitGradientDescent,)

    def make_learner(self):
        return classification_learner(ImplicitGradientDescent(
            steps=3, learning_rate=0.1, regularization=1.0, cg_steps=2))


SOLVE = ("cg_residual", "cg_iterations", "cg_positive_definite", "cg_min_curvature")
INNER = ("inner_support_loss", "inner_distance", "inner_optimality")


def test_training_reports_the_inner_fit_and_the_solve(tmp_path):
    """A few sinusoid steps: the inner fit and the backward solve's diagnostics reach
    metrics.json through the training loop; evaluation reports the inner fit."""
    import json
    import os
    from metalearn.training import build_experiment, evaluate, parse_config, train
    root = ROOT
    parse_config([os.path.join(root, "experiments", "sinusoid", "imaml.gin")],
                 ["Loop.num_steps = 4", "Loop.log_every = 2",
                  "Experiment.meta_batch_size = 3", "mlp.hidden = (8,)",
                  "ImplicitGradientDescent.steps = 3", "evaluate.num_tasks = 4",
                  "evaluate.batch_size = 2"])
    experiment = build_experiment()
    train(experiment, str(tmp_path))
    with open(tmp_path / "metrics.json") as f:
        metrics = json.load(f)
    for name in SOLVE + INNER:
        assert np.isfinite(metrics[name]), name
    assert metrics["cg_iterations"] == 5.0 and 0 <= metrics["cg_positive_definite"] <= 1
    assert 0 < metrics["inner_optimality"] < 1 and metrics["inner_distance"] > 0
    report = evaluate(experiment.learner, experiment.sampler, inner_steps=(3,))["results"]["3"]
    assert set(INNER) <= set(report) and not set(SOLVE) & set(report)


@pytest.mark.parametrize("task_batching", ["unrolled", "accumulate"])
def test_solve_diagnostics_are_those_of_each_task(task_batching):
    """The meta-step's cg_* metrics equal each task's own solve, by hand (mean over
    tasks, whatever the formulation), and inner_* are the support loss at phi etc."""
    from metalearn.pieces.implicit_diff import ConjugateGradient
    learner = _linear_learner(steps=250, cg_steps=2)
    episodes = regression_episodes(tasks=3, shots=5)
    gradients, metrics = tf.function(metalearn.MetaGradient().directions)(
        learner, episodes, execution.formulation(task_batching))
    measure = tf.function(lambda task: learner.adapter.adapt_and_measure(
        learner.initial_weights(), task.support_x, task.support_y, learner.support_loss))
    expected = []
    for i in range(3):
        task = episodes.task(i)
        fast, inner = measure(task)
        np.testing.assert_allclose(inner["inner_support_loss"], learner.support_loss(
            fast, task.support_x, task.support_y), rtol=1e-12)
        assert inner["inner_optimality"] < 1e-6  # 250 steps reach the proximal optimum
        paths = list(fast)
        phi = [fast[p] for p in paths]

        def system(v):
            with tf.GradientTape() as outer:
                outer.watch(phi)
                with tf.GradientTape() as inner_tape:
                    inner_tape.watch(phi)
                    loss = learner.support_loss(dict(zip(paths, phi)), task.support_x,
                                                task.support_y)
                g = inner_tape.gradient(loss, phi)
            return [h + LAMBDA * t for h, t in zip(outer.gradient(g, phi, output_gradients=v), v)]

        with tf.GradientTape() as tape:
            tape.watch(phi)
            query = learner.task_loss(task.query_y,
                                      learner.predict(dict(zip(paths, phi)), task.query_x))
        rhs = [g / 3 for g in tape.gradient(query, phi)]  # the mean over 3 tasks' upstream
        expected.append(ConjugateGradient(2).solve(system, rhs)[1])
    for name in SOLVE:
        values = [float(e[name.split("_", 1)[1]]) for e in expected]
        target = [np.mean(values)] * 3
        np.testing.assert_allclose(metrics[name], target, rtol=1e-7, atol=1e-12)



# --- Gauss-Newton curvature ----------------------------------------------------------

def _tanh_classifier(curvature="gauss_newton", regularization=0.05, steps=0, cg_steps=4):
    from metalearn.testing import softmax_cross_entropy, synthetic_classification
    keras.utils.set_random_seed(11)
    model = models.mlp((4,), hidden=(5,), outputs=3, activation="tanh", dtype="float64")
    adapter = ImplicitGradientDescent(steps=steps, learning_rate=0.1,
                                      regularization=regularization, cg_steps=cg_steps,
                                      curvature=curvature)
    learner = metalearn.Learner(model, adapter, loss=softmax_cross_entropy)
    episodes = synthetic_classification(seed=2, tasks=3, ways=3, shots=2, queries=2, dim=4,
                                        dtype=tf.float64)
    return learner, episodes


def _explicit_curvatures(learner, task):
    """The support loss's Hessian and Gauss-Newton matrix J^T H_out J in the flattened
    weights, from full Jacobians (an independent reference)."""
    from metalearn.testing import flat
    weights = learner.initial_weights()
    paths = list(weights)
    shapes = [weights[p].shape for p in paths]
    sizes = [int(np.prod(s)) for s in shapes]
    unflatten = lambda v: dict(zip(paths, [tf.reshape(t, s) for t, s in
                                           zip(tf.split(v, sizes), shapes)]))
    vector = tf.constant(flat([weights[p] for p in paths]))
    objective = metalearn.learners.support_objective(learner)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(vector)
        with tf.GradientTape() as inner:
            inner.watch(vector)
            outputs = objective.outputs(unflatten(vector), task.support_x, task.support_y)
            loss = objective.loss(task.support_y, outputs)
        grad = inner.gradient(loss, vector)
    hessian = tape.jacobian(grad, vector).numpy()
    jacobian = tape.jacobian(outputs, vector).numpy().reshape(-1, vector.shape[0])
    out = tf.constant(outputs.numpy())
    with tf.GradientTape() as outer:
        outer.watch(out)
        with tf.GradientTape() as inner:
            inner.watch(out)
            out_loss = objective.loss(task.support_y, out)
        out_grad = tf.reshape(inner.gradient(out_loss, out), [-1])
    h_out = outer.jacobian(out_grad, out).numpy().reshape(out_grad.shape[0], -1)
    return weights, unflatten, hessian, jacobian.T @ h_out @ jacobian


def test_gauss_newton_product_equals_explicit_jacobians():
    from metalearn.adapters.implicit import gauss_newton_product
    from metalearn.testing import flat
    learner, episodes = _tanh_classifier()
    task = episodes.task(0)
    weights, unflatten, hessian, gauss_newton = _explicit_curvatures(learner, task)
    v = np.random.default_rng(0).normal(size=gauss_newton.shape[0])
    product = gauss_newton_product(metalearn.learners.support_objective(learner), weights,
                                   task.support_x, task.support_y, unflatten(tf.constant(v)))
    np.testing.assert_allclose(flat([product[p] for p in weights]), gauss_newton @ v,
                               rtol=1e-10, atol=1e-14)
    # What makes it the remedy: at this point (a tanh net at its initialisation, not a
    # minimum) the Hessian is indefinite and the Gauss-Newton matrix is not.
    assert np.linalg.eigvalsh(hessian).min() < -1e-3
    assert np.linalg.eigvalsh(gauss_newton).min() > -1e-12


@pytest.mark.parametrize("task_batching", ["unrolled", "accumulate"])
def test_gauss_newton_on_a_linear_model_equals_the_exact_implicit_gradient(task_batching):
    # Outputs linear in the weights and a squared error: J^T H_out J is the Hessian, so
    # the meta-gradient is the closed form's (also when accumulated task by task).
    keras.utils.set_random_seed(5)
    model = models.mlp((2,), hidden=(), outputs=1, dtype="float64")
    adapter = ImplicitGradientDescent(steps=250, learning_rate=0.12, regularization=LAMBDA,
                                      cg_steps=3, curvature="gauss_newton")
    learner = metalearn.Learner(model, adapter, loss=mse)
    episodes = regression_episodes(tasks=3, shots=5)
    w, b = learner.meta_variables
    grad_w, grad_b = tf.function(metalearn.MetaGradient().directions)(
        learner, episodes, execution.formulation(task_batching))[0]
    theta = np.concatenate([w.numpy(), b.numpy()[None]], axis=0)
    np.testing.assert_allclose(np.concatenate([grad_w, grad_b[None]]),
                               _closed_form(theta, episodes)[1], rtol=1e-8)


def test_gauss_newton_system_stays_positive_definite_where_the_hessian_does_not():
    """The solve's diagnostics, Hessian against Gauss-Newton, on the tanh net at a
    point that is not a minimum (no inner steps, a weak proximal term): CG meets
    negative curvature on the Hessian's system, never on G + lambda I, whose every
    curvature is at least lambda. (Eagerly: tracing the meta-step costs more than
    running it once.)"""
    found = {}
    for curvature in CURVATURES:
        learner, episodes = _tanh_classifier(curvature=curvature)
        _, metrics = metalearn.MetaGradient().directions(learner, episodes,
                                                         execution.Unrolled())
        found[curvature] = {k: float(np.mean(metrics[k])) for k in SOLVE}
    assert found["hessian"]["cg_positive_definite"] < 1
    assert found["hessian"]["cg_min_curvature"] < 0
    assert found["gauss_newton"]["cg_positive_definite"] == 1
    assert found["gauss_newton"]["cg_min_curvature"] >= 0.05 * (1 - 1e-9)


def test_gauss_newton_needs_the_loss_in_two_halves():
    class OpaqueLoss(metalearn.Learner):
        def support_loss(self, weights, x, y):
            return super().support_loss(weights, x, y)

    model = models.mlp((2,), hidden=(), outputs=1, dtype="float64")
    learner = OpaqueLoss(model, ImplicitGradientDescent(curvature="gauss_newton"), loss=mse)
    task = regression_episodes(shots=5).task(0)
    with pytest.raises(ValueError, match=r"curvature='gauss_newton'\) needs the support loss "
                                         r"as model outputs and a loss of them"):
        learner.adapt(task.support_x, task.support_y)
    with pytest.raises(ValueError, match=r"curvature must be one of \('hessian', "
                                         r"'gauss_newton'\), got 'fisher'"):
        ImplicitGradientDescent(curvature="fisher")


class TestImplicitMAMLGaussNewton(LearnerContract):
    covers = (metalearn.adapters.ImplicitGradientDescent, metalearn.adapters.SplitLoss)

    def make_learner(self):
        return classification_learner(ImplicitGradientDescent(
            steps=3, learning_rate=0.1, regularization=1.0, cg_steps=2,
            curvature="gauss_newton"))
