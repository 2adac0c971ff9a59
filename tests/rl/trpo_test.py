"""TRPO as an outer rule (metalearn.rl.trpo), on a tabular MDP in float64.

Each piece against an independent reference: conjugate gradient against a dense solve;
the Fisher products against central differences of the KL's gradient; the surrogate's
gradient against central differences of the surrogate and against the DiCE
meta-gradient (which tests/rl/meta_rl_test.py checks against the exact return); the line
search's accepting and rejecting branches; the whole step against a reference written
here (dense Hessian of a hand-written KL, ``numpy.linalg.solve``, the line search in
Python); collected trajectories replay the on-policy meta-gradient (DiCE's and LVC's); a
few TRPO steps raise the exact post-adaptation return.
"""

import functools

import keras
import numpy as np
import pytest
import tensorflow as tf

import metalearn
from metalearn import execution, models
from metalearn.testing import OuterRuleContract
from metalearn.testing.outer import FORMULATIONS
from metalearn.adapters import GradientDescent
from metalearn.rl import TRPO, ClippedRatio
from metalearn.rl.clipped import adapted_kl_coefficient
from metalearn.rl.trpo import TrustRegion, backtracking_line_search, conjugate_gradient
from metalearn.pieces import HyperparameterRangeError
from metalearn.rl import LVC, Collected, DiCE, PolicyLearner, Rollouts, TabularMDP

MDP = TabularMDP(states=2, actions=2, horizon=2, dtype="float64")
UNROLLED = execution.formulation("unrolled")


def _learner(rollouts="exact", seed=1, hidden=(), estimator=DiCE):
    keras.utils.set_random_seed(seed)
    model = models.mlp((MDP.states,), hidden=hidden, outputs=MDP.action_size,
                       activation="tanh", dtype="float64")
    return PolicyLearner(model, MDP, GradientDescent(1, 0.3, wrappers=[Rollouts()]),
                         rollouts=rollouts, estimator=estimator(discount=1.0))


def _episodes(tasks=2, seed=3):
    return MDP.sample(tf.constant([seed, 0], tf.int64), tasks)


def _flat(tensors):
    return np.concatenate([np.ravel(t) for t in tensors])


def relative_error(a, b):
    """``||a - b|| / ||b||`` of two flat arrays."""
    return float(np.linalg.norm(np.asarray(a) - np.asarray(b)) / np.linalg.norm(b))


# --- the pieces ----------------------------------------------------------------------

def test_conjugate_gradient_solves_against_a_dense_solve():
    rng = np.random.default_rng(0)
    m = rng.normal(size=(5, 5))
    a = m @ m.T + 0.5 * np.eye(5)
    b = rng.normal(size=5)
    product = lambda v: [tf.reshape(tf.linalg.matvec(tf.constant(a), tf.concat(
        [tf.reshape(t, [-1]) for t in v], 0)), [-1])[:2],
        tf.reshape(tf.linalg.matvec(tf.constant(a), tf.concat(
            [tf.reshape(t, [-1]) for t in v], 0))[2:], [3, 1])]
    x = conjugate_gradient(product, [tf.constant(b[:2]), tf.constant(b[2:].reshape(3, 1))],
                           iterations=5, residual_tol=1e-30)
    exact = np.linalg.solve(a, b)
    assert relative_error(_flat(x), exact) < 1e-10
    # fewer iterations than the dimension: not yet the solution
    partial = conjugate_gradient(product, [tf.constant(b[:2]),
                                           tf.constant(b[2:].reshape(3, 1))], iterations=2)
    assert relative_error(_flat(partial), exact) > 1e-3


def _search(surrogate, kl, max_kl=0.01):
    fraction, s, d, accepted = backtracking_line_search(
        lambda f: (surrogate(f), kl(f)), tf.constant(1.0, tf.float64), max_kl,
        backtrack_ratio=0.5, max_backtracks=6)
    return float(fraction), float(s), float(d), bool(accepted)


