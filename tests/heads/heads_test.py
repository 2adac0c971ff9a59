"""Closed-form heads: ridge regression (R2-D2) against its closed form and finite
differences; logistic regression by Newton steps (LR-D2 and RFS, one head) against its
optimality condition, hand-unrolled Newton steps, a closed form and finite differences."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import metalearn
from metalearn import models
from metalearn.heads import LogisticHead, LogisticRegressionHead, RidgeHead
from metalearn.heads.logistic import newton_logistic, split_dual
from metalearn.testing import (DIM, WAYS, LearnerContract, analytic_meta_gradient,
                               assert_meta_gradient_matches_finite_differences,
                               relative_error, synthetic_classification)


@pytest.mark.parametrize("n,d", [(6, 10), (12, 4)])  # Woodbury (n <= d) and primal
def test_ridge_solution_equals_the_closed_form(n, d):
    rng = np.random.default_rng(0)
    embeddings = tf.constant(rng.normal(size=(n, d)))
    labels = tf.constant(np.arange(n) % 3)
    head = RidgeHead(regularization=0.5)
    head.build(tf.float64)
    w = head.fit(embeddings, labels, 3).numpy()
    e, y = embeddings.numpy(), np.eye(3)[labels.numpy()]
    expected = np.linalg.solve(e.T @ e + 0.5 * np.eye(d), e.T @ y)  # the primal form
    np.testing.assert_allclose(w, expected, rtol=1e-10, atol=1e-12)
    logits = head.logits(w, embeddings).numpy()
    np.testing.assert_allclose(logits, e @ expected, rtol=1e-10, atol=1e-12)


def _embedding(dtype="float64"):
    keras.utils.set_random_seed(0)
    return models.mlp((DIM,), hidden=(), outputs=5, activation="tanh", dtype=dtype,
                      name="embedding")


def test_r2d2_meta_gradient_equals_finite_differences():
    learner = metalearn.EmbeddingLearner(_embedding(), head=RidgeHead(0.7, scale=2.0),
                                         ways=WAYS)
    head_variables = learner.head.own_meta_variables()
    assert len(head_variables) == 3 and all(any(h is v for v in learner.meta_variables)
                                            for h in head_variables)
    episodes = synthetic_classification(0, tasks=2, dtype=tf.float64)
    analytic = assert_meta_gradient_matches_finite_differences(learner, episodes)
    for variable in head_variables:  # lambda, scale and bias are all learned
        assert abs(analytic[variable.path]) > 0, variable.path


class _HalvedGradientRidgeHead(RidgeHead):
    """R2-D2 with a wrong gradient: the logits' gradient halved on its way back."""

    def logits(self, state, embeddings):
        @tf.custom_gradient
        def halved(z):
            return tf.identity(z), lambda upstream: 0.5 * upstream
        return halved(super().logits(state, embeddings))


def test_the_meta_gradient_check_refuses_a_wrong_gradient():
    learner = metalearn.EmbeddingLearner(_embedding(), head=_HalvedGradientRidgeHead(0.7),
                                         ways=WAYS)
    episodes = synthetic_classification(0, tasks=2, dtype=tf.float64)
    with pytest.raises(AssertionError, match=r"relative error 5\.0.e-01, not below 1e-06; "
                                             r"most off: "):
        assert_meta_gradient_matches_finite_differences(learner, episodes)


def test_a_fixed_ridge_head_learns_nothing_itself():
    learner = metalearn.EmbeddingLearner(_embedding(), head=RidgeHead(learn=False),
                                         ways=WAYS)
    assert [v.path for v in learner.meta_variables] == [
        v.path for v in learner.model.trainable_variables]
    with pytest.raises(ValueError, match="RidgeHead.regularization must be > 0, got 0"):
        RidgeHead(regularization=0)


def _head_learner(head):
    """The contract's learner for a head: a seeded 16-unit MLP embedding (8 features)."""
    keras.utils.set_random_seed(0)
    model = models.mlp((DIM,), hidden=(16,), outputs=8, activation="relu", name="embedding")
    return metalearn.EmbeddingLearner(model, head=head, ways=WAYS,
                                      metrics={"accuracy": "accuracy"})