def test_the_line_search_accepts_only_an_improvement_within_the_trust_region():
    # the full step improves and stays inside: taken whole
    assert _search(lambda f: 1 + f, lambda f: 0.005 * f) == (1.0, 2.0, 0.005, True)
    # too far at 1, 1/2, 1/4; inside from 1/8 (KL 0.05 f)
    assert _search(lambda f: 1 + f, lambda f: 0.05 * f) == (0.125, 1.125, 0.00625, True)
    # inside the trust region only where the surrogate no longer improves: rejected
    fraction, _, _, accepted = _search(lambda f: 1 - f + 0 * f, lambda f: 0.0 * f)
    assert (fraction, accepted) == (0.0, False)
    # the surrogate improves but the KL never fits: rejected
    fraction, _, _, accepted = _search(lambda f: 1 + f, lambda f: 1.0 + 0 * f)
    assert (fraction, accepted) == (0.0, False)
    # non-finite figures are never accepted
    fraction, _, _, accepted = _search(lambda f: 1 + f, lambda f: np.nan + 0 * f)
    assert (fraction, accepted) == (0.0, False)


def _kl_gradient(region):
    with tf.GradientTape() as tape:
        kl = region.mean(region.figures(), "kl")
    return _flat([g.numpy() for g in tape.gradient(kl, region.variables)])


def test_the_fisher_product_equals_differences_of_the_kl_gradient():
    learner = _learner(hidden=(3,))
    region = TrustRegion(learner, _episodes(), UNROLLED)
    rng = np.random.default_rng(1)
    v = [tf.constant(rng.normal(size=w.shape)) for w in region.theta]
    analytic = _flat([p.numpy() for p in region.fisher_product(v)])
    eps = 1e-5

    def gradient_at(sign):
        for variable, w, t in zip(region.variables, region.theta, v):
            variable.assign(w + sign * eps * t)
        return _kl_gradient(region)

    try:
        numeric = (gradient_at(1) - gradient_at(-1)) / (2 * eps)
    finally:
        for variable, w in zip(region.variables, region.theta):
            variable.assign(w)
    assert np.abs(_kl_gradient(region)).max() < 1e-12  # KL's minimum at theta
    assert relative_error(analytic, numeric) < 1e-6
    damped = _flat([p.numpy() for p in region.fisher_product(v, damping=0.1)])
    np.testing.assert_allclose(damped, analytic + 0.1 * _flat([t.numpy() for t in v]),
                               rtol=1e-12)


def test_the_surrogate_gradient_is_the_meta_gradient():
    """Against central differences of the surrogate on the collected data, and against
    the DiCE meta-gradient (exact here): ``g = -dLoss / horizon``."""
    learner = _learner()
    episodes = _episodes()
    region = TrustRegion(learner, episodes, UNROLLED)
    g, metrics, surrogate = region.gradient()
    analytic = _flat([t.numpy() for t in g])
    eps, numeric = 1e-6, []
    for k, w in enumerate(region.theta):
        for index in np.ndindex(*w.shape):
            unit = np.zeros(w.shape)
            unit[index] = eps
            moved = lambda sign: [t + sign * unit if j == k else t
                                  for j, t in enumerate(region.theta)]
            numeric.append((float(region.evaluate(moved(1))[0])
                            - float(region.evaluate(moved(-1))[0])) / (2 * eps))
    assert relative_error(analytic, np.array(numeric)) < 1e-7
    meta, _ = metalearn.MetaGradient(keras.optimizers.SGD(1.0)).directions(
        learner, episodes, UNROLLED)
    assert relative_error(analytic, -_flat([t.numpy() for t in meta]) / MDP.horizon) < 1e-10
    np.testing.assert_allclose(float(region.evaluate(region.theta)[1]), 0.0, atol=1e-15)


@pytest.mark.parametrize("estimator", [DiCE, LVC])
@pytest.mark.parametrize("rollouts", ["exact", 3])
def test_collected_trajectories_replay_the_on_policy_meta_gradient(rollouts, estimator):
    """DiCE's cumulative ratios and LVC's per-step ones (ProMP's inner step on the
    clipped-ratio rule's collected data) alike."""
    learner = _learner(rollouts, hidden=(3,), estimator=estimator)
    episodes = _episodes()
    collected = [learner.collect(episodes.task(i)) for i in range(episodes.num_tasks)]
    assert isinstance(collected[0].support_y, Collected)
    assert collected[0].support_y.weights.shape[0] == 1  # one inner step
    stacked = tf.nest.map_structure(lambda *t: tf.stack(t), *collected)
    rule = metalearn.MetaGradient(keras.optimizers.SGD(1.0))
    on_policy, a = rule.directions(learner, episodes, UNROLLED)
    replayed, b = rule.directions(learner, stacked, UNROLLED)
    assert relative_error(_flat([t.numpy() for t in replayed]),
                          _flat([t.numpy() for t in on_policy])) < 1e-12
    np.testing.assert_allclose(b["return"].numpy(), a["return"].numpy(), rtol=1e-12)
    with pytest.raises(ValueError, match="holds them for 1 inner steps"):
        learner.adapt(collected[0].support_x, collected[0].support_y, steps=2)


# --- the whole step against a reference --------------------------------------------

def _reference_step(learner, episodes, rule):
    """TRPO by hand: per task, the adaptation on the collected support trajectories at
    flat parameters ``p``; the softmax policies' ratio and KL written out; the dense
    Hessian of the KL by nested tapes; ``numpy.linalg.solve``; the line search as a
    Python loop. Returns theta - theta_new (flat)."""
    variables = learner.meta_variables
    shapes = [tuple(v.shape) for v in variables]
    sizes = [int(np.prod(s)) for s in shapes]
    theta = _flat([v.numpy() for v in variables])
    tasks = [learner.collect(episodes.task(i)) for i in range(episodes.num_tasks)]
    old = [None] * len(tasks)

    def figures(p):
        parts = [tf.reshape(t, s) for t, s in zip(tf.split(p, sizes), shapes)]
        surrogates, kls = [], []
        with keras.StatelessScope(state_mapping=list(zip(variables, parts))):
            for i, task in enumerate(tasks):
                adapted = learner.adapt(task.support_x, task.support_y)
                trajectories, weights, _ = task.query_y
                obs = tf.reshape(trajectories.observations, [-1, MDP.states])
                logits = tf.reshape(learner.predict(adapted, obs),
                                    [-1, MDP.horizon, MDP.action_size])
                log_pi = logits - tf.reduce_logsumexp(logits, -1, keepdims=True)
                if old[i] is None:
                    old[i] = tf.stop_gradient(log_pi)
                taken = tf.one_hot(trajectories.actions, MDP.action_size, dtype=tf.float64)
                ratio = tf.exp(tf.reduce_sum(taken * (log_pi - old[i]), -1))
                returns = tf.cumsum(trajectories.rewards, axis=-1, reverse=True)
                w = weights[:, None] * tf.ones_like(returns)
                surrogates.append(tf.reduce_sum(w * ratio * returns) / tf.reduce_sum(w))
                kl = tf.reduce_sum(tf.exp(old[i]) * (old[i] - log_pi), -1)
                kls.append(tf.reduce_sum(w * kl) / tf.reduce_sum(w))
        return tf.add_n(surrogates) / len(tasks), tf.add_n(kls) / len(tasks)

    p = tf.constant(theta)
    with tf.GradientTape() as outer:
        outer.watch(p)
        with tf.GradientTape(persistent=True) as inner:
            inner.watch(p)
            surrogate_before, kl = figures(p)
        g = inner.gradient(surrogate_before, p)
        kl_gradient = inner.gradient(kl, p)
    hessian = outer.jacobian(kl_gradient, p).numpy() + rule.cg_damping * np.eye(len(theta))
    x = np.linalg.solve(hessian, g.numpy())
    step = np.sqrt(2 * rule.max_kl / (x @ hessian @ x + 1e-8)) * x
    for k in range(rule.max_backtracks):
        fraction = rule.backtrack_ratio ** k
        surrogate, kl = (float(t) for t in figures(tf.constant(theta + fraction * step)))
        if surrogate > float(surrogate_before) and kl <= rule.max_kl:
            return -fraction * step, kl
    return np.zeros_like(step), 0.0


def _rule():
    # enough iterations with no early stop: conjugate gradient reaches the dense solve;
    # the softmax's shift invariance leaves the Fisher matrix singular, so the damping
    # sets how much rounding in the gradient the solve amplifies (1 / damping)
    return TRPO(max_kl=0.01, cg_iters=40, cg_damping=1e-2, residual_tol=1e-30)


@functools.lru_cache(maxsize=None)
def _default_reference():
    """:func:`_reference_step` of ``_rule()`` on ``_learner(hidden=(3,))`` and
    ``_episodes()``, computed once: the eager test and TestTRPOContract (whose
    make_rule, make_learner and make_episodes these are) compare with it."""
    learner = _learner(hidden=(3,))
    rule = _rule()
    rule.build(learner)
    return _reference_step(learner, _episodes(), rule)