class TestR2D2(LearnerContract):
    covers = (RidgeHead,)

    def make_learner(self):
        return _head_learner(RidgeHead(1.0, scale=5.0))

    def chance_metrics(self, learner, episodes):
        """Without a task's support set the head has nothing to fit: shuffled support
        labels say nothing about the queries."""
        from metalearn.testing import uninformative_support
        return learner.meta_metrics(uninformative_support(episodes))


# --- the logistic-regression heads, pinned by independent references ------------------
# Two configurations of one formulation: LR-D2 (Bertinetto et al. 2019, ``LogisticHead``:
# penalty lambda / 2 ||W||^2, no intercept, raw embeddings) and RFS (Tian et al. 2020,
# ``LogisticRegressionHead``: C * cross-entropy + ||W||^2 / 2, an unpenalised intercept,
# L2-normalised embeddings). Each is checked through its public fit and logits only.

LOGISTIC = {"lr_d2": lambda steps=12: LogisticHead(0.5, steps=steps),
            "rfs": lambda steps=12: LogisticRegressionHead(C=2.0, iterations=steps)}


def _fitted_affine_map(head, x, labels, ways):
    """``(W [d, ways], b [ways])`` with the head's query logits ``z W + b``, read off its
    logits at the origin and at the unit vectors (unit, so normalising leaves them)."""
    head.build(tf.float64)
    state = head.fit(tf.constant(x), tf.constant(labels), ways)
    d = x.shape[-1]
    b = head.logits(state, tf.zeros([1, d], tf.float64)).numpy()[0]
    return head.logits(state, tf.eye(d, dtype=tf.float64)).numpy() - b, b


def _softmax(z):
    p = np.exp(z - z.max(-1, keepdims=True))
    return p / p.sum(-1, keepdims=True)