def test_a_trpo_step_equals_the_reference_eagerly():
    """Eagerly, through the rule's directions (compiled, under every formulation, one
    device and two replicas: TestTRPOContract below, against the same reference)."""
    learner = _learner(hidden=(3,))
    episodes = _episodes()
    rule = _rule()
    rule.build(learner)
    expected, kl = _default_reference()
    assert np.abs(expected).max() > 1e-3 and 0 < kl <= rule.max_kl
    directions, metrics = rule.directions(learner, episodes, UNROLLED)
    assert relative_error(_flat([d.numpy() for d in directions]), expected) < 1e-8
    np.testing.assert_allclose(metrics["kl"].numpy(), kl, rtol=1e-8)
    assert metrics["accepted"].numpy().tolist() == [1.0, 1.0]


def test_a_few_trpo_steps_raise_the_post_adaptation_return():
    """Exact trajectories (the enumeration): ``return`` is the exact expected return
    after one adaptation step; on held-out tasks it rises over four TRPO steps."""
    learner = _learner(hidden=(4,), seed=2)
    rule = TRPO(max_kl=0.05)
    held_out = _episodes(tasks=8, seed=11)
    before = float(tf.reduce_mean(learner.meta_metrics(held_out, formulation="unrolled")
                                  ["return"]))
    step_function = metalearn.training.make_meta_step(learner, rule, UNROLLED)
    for step in range(4):  # one trace, four steps
        metrics = step_function(_episodes(tasks=2, seed=20 + step))
        assert 0 < float(metrics["kl"]) <= 0.05
    after = float(tf.reduce_mean(learner.meta_metrics(held_out, formulation="unrolled")
                                 ["return"]))
    assert after > before + 0.05, (before, after)


def test_trpo_refuses_what_it_cannot_run():
    with pytest.raises(HyperparameterRangeError, match="TRPO.max_kl must be > 0, got 0"):
        TRPO(max_kl=0)
    with pytest.raises(HyperparameterRangeError, match="TRPO.backtrack_ratio"):
        TRPO(backtrack_ratio=1.0)
    supervised = metalearn.Learner(models.mlp((1,), hidden=(), outputs=1), loss="mse")
    with pytest.raises(TypeError, match="TRPO needs a learner whose trajectories can be "
                                        "collected"):
        metalearn.training.make_meta_step(supervised, TRPO())


# --- the clipped-ratio rule (PPO / ProMP) ----------------------------------------------

def _clipped_objective(region, values, clip, penalty):
    """J at ``values`` by hand from the collected data (per-step ratios against the
    collecting adapted policy, the clipped minimum, the pre-update log-ratio)."""
    learner = region.learner
    total = []
    with keras.StatelessScope(state_mapping=list(zip(region.variables, values))):
        for i in range(int(region.old_outputs.shape[0])):
            task = tf.nest.map_structure(lambda t: t[i], region.collected)
            adapted = learner.adapt(task.support_x, task.support_y)
            trajectories, weights, _ = task.query_y
            obs = tf.reshape(trajectories.observations, [-1, MDP.states])
            logits = tf.reshape(learner.predict(adapted, obs), [-1, MDP.horizon, 2])
            taken = tf.one_hot(trajectories.actions, 2, dtype=tf.float64)
            log_pi = tf.reduce_sum(taken * tf.nn.log_softmax(logits), -1)
            old = tf.reduce_sum(taken * tf.nn.log_softmax(region.old_outputs[i]), -1)
            ratio = tf.exp(log_pi - old)
            a = tf.cumsum(trajectories.rewards, axis=-1, reverse=True)
            w = weights[:, None] * tf.ones_like(a)
            clipped = tf.minimum(ratio * a, tf.clip_by_value(ratio, 1 - clip, 1 + clip) * a)
            total.append(tf.reduce_sum(w * clipped) / tf.reduce_sum(w)
                         - penalty * _task_inner_kl(learner, task))
    return float(tf.add_n(total)) / len(total)


def _task_inner_kl(learner, task):
    """The collecting pre-update policy's KL to the current one on a collected task's
    first inner step's actions, by hand: the mean of the log-ratio."""
    support, support_w, support_log = tf.nest.map_structure(lambda t: t[0], task.support_y)
    pre = tf.reshape(learner.predict(learner.initial_weights(), tf.reshape(
        support.observations, [-1, MDP.states])), [-1, MDP.horizon, 2])
    pre_taken = tf.one_hot(support.actions, 2, dtype=tf.float64)
    current = tf.reduce_sum(pre_taken * tf.nn.log_softmax(pre), -1)
    sw = support_w[:, None] * tf.ones_like(current)
    return tf.reduce_sum(sw * (support_log - current)) / tf.reduce_sum(sw)


def _hand_inner_kl(region):
    """The mean over the collected tasks of :func:`_task_inner_kl` at the learner's
    current values."""
    tasks = int(region.old_outputs.shape[0])
    return float(tf.add_n([_task_inner_kl(region.learner, tf.nest.map_structure(
        lambda t: t[i], region.collected)) for i in range(tasks)])) / tasks


def _clipped_reference(learner, episodes, rate, clip, penalty, epochs):
    """ClippedRatio's epochs by hand: SGD ascent with each epoch's gradient by central
    differences of the objective written out above. Returns the trust region and the
    meta-variables' values after each epoch (a list of ``epochs`` lists)."""
    region = TrustRegion(learner, episodes, UNROLLED)
    values, after = [w.numpy() for w in region.theta], []
    eps = 1e-6
    for _ in range(epochs):
        gradient = []
        for k, w in enumerate(values):
            g = np.zeros(w.shape)
            for index in np.ndindex(*w.shape):
                unit = np.zeros(w.shape)
                unit[index] = eps
                moved = lambda sign: [tf.constant(t + sign * unit if j == k else t)
                                      for j, t in enumerate(values)]
                g[index] = (_clipped_objective(region, moved(1), clip, penalty)
                            - _clipped_objective(region, moved(-1), clip, penalty)) / (2 * eps)
            gradient.append(g)
        values = [w + rate * g for w, g in zip(values, gradient)]
        after.append(values)
    return region, after


CLIPPED = dict(rate=3.0, clip=0.05, penalty=0.5)
"""The clipped-ratio settings of the finite-difference test and TestClippedRatioContract
(three epochs and two: the first two of the three are the same epochs)."""


@functools.lru_cache(maxsize=None)
def _default_clipped_reference():
    """``(theta, values after each of three epochs)``: :func:`_clipped_reference` of
    :data:`CLIPPED` on ``_learner()`` and ``_episodes()``, computed once: the
    finite-difference test (three epochs) and TestClippedRatioContract (the first two)
    compare with it."""
    region, after = _clipped_reference(_learner(), _episodes(), epochs=3, **CLIPPED)
    return [w.numpy() for w in region.theta], after


def test_clipped_ratio_epochs_equal_gradient_ascent_by_finite_differences():
    """Three SGD epochs on one collected batch: each epoch's step against central
    differences of the objective written out here (the clip active in later epochs)."""
    rate, clip, penalty, epochs = CLIPPED["rate"], CLIPPED["clip"], CLIPPED["penalty"], 3
    learner = _learner()
    episodes = _episodes()
    theta, after = _default_clipped_reference()
    start = _flat(theta)
    expected = _flat(after[epochs - 1])
    rule = ClippedRatio(keras.optimizers.SGD(rate), epochs=epochs, clip=clip,
                        kl_penalty=penalty)
    rule.build(learner)
    metrics = rule.step(learner, episodes, UNROLLED)
    found = _flat([v.numpy() for v in learner.meta_variables])
    assert relative_error(found - start, expected - start) < 1e-6
    assert metrics["return"].shape == (2,)
    # the clip mattered: unclipped epochs go elsewhere
    loose = _learner()
    ClippedRatio(keras.optimizers.SGD(rate), epochs=epochs, clip=10.0,
                 kl_penalty=penalty).step(loose, episodes, UNROLLED)
    assert relative_error(_flat([v.numpy() for v in loose.meta_variables]) - start,
                          expected - start) > 1e-3