@pytest.mark.parametrize("config", sorted(LOGISTIC))
@pytest.mark.parametrize("n,d", [(6, 10), (12, 4)])
def test_logistic_head_fits_the_regularised_minimiser(config, n, d):
    """The gradient of each paper's objective, written in numpy, vanishes (to 1e-9) at
    the fitted W (and b): LR-D2 sum CE(x W) + 0.5 / 2 ||W||^2; RFS 2 sum CE(x' W + b) +
    ||W||^2 / 2 with x' = x / ||x||."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, d))
    labels = np.arange(n) % 3
    y = np.eye(3)[labels]
    w, b = _fitted_affine_map(LOGISTIC[config](), x, labels, 3)
    if config == "lr_d2":
        np.testing.assert_array_equal(b, 0)
        residual = _softmax(x @ w) - y
        gradients = [x.T @ residual + 0.5 * w]
    else:
        unit = x / np.linalg.norm(x, axis=1, keepdims=True)
        residual = _softmax(unit @ w + b) - y
        gradients = [2.0 * unit.T @ residual + w, 2.0 * residual.sum(0)]
    assert max(np.abs(g).max() for g in gradients) < 1e-9


@pytest.mark.parametrize("steps", [1, 2, 3])
def test_lr_d2_steps_are_newton_steps_on_the_weights(steps):
    """Hand-unrolled Newton's method on the primal ``W`` ``[d, ways]`` from 0 in numpy
    (the Hessian sum_i x_i x_i^T (x) S_i + lambda I written out), before convergence:
    the head's ``steps`` are these iterates."""
    rng = np.random.default_rng(1)
    n, d, ways, lam = 6, 4, 3, 0.5
    x = rng.normal(size=(n, d))
    labels = np.arange(n) % ways
    y = np.eye(ways)[labels]
    w = np.zeros((d, ways))
    for _ in range(steps):
        p = _softmax(x @ w)
        gradient = x.T @ (p - y) + lam * w
        hessian = lam * np.eye(d * ways)
        for i in range(n):
            s = np.diag(p[i]) - np.outer(p[i], p[i])
            hessian += np.kron(np.outer(x[i], x[i]), s)  # rows (feature, class)
        w = w - np.linalg.solve(hessian, gradient.ravel()).reshape(d, ways)
    got, _ = _fitted_affine_map(LogisticHead(lam, steps=steps), x, labels, ways)
    np.testing.assert_allclose(got, w, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("config", sorted(LOGISTIC))
@pytest.mark.parametrize("ways,radius", [(3, 1.0), (5, 2.0)])
def test_logistic_head_on_orthogonal_one_shot_support_has_its_closed_form(config, ways,
                                                                          radius):
    """One shot per class on orthogonal embeddings of norm r: by symmetry the fitted
    weights are W = r (alpha Y + beta (1 - Y)) on the support's span, the probability q of
    the true class solves q = 1 / (1 + (w - 1) exp(-r^2 (1 - q) w / (lambda (w - 1)))),
    and the logit margin of a query on a support direction is r^2 (1 - q) w / (lambda (w -
    1)) / r (times r for the query's own norm). RFS normalises, so r = 1 for it, and its
    intercept is one constant (by symmetry)."""
    from scipy import optimize
    d = ways + 2
    x = radius * np.eye(d)[:ways]
    labels = np.arange(ways)
    head = LOGISTIC[config]()
    lam, r = (0.5, radius) if config == "lr_d2" else (0.5, 1.0)
    gap = lambda q: r * r * (1 - q) * ways / (lam * (ways - 1))  # noqa: E731
    q = optimize.brentq(lambda q: q - 1 / (1 + (ways - 1) * np.exp(-gap(q))), 1e-12,
                        1 - 1e-12, xtol=1e-15, rtol=4 * np.finfo(float).eps)
    w, b = _fitted_affine_map(head, x, labels, ways)
    logits = np.eye(d)[:ways] @ w + b                       # queries: the unit directions
    margins = np.diagonal(logits) - (logits.sum(1) - np.diagonal(logits)) / (ways - 1)
    np.testing.assert_allclose(margins, gap(q) / r, rtol=1e-9)
    off_diagonal = logits[~np.eye(ways, dtype=bool)].reshape(ways, ways - 1)
    np.testing.assert_allclose(off_diagonal, off_diagonal[:, :1].repeat(ways - 1, 1),
                               atol=1e-10)


@pytest.mark.parametrize("intercept", [False, True])
@pytest.mark.parametrize("n,d", [(6, 10), (12, 4)])
def test_logistic_newton_solution_is_stationary(n, d, intercept):
    """Batched over 3 tasks, checked in numpy: W = X^T A (and b) zero the gradient of the
    regularised cross-entropy, X^T (softmax(X W + b) - Y) + lambda W (and sum(softmax(X W
    + b) - Y)); each task alone gives the same."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, n, d))
    y = np.eye(3)[np.arange(n) % 3][None].repeat(3, 0)
    gram = tf.constant(x @ np.swapaxes(x, 1, 2))
    lam = tf.constant(0.5, tf.float64)
    solve = tf.function(lambda g, t: newton_logistic(g, t, lam, 12, intercept))
    dual = solve(gram, tf.constant(y)).numpy()
    centre = lambda z: z - z.mean(-1, keepdims=True)  # noqa: E731 (b is free up to a shift)
    for i in range(3):
        alone = solve(gram[i], tf.constant(y[i])).numpy()
        np.testing.assert_allclose(centre(dual[i]), centre(alone), rtol=1e-9, atol=1e-12)
    a, b = split_dual(dual, intercept)
    w = np.swapaxes(x, 1, 2) @ a
    residual = _softmax(x @ w + (0 if b is None else b)) - y
    assert np.abs(np.swapaxes(x, 1, 2) @ residual + 0.5 * w).max() < 1e-10
    if intercept:
        assert np.abs(residual.sum(1)).max() < 1e-10


def test_lr_d2_meta_gradient_equals_finite_differences():
    learner = metalearn.EmbeddingLearner(_embedding(), head=LogisticHead(0.7, scale=2.0),
                                         ways=WAYS)
    assert learner.pieces.capabilities.custom_gradient  # unrolled tasks: map_fn drops it
    episodes = synthetic_classification(0, tasks=2, dtype=tf.float64)
    analytic = assert_meta_gradient_matches_finite_differences(learner, episodes)
    for variable in learner.head.own_meta_variables():  # lambda through the implicit path
        assert abs(analytic[variable.path]) > 0, variable.path


# the options beyond the two papers' settings: each way to differentiate with and without
# an intercept and normalisation, lambda, scale and bias meta-learned
OPTIONS = {"implicit_intercept_normalised": dict(intercept=True, normalize=True),
           "unrolled": dict(gradient="unrolled", steps=4),
           "unrolled_intercept": dict(gradient="unrolled", intercept=True, steps=4)}


@pytest.mark.parametrize("options", sorted(OPTIONS))
def test_logistic_head_options_meta_gradient_equals_finite_differences(options):
    head = LogisticHead(0.7, scale=2.0, bias=0.1, **OPTIONS[options])
    learner = metalearn.EmbeddingLearner(_embedding(), head=head, ways=WAYS)
    assert learner.pieces.capabilities.custom_gradient == (head.gradient == "implicit")
    episodes = synthetic_classification(0, tasks=2, dtype=tf.float64)
    analytic = assert_meta_gradient_matches_finite_differences(learner, episodes)
    log_lambda = learner.head.own_meta_variables()[0]
    assert abs(analytic[log_lambda.path]) > 0


@pytest.mark.parametrize("intercept", [False, True])
def test_implicit_and_unrolled_gradients_agree_once_newton_converges(intercept):
    """At a root the implicit gradient is the derivative of the solution, which the
    unrolled steps' derivative approaches as they converge (Newton: quadratically)."""
    gradients = {}
    for gradient in ("implicit", "unrolled"):
        learner = metalearn.EmbeddingLearner(
            _embedding(), head=LogisticHead(0.7, steps=15, intercept=intercept,
                                            gradient=gradient), ways=WAYS)
        gradients[gradient] = analytic_meta_gradient(
            learner, synthetic_classification(0, tasks=2, dtype=tf.float64))
    assert relative_error(gradients["implicit"], gradients["unrolled"]) < 1e-10


def test_logistic_head_arguments_are_checked():
    with pytest.raises(ValueError, match="LogisticHead.steps must be a whole number >= 1, got 0"):
        LogisticHead(steps=0)
    with pytest.raises(ValueError, match="LogisticHead gradient must be one of"):
        LogisticHead(gradient="backprop")
    with pytest.raises(ValueError, match="LogisticHead.damping must be > 0, got 0"):
        LogisticHead(damping=0)
    with pytest.raises(ValueError, match=r"LogisticHead.regularization must be > 0"):
        LogisticHead(regularization=0)
    with pytest.raises(ValueError, match="LogisticRegressionHead.C must be > 0, got 0"):
        LogisticRegressionHead(C=0)
    with pytest.raises(ValueError, match="LogisticRegressionHead.iterations must be a whole"):
        LogisticRegressionHead(iterations=1.5)


def test_rfs_is_the_logistic_head_in_its_setting_without_variables():
    """RFS's head is LogisticHead with lambda = 1 / C, an intercept, normalised inputs and
    the unrolled gradient, fixed scale 1 and offset 0: the same logits, and no variables
    (a pre-training checkpoint restores with it in place of another head)."""
    rfs = LogisticRegressionHead(C=2.0, iterations=5)
    general = LogisticHead(0.5, steps=5, learn=False, intercept=True, normalize=True,
                           gradient="unrolled")
    for head in (rfs, general):
        head.build(tf.float64)
    assert not rfs.variables and not rfs.own_meta_variables()
    assert not rfs.capabilities.custom_gradient
    rng = np.random.default_rng(2)
    x, queries = tf.constant(rng.normal(size=(6, 4))), tf.constant(rng.normal(size=(5, 4)))
    labels = tf.constant(np.arange(6) % 3)
    got, want = (h.logits(h.fit(x, labels, 3), queries).numpy() for h in (rfs, general))
    centre = lambda z: z - z.mean(-1, keepdims=True)  # noqa: E731 (the intercept's shift)
    np.testing.assert_allclose(centre(got), centre(want), rtol=1e-12, atol=1e-12)


class TestLRD2(LearnerContract):
    covers = (LogisticHead,)

    def make_learner(self):
        return _head_learner(LogisticHead(1.0, scale=2.0))

    chance_metrics = TestR2D2.chance_metrics