def test_clipped_ratio_compiled_equals_eager_and_learns():
    """A compiled step (map_fn, guarded: each epoch's update through the guard) moves
    the weights as the eager one; three compiled steps raise the exact
    post-adaptation return of held-out tasks."""
    def rule():
        return ClippedRatio(keras.optimizers.SGD(0.5), epochs=2, clip=0.2, kl_penalty=0.1)

    eager, compiled = _learner(hidden=(4,), seed=2), _learner(hidden=(4,), seed=2)
    rule().step(eager, _episodes(tasks=4, seed=20), UNROLLED)
    step = metalearn.training.make_meta_step(compiled, rule(), "map_fn",
                                             skip_non_finite=True)
    held_out = _episodes(tasks=8, seed=11)
    mean_return = lambda: float(tf.reduce_mean(compiled.meta_metrics(
        held_out, formulation="unrolled")["return"]))
    before = mean_return()
    figures = step(_episodes(tasks=4, seed=20))
    assert not np.any(figures["non_finite"].numpy())
    assert relative_error(_flat([v.numpy() for v in compiled.meta_variables]),
                          _flat([v.numpy() for v in eager.meta_variables])) < 1e-10
    for seed in (21, 22):
        step(_episodes(tasks=4, seed=seed))
    assert mean_return() > before + 0.05, (before, mean_return())


def test_clipped_ratio_refuses_what_it_cannot_run():
    with pytest.raises(HyperparameterRangeError, match="ClippedRatio.epochs must be"):
        ClippedRatio(epochs=0)
    supervised = metalearn.Learner(models.mlp((1,), hidden=(), outputs=1), loss="mse")
    with pytest.raises(TypeError, match="TRPO needs a learner"):
        metalearn.training.make_meta_step(supervised, ClippedRatio())


def test_the_meta_rl_rules_live_in_rl_and_ask_for_a_policy_learner():
    class LooksLikeOne(metalearn.Learner):  # the members, not the learner
        distribution = metalearn.rl.Categorical()

        def collect(self, episode, steps=None, weights=None):
            return episode

        def outputs_of(self, run):
            return run.predictions

    duck = LooksLikeOne(models.mlp((1,), hidden=(), outputs=2), loss="mse")
    with pytest.raises(TypeError, match="run on a metalearn.rl.PolicyLearner"):
        TRPO().build(duck)
    for name in ("TRPO", "ClippedRatio"):
        with pytest.raises(AttributeError, match=f"moved to metalearn.rl.{name}"):
            getattr(metalearn.outer, name)


def test_the_adaptive_kl_coefficient_doubles_halves_or_keeps():
    """ProMP's rule against a hand computation: target 0.01, doubled above 0.015,
    halved below 0.01 / 1.5, kept between (and for a KL that is not a number)."""
    for kl, expected in [(0.02, 0.4), (0.0151, 0.4), (0.015, 0.2), (0.01, 0.2),
                         (0.0067, 0.2), (0.0066, 0.1), (0.0, 0.1), (float("nan"), 0.2)]:
        found = float(adapted_kl_coefficient(tf.constant(0.2, tf.float64), kl, 0.01))
        assert found == expected, (kl, found, expected)


def _adaptive(target, penalty=0.5):
    return ClippedRatio(keras.optimizers.SGD(3.0), epochs=2, clip=0.05, kl_penalty=penalty,
                        kl_target=target)


def test_the_adaptive_rule_adapts_after_the_step_and_uses_its_coefficient():
    """A step with ``kl_target``: the inner KL at the values after the step (the
    figure, against the log-ratio by hand on the collected data) and the coefficient
    adapted from it (both branches: a tiny target doubles it, a large one halves it);
    the next step's objective uses the adapted coefficient (as a fixed penalty of that
    value would)."""
    episodes = _episodes()
    for target, expected in [(1e-8, 1.0), (10.0, 0.25)]:
        learner = _learner()
        region = TrustRegion(learner, episodes, UNROLLED)  # the data the step collects
        rule = _adaptive(target)
        rule.build(learner)
        figures = rule.step(learner, episodes, UNROLLED)
        kl = _hand_inner_kl(region)
        assert kl > 0 and abs(float(figures["inner_kl"][0]) - kl) < 1e-10 * kl
        hand = 0.5 * (2.0 if kl > 1.5 * target else 0.5 if kl < target / 1.5 else 1.0)
        assert float(rule.kl_coefficient.numpy()) == hand == expected
        np.testing.assert_array_equal(figures["kl_coefficient"].numpy(), [hand, hand])
    adaptive, fixed = _learner(), _learner()
    rule = _adaptive(1e-8)
    rule.kl_coefficient.assign(4.0)
    rule.step(adaptive, episodes, UNROLLED)
    ClippedRatio(keras.optimizers.SGD(3.0), epochs=2, clip=0.05,
                 kl_penalty=4.0).step(fixed, episodes, UNROLLED)
    assert relative_error(_flat([v.numpy() for v in adaptive.meta_variables]),
                          _flat([v.numpy() for v in fixed.meta_variables])) < 1e-12
    with pytest.raises(HyperparameterRangeError, match="ClippedRatio.kl_target"):
        ClippedRatio(kl_target=0.0)
    with pytest.raises(HyperparameterRangeError, match="ClippedRatio.kl_penalty must be > 0"):
        ClippedRatio(kl_penalty=0.0, kl_target=0.01)  # 0 would never adapt


def _clipped_run(workdir, steps):
    """The point-navigation config (shrunk) with the adaptive clipped-ratio rule, trained
    to ``steps`` in ``workdir`` through the training loop (resuming what is there)."""
    import gin
    from metalearn.training import build_experiment, parse_config, train
    parse_config(["experiments/rl/point_nav_maml.gin"],
                 ["Experiment.outer_rule = @ClippedRatio()", "ClippedRatio.epochs = 2",
                  "ClippedRatio.kl_penalty = 0.1", "ClippedRatio.kl_target = 10.0",
                  f"Loop.num_steps = {steps}", "Loop.log_every = 1",
                  "Loop.checkpoint_every = 1", "PointNavigation.horizon = 5",
                  "PolicyLearner.rollouts = 2", "Experiment.meta_batch_size = 1",
                  "mlp.hidden = (8,)", "Experiment.formulation = @Unrolled()"])
    try:
        experiment = build_experiment()
        metrics = train(experiment, workdir)
    finally:
        gin.clear_config()
    return experiment, metrics


def test_a_resumed_run_continues_the_adaptive_kl_coefficient(tmp_path):
    """The coefficient is checkpointed with the run: stopped after one step and resumed
    to two, the run ends with the uninterrupted run's coefficient, 0.1 halved at each
    step (the target far above the KL): a resume that lost it would end at twice it.
    (A resumed run's weights equal an uninterrupted one's: tests/training/resume_test.py.)"""
    first, metrics = _clipped_run(str(tmp_path / "resumed"), 1)
    assert float(first.outer_rule.kl_coefficient.numpy()) == 0.05
    resumed, metrics = _clipped_run(str(tmp_path / "resumed"), 2)
    assert float(resumed.outer_rule.kl_coefficient.numpy()) == 0.025
    assert metrics["kl_coefficient"] == pytest.approx(0.025)
    import gin
    try:  # restore() (evaluation, notebooks) loads the rule's state with the weights
        restored = metalearn.training.restore(str(tmp_path / "resumed"))
    finally:
        gin.clear_config()
    assert float(restored.outer_rule.kl_coefficient.numpy()) == 0.025
    for a, b in zip(restored.learner.meta_variables, resumed.learner.meta_variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_trpo_trains_from_the_point_navigation_config(tmp_path):
    """``Experiment.outer_rule = @TRPO()`` on experiments/rl/point_nav_maml.gin (shrunk)
    through metalearn.train: the step's figures (``kl``, ``accepted``) reach the
    metrics, the checkpoint holds the rule."""
    import gin
    from metalearn.training import build_experiment, parse_config, train
    parse_config(["experiments/rl/point_nav_maml.gin"],
                 ["Experiment.outer_rule = @TRPO()", "Loop.num_steps = 1",
                  "Loop.log_every = 1", "PointNavigation.horizon = 5",
                  "PolicyLearner.rollouts = 2", "Experiment.meta_batch_size = 1",
                  "mlp.hidden = (8,)", "Experiment.formulation = @Unrolled()"])
    try:
        experiment = build_experiment()
        assert isinstance(experiment.outer_rule, TRPO)
        metrics = train(experiment, str(tmp_path))
    finally:
        gin.clear_config()
    assert metrics["accepted"] in (0.0, 1.0) and 0 <= metrics["kl"] <= 0.01
    assert np.isfinite(metrics["return"])


def test_the_trust_region_runs_the_formulation_auto_chooses():
    """Given ``Auto``, TRPO and the clipped ratio run the formulation it resolves to (on
    a CPU: Accumulate), so the contracts below run that one in its place."""
    region = TrustRegion(_learner(), _episodes(), execution.Auto())
    assert type(region.formulation) is execution.Accumulate


@pytest.mark.parametrize("formulation, calls", [("unrolled", 2), ("map_fn", 2)])
def test_the_trust_region_traces_its_collection_only_as_its_formulation_needs(
        formulation, calls):
    """Unrolled calls the collection once per task (two) and traces no signature of it
    (before, a third call traced one it never used); MapFn traces it once for its
    signature and once for its loop's body, whatever the number of tasks."""
    learner = _learner()
    collect, count = learner.collect, []
    learner.collect = lambda episode: count.append(1) or collect(episode)
    tf.function(lambda e: TrustRegion(learner, e, execution.formulation(formulation))
                .collected)(_episodes())
    assert len(count) == calls


# --- the outer-rule contract ---------------------------------------------------------


def _values_by_path(learner, flat_or_list):
    """Meta-variable values by path, from a flat vector or a list in their order."""
    variables = learner.meta_variables
    if isinstance(flat_or_list, np.ndarray):
        sizes = [int(np.prod(v.shape)) for v in variables]
        flat_or_list = np.split(flat_or_list, np.cumsum(sizes)[:-1])
    return {v.path: np.reshape(p, v.shape) for v, p in zip(variables, flat_or_list)}


class TestTRPOContract(OuterRuleContract):
    """TRPO under every formulation, one device and a strategy, against the dense
    hand-written step above (one meta-step on two tasks of the tabular MDP)."""

    covers = (TRPO,)
    tolerance = 1e-7
    # a policy learner's rollouts cannot run on a task axis (Batched refuses it, naming
    # the Rollouts wrapper: tests/rl/meta_rl_test.py); the trust region resolves the
    # formulation it is given before any use (TrustRegion: Auto runs accumulate's step,
    # op for op); the unrolled formulation's step is checked eagerly against the same
    # references (test_a_trpo_step_equals_the_reference_eagerly, and the clipped
    # ratio's finite-difference test), so the compiled cases run the loops
    formulations = [f for f in FORMULATIONS if f not in ("batched", "auto", "unrolled")]

    def make_rule(self):
        return _rule()

    def make_learner(self):
        return _learner(hidden=(3,))

    def make_episodes(self):
        return _episodes()

    def test_every_formulation_under_xla(self):
        """TRPO is not compiled with XLA: the step builder refuses it before any work,
        naming the rule and the reason (a guard around it says the same)."""
        for rule in (self.make_rule(), metalearn.outer.SkipNonFinite(self.make_rule())):
            with pytest.raises(ValueError, match="TRPO cannot be compiled with XLA: XLA "
                               "cannot compile the KL's Hessian-vector products"):
                metalearn.training.make_meta_step(self.make_learner(), rule, "map_fn",
                                                  jit_compile=True)

    def reference_step(self, learner, episodes):
        directions, _ = _default_reference()  # on this make_learner() and make_episodes()
        return _values_by_path(
            learner, _flat([v.numpy() for v in learner.meta_variables]) - directions)


class TestClippedRatioContract(OuterRuleContract):
    """ClippedRatio's epochs under every formulation, one device and a strategy (one
    replica: it refuses several), against SGD ascent by finite differences; with the
    adaptive KL coefficient on (the step uses the initial coefficient, then adapts it:
    the same weights; without it, the finite-difference test above)."""

    covers = (ClippedRatio,)
    tolerance = 1e-7
    formulations = TestTRPOContract.formulations
    settings = dict(CLIPPED, epochs=2)

    def make_rule(self):
        s = self.settings
        return ClippedRatio(keras.optimizers.SGD(s["rate"]), epochs=s["epochs"],
                            clip=s["clip"], kl_penalty=s["penalty"], kl_target=0.01)

    def make_learner(self):
        return _learner()

    def make_episodes(self):
        return _episodes()

    def reference_step(self, learner, episodes):
        _, after = _default_clipped_reference()  # on this make_learner() and make_episodes()
        return _values_by_path(learner, after[self.settings["epochs"] - 1])
