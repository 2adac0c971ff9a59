"""Meta-RL (metalearn.rl): the estimator's meta-gradients against the exact
post-adaptation expected return of small tabular MDPs, the naive surrogate's wrong
second order, seeded rollouts, the environments and the estimators' pieces.

The exact checks take the whole enumeration of a task's trajectories as the batch
(``PolicyLearner(rollouts="exact")``: each trajectory weighted by its stopped
probability), so the DiCE surrogate's derivatives are exact rather than unbiased. The
reference is independent of trajectories, DiCE and sampling: the same inner loop run
on minus the expected return computed by dynamic programming over the state
distribution (``TabularMDP.expected_return``), differentiated by central finite
differences in float64.

ProMP's LVC estimator is checked the same way where it is exact (its value, its policy
gradient) and against closed forms where it is not: its Hessian on a batch against the
per-step sum ``sum_t A_t (g_t g_t^T + H_t)`` of the policy's own scores (and against
central differences of its gradient), DiCE's against it plus the cross terms, and the
meta-gradient through an LVC inner step against the exact return's gradient at the
adapted weights times ``I + alpha H_LVC``.
"""

import functools
import os

import gin
import keras
import numpy as np
import pytest
import tensorflow as tf

import metalearn
from metalearn import execution, models
from metalearn.adapters import GradientDescent, InnerAdam, LearnedRates
from metalearn.pieces import HyperparameterRangeError
from metalearn.rl import (LVC, DiCE, LinearFeatureBaseline, NaiveSurrogate,
                          PointNavigation, PolicyLearner, Rollouts, TabularMDP,
                          ValueNetworkBaseline, discounted_returns, gae, gaussian_policy,
                          rollout)
from metalearn.testing import finite_difference_variables, relative_error
from metalearn.repository import ROOT

ALPHA = 0.3
MDP = TabularMDP(states=2, actions=2, horizon=3, dtype="float64")


def _model(seed=1):
    keras.utils.set_random_seed(seed)
    return models.mlp((MDP.states,), hidden=(4,), outputs=MDP.action_size,
                      activation="tanh", dtype="float64")


def _adapter(kind, rollouts):
    wrappers = [Rollouts()] if rollouts else []
    if kind == "sgd":
        return GradientDescent(1, ALPHA, wrappers=wrappers)
    if kind == "sgd2":
        return GradientDescent(2, ALPHA, wrappers=wrappers)
    if kind == "first_order":
        return GradientDescent(1, ALPHA, first_order=True, wrappers=wrappers)
    if kind == "metasgd":
        return GradientDescent(1, update=LearnedRates("element", ALPHA), wrappers=wrappers)
    if kind == "adam":
        return GradientDescent(2, update=InnerAdam(0.05), wrappers=wrappers)
    raise ValueError(kind)


class ExactReturn(metalearn.Learner):
    """The reference: the inner loop on minus the exact expected return (dynamic
    programming), the query loss minus the exact return after adaptation."""

    def value(self, weights, task):
        policy = tf.nn.softmax(self.forward(weights, tf.eye(MDP.states, dtype=tf.float64)))
        return MDP.expected_return(task, policy)

    def support_loss(self, weights, x, y):
        return -self.value(weights, x)

    def predict(self, weights, x):  # x: the task; the prediction: its exact return
        return self.value(weights, x)

    def task_loss(self, y_true, y_pred):
        return -y_pred


def batch_obs(x):
    """The learner's flat observations back as ``[trajectories, horizon, states]``."""
    return tf.reshape(x, [-1, MDP.horizon, MDP.states])


def _episodes(tasks=2, seed=3):
    return MDP.sample(tf.constant([seed, 0], tf.int64), tasks)


def _directions(learner, episodes, formulation="map_fn"):
    rule = metalearn.MetaGradient(keras.optimizers.SGD(1.0))
    directions, _ = tf.function(lambda e: rule.directions(
        learner, e, execution.formulation(formulation)))(episodes)
    return {i: d.numpy() for i, d in enumerate(directions)}


def _finite_differences(learner, episodes):
    """Central differences of the reference's meta-loss in every meta-variable, by
    position (the learner under test has other variable names for its pieces)."""
    variables = learner.meta_variables
    numeric = finite_difference_variables(
        lambda: learner.meta_loss(episodes, formulation="unrolled"), variables)
    return {i: numeric[v.path] for i, v in enumerate(variables)}


def _pair(kind, estimator=None):
    model = _model()
    learner = PolicyLearner(model, MDP, _adapter(kind, True), rollouts="exact",
                            estimator=estimator or DiCE(discount=1.0))
    reference = ExactReturn(model, _adapter(kind, False), loss=lambda y, p: 0.0)
    return learner, reference


@functools.lru_cache(maxsize=None)
def _pair_directions(kind, formulation="map_fn"):
    """:func:`_directions` of ``_pair(kind)``'s learner (DiCE) on ``_episodes()``, traced
    and computed once per kind and formulation: the seeded model and the fixed tasks
    make it the same figure for every test that compares with it."""
    learner, _ = _pair(kind)
    return _directions(learner, _episodes(), formulation)


@functools.lru_cache(maxsize=None)
def _exact_meta_gradient(kind):
    """:func:`_finite_differences` of ``_pair(kind)``'s reference (the exact return) on
    ``_episodes()``, computed once per kind (fixed, as :func:`_pair_directions`)."""
    _, reference = _pair(kind)
    return _finite_differences(reference, _episodes())


def test_the_exact_batch_gives_the_exact_return_and_policy_gradient():
    learner, reference = _pair("sgd")
    episode = _episodes().task(0)
    weights = learner.initial_weights()
    with tf.GradientTape() as tape:
        tape.watch(weights)
        x, batch = learner.query_data(weights, episode.query_x, episode.query_y)
        loss = learner.task_loss(batch, learner.predict(weights, x))
        exact = reference.value(weights, episode.query_x)
    np.testing.assert_allclose(float(loss), -float(exact), rtol=1e-12)
    np.testing.assert_allclose(float(tf.reduce_sum(batch.weights)), 1.0, rtol=1e-12)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(weights)
        exact_loss = -reference.value(weights, episode.query_x)
        x, batch = learner.query_data(weights, episode.query_x, episode.query_y)
        loss = learner.task_loss(batch, learner.predict(weights, x))
        per_step = DiCE(discount=1.0, mean_over_steps=True)(
            learner.policy_log_probs(weights, batch_obs(x), batch.actions, batch.mask), batch)
    dice, true = tape.gradient(loss, weights), tape.gradient(exact_loss, weights)
    assert relative_error({k: v.numpy() for k, v in dice.items()},
                          {k: v.numpy() for k, v in true.items()}) < 1e-10
    # mean_over_steps: value and gradient divided by the horizon
    np.testing.assert_allclose(float(per_step), float(loss) / MDP.horizon, rtol=1e-12)
    scaled = tape.gradient(per_step, weights)
    assert relative_error({k: MDP.horizon * v.numpy() for k, v in scaled.items()},
                          {k: v.numpy() for k, v in true.items()}) < 1e-10


@pytest.mark.parametrize("kind", ["sgd", "first_order", "sgd2", "metasgd"])
def test_meta_gradient_equals_finite_differences_of_the_exact_return(kind):
    """Second order (one and two inner steps, the second step's trajectories sampled
    with the once-adapted weights), first order and Meta-SGD's learned rates."""
    analytic = _pair_directions(kind)
    if kind == "first_order":  # theta -> -V(theta + u), u held at its value at theta
        learner, reference = _pair(kind)
        numeric = _first_order_reference(learner, reference, _episodes())
    else:
        numeric = _exact_meta_gradient(kind)
    assert relative_error(analytic, numeric) < 1e-6
    if kind == "sgd":  # and the first-order meta-gradient is another one
        assert relative_error(_pair_directions("first_order"), numeric) > 1e-2


def _first_order_reference(learner, reference, episodes):
    updates = []
    for i in range(episodes.num_tasks):
        task = episodes.task(i)
        adapted = reference.adapt(task.support_x, task.support_y).weights
        updates.append({p: adapted[p] - w for p, w in reference.initial_weights().items()})

    def loss():
        values = []
        for i in range(episodes.num_tasks):
            weights = {p: w + updates[i][p] for p, w in reference.initial_weights().items()}
            values.append(-reference.value(weights, episodes.task(i).query_x))
        return tf.add_n(values) / episodes.num_tasks

    reference.meta_loss = lambda episodes, formulation=None: loss()
    try:
        return _finite_differences(reference, episodes)
    finally:
        del reference.meta_loss


@pytest.mark.parametrize("formulation", ["unrolled", "accumulate"])
def test_other_formulations_give_the_same_meta_gradient(formulation):
    assert relative_error(_pair_directions("sgd", formulation),
                          _pair_directions("sgd", "map_fn")) < 1e-10


def test_inner_adam_applies_unchanged():
    learner, reference = _pair("adam")
    episodes = _episodes(tasks=1)
    assert relative_error(_directions(learner, episodes),
                          _finite_differences(reference, episodes)) < 1e-6


def test_the_naive_surrogate_gets_the_second_order_term_wrong():
    """log pi * A: the right policy gradient (first order agrees), the wrong Hessian."""
    episodes = _episodes()
    naive, _ = _pair("sgd", NaiveSurrogate(discount=1.0))
    assert relative_error(_directions(naive, episodes), _exact_meta_gradient("sgd")) > 1e-2
    naive_first, _ = _pair("first_order", NaiveSurrogate(discount=1.0))
    assert relative_error(_directions(naive_first, episodes),
                          _pair_directions("first_order")) < 1e-10


@pytest.mark.parametrize("baseline", [LinearFeatureBaseline, ValueNetworkBaseline])
def test_a_state_baseline_changes_no_exact_derivative(baseline):
    """With the exact batch, a baseline of the state and the step (the linear feature
    baseline; the value network, refitted per task) leaves every order of derivative
    unchanged: the Loaded-DiCE form."""
    episodes = _episodes()
    based, _ = _pair("sgd", DiCE(discount=1.0, baseline=baseline()))
    assert relative_error(_directions(based, episodes), _pair_directions("sgd")) < 1e-9


def _sampled_policy_gradients(baseline, seeds=20, rollouts=10, horizon=20):
    """``[seeds, parameters]``: the policy gradient of one 2D-navigation task estimated
    from ``rollouts`` sampled trajectories per seed, at fixed weights."""
    keras.utils.set_random_seed(0)
    mean = models.mlp((2,), hidden=(8,), outputs=2, activation="tanh")
    learner = PolicyLearner(gaussian_policy(mean), PointNavigation(horizon=horizon),
                            GradientDescent(1, 0.1, wrappers=[Rollouts()]),
                            rollouts=rollouts, estimator=DiCE(baseline=baseline))
    goal, weights = tf.constant([0.3, -0.4]), learner.initial_weights()

    @tf.function
    def gradient(seed):
        with tf.GradientTape() as tape:
            tape.watch(weights)
            x, batch = learner.query_data(weights, goal, seed)
            loss = learner.task_loss(batch, learner.predict(weights, x))
        return tf.concat([tf.reshape(g, [-1]) for g in tape.gradient(loss, weights).values()],
                         0)

    return np.stack([gradient(tf.constant([s, 7], tf.int64)).numpy() for s in range(seeds)])


def test_the_value_network_baseline_lowers_the_policy_gradients_variance():
    """Sampled trajectories (one seed per estimate, the same seeds for both): the value
    network fitted to each batch's returns cuts the total variance of the policy
    gradient many times (about 25x here) against no baseline."""
    plain = _sampled_policy_gradients(None)
    based = _sampled_policy_gradients(ValueNetworkBaseline())
    ratio = based.var(0).sum() / plain.var(0).sum()
    assert ratio < 0.2, ratio


def test_the_value_network_fits_returns_of_the_state():
    """A function of the observation and the step that a linear model of the MAML
    code's features cannot express is fitted closely (weighted, masked steps ignored)."""
    from metalearn.rl.environments import Trajectories
    rng = np.random.default_rng(1)
    observations = rng.uniform(-1, 1, size=(16, 10, 2))
    returns = np.sin(3 * observations[..., 0]) * np.cos(2 * observations[..., 1])
    returns += np.arange(10) / 10.0
    mask = np.ones((16, 10))
    mask[:, 8:] = 0
    trajectories = Trajectories(tf.constant(observations), None, tf.constant(returns * mask),
                                tf.constant(mask))
    weights = tf.ones([16], tf.float64) / 16
    residual = lambda fitted: np.mean(((fitted.numpy() - returns) ** 2)[mask > 0])
    network = residual(ValueNetworkBaseline(steps=200)(trajectories, tf.constant(returns),
                                                       weights))
    linear = residual(LinearFeatureBaseline()(trajectories, tf.constant(returns), weights))
    assert network < 0.1 * returns[mask > 0].var() and network < 0.5 * linear, (network, linear)


def test_value_network_baseline_bad_settings_are_named():
    with pytest.raises(HyperparameterRangeError, match="ValueNetworkBaseline.steps"):
        ValueNetworkBaseline(steps=0)
    with pytest.raises(HyperparameterRangeError, match="ValueNetworkBaseline.learning_rate"):
        ValueNetworkBaseline(learning_rate=-0.1)
    with pytest.raises(HyperparameterRangeError, match="ValueNetworkBaseline.hidden"):
        ValueNetworkBaseline(hidden=(16, 0))
    with pytest.raises(HyperparameterRangeError, match="ValueNetworkBaseline.reg"):
        ValueNetworkBaseline(reg=-1.0)
    with pytest.raises(ValueError, match="non-empty sequence"):
        ValueNetworkBaseline(hidden=())
    with pytest.raises(ValueError, match="nope"):
        ValueNetworkBaseline(activation="nope")


# --- rollouts, environments, estimators --------------------------------------------

def _nav_learner(seed=0, rollouts=4):
    keras.utils.set_random_seed(seed)
    mean = models.mlp((2,), hidden=(8,), outputs=2, activation="relu")
    env = PointNavigation(horizon=10)
    return PolicyLearner(gaussian_policy(mean), env,
                         GradientDescent(1, 0.1, wrappers=[Rollouts()]), rollouts=rollouts)


def test_seeded_rollouts_are_reproducible_and_the_seed_matters():
    learner = _nav_learner()
    episodes = learner.environment.sample(tf.constant([5, 0], tf.int64), 3)
    run = tf.function(lambda e: learner.meta_metrics(e, formulation="map_fn"))
    first, again = run(episodes), run(episodes)
    for name in first:
        np.testing.assert_array_equal(first[name].numpy(), again[name].numpy())
    other = learner.environment.sample(tf.constant([6, 0], tf.int64), 3)
    assert not np.allclose(run(other)["return"].numpy(), first["return"].numpy())
    # the stream is the sampler's: resumable at any step
    stream = list(learner.environment.dataset(3, seed=2, num_steps=3))
    resumed = list(learner.environment.dataset(3, seed=2, start_step=2, num_steps=1))
    for a, b in zip(tf.nest.flatten(stream[2]), tf.nest.flatten(resumed[0])):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_point_navigation_moves_clips_and_rewards_minus_the_distance():
    env = PointNavigation(horizon=5, tolerance=0.0)
    goal = tf.constant([0.3, -0.2])
    policy = lambda obs, seed: tf.tile([[5.0, 0.5]], [tf.shape(obs)[0], 1])
    t = rollout(env, goal, policy, 2, tf.constant([0, 1], tf.int64))
    assert t.observations.shape == (2, 5, 2) and t.rewards.shape == (2, 5)
    positions = np.cumsum(np.tile([[0.1, 0.05]], (5, 1)), 0)  # clipped to 1, times 0.1
    np.testing.assert_allclose(t.observations[0, 1:].numpy(), positions[:-1], rtol=1e-6)
    np.testing.assert_allclose(t.rewards[0].numpy(),
                               -np.linalg.norm(positions - [0.3, -0.2], axis=1), rtol=1e-6)
    # reaching the goal ends the episode: later steps are masked and earn nothing
    stop = rollout(PointNavigation(horizon=5, tolerance=0.06), tf.constant([0.1, 0.05]),
                   policy, 1, tf.constant([0, 1], tf.int64))
    np.testing.assert_array_equal(stop.mask[0].numpy(), [1, 0, 0, 0, 0])
    np.testing.assert_array_equal(stop.rewards[0, 1:].numpy(), 0)
    # the oracle's environment also shows the goal
    seen = rollout(PointNavigation(horizon=2, observe_goal=True), goal, policy, 3,
                   tf.constant([0, 1], tf.int64)).observations
    assert seen.shape == (3, 2, 4)
    np.testing.assert_allclose(seen[:, :, 2:].numpy(), np.broadcast_to([0.3, -0.2], (3, 2, 2)))


def test_tabular_enumeration_and_sampling_agree_with_dynamic_programming():
    task = tf.nest.map_structure(lambda t: t[0], MDP.tasks(tf.constant([1, 2]), 1))
    policy = tf.constant([[0.3, 0.7], [0.6, 0.4]], tf.float64)
    trajectories, dynamics = MDP.enumerate(task)
    probs = dynamics * tf.reduce_prod(tf.gather(
        tf.reduce_sum(trajectories.observations[..., None] * policy, -2),
        trajectories.actions, batch_dims=2), -1)
    np.testing.assert_allclose(float(tf.reduce_sum(probs)), 1.0, rtol=1e-12)
    exact = float(MDP.expected_return(task, policy))
    np.testing.assert_allclose(float(tf.reduce_sum(
        probs * tf.reduce_sum(trajectories.rewards, -1))), exact, rtol=1e-12)
    sampler = lambda obs, seed: tf.random.stateless_categorical(
        tf.math.log(tf.matmul(obs, policy)), 1, seed, dtype=tf.int32)[:, 0]
    sampled = rollout(MDP, task, sampler, 20000, tf.constant([3, 4], tf.int64))
    returns = tf.reduce_sum(sampled.rewards, -1).numpy()
    assert abs(returns.mean() - exact) < 4 * returns.std() / np.sqrt(returns.size)
    # a bandit: one state, one step; its arms are its trajectories
    bandit = TabularMDP(states=1, actions=3, horizon=1, dtype="float64")
    arms = tf.nest.map_structure(lambda t: t[0], bandit.tasks(tf.constant([1, 2]), 1))
    trajectories, dynamics = bandit.enumerate(arms)
    np.testing.assert_array_equal(trajectories.actions.numpy().ravel(), [0, 1, 2])
    np.testing.assert_array_equal(dynamics.numpy(), [1, 1, 1])
    choice = tf.constant([[0.2, 0.3, 0.5]], tf.float64)
    np.testing.assert_allclose(float(bandit.expected_return(arms, choice)),
                               float(tf.reduce_sum(choice[0] * arms.rewards[0])), rtol=1e-12)


def test_returns_gae_and_the_linear_baseline_against_numpy():
    rng = np.random.default_rng(0)
    rewards = rng.normal(size=(3, 6))
    values = rng.normal(size=(3, 6))
    mask = np.ones((3, 6))
    mask[1, 4:] = 0
    rewards *= mask
    returns = np.zeros_like(rewards)
    for t in reversed(range(6)):
        returns[:, t] = rewards[:, t] + 0.9 * (returns[:, t + 1] if t < 5 else 0)
    np.testing.assert_allclose(discounted_returns(tf.constant(rewards), 0.9), returns)
    following = np.concatenate([values[:, 1:] * mask[:, 1:], np.zeros((3, 1))], 1)
    deltas = (rewards + 0.9 * following - values * mask) * mask
    advantages = np.zeros_like(deltas)
    for t in reversed(range(6)):
        advantages[:, t] = deltas[:, t] + 0.9 * 0.8 * (advantages[:, t + 1] if t < 5 else 0)
    np.testing.assert_allclose(gae(tf.constant(rewards), tf.constant(values),
                                   tf.constant(mask), 0.9, 0.8), advantages * mask)
    np.testing.assert_allclose(gae(tf.constant(rewards), tf.constant(values),
                                   tf.constant(mask), 0.9, 1.0),
                               (returns - values) * mask, atol=1e-12)
    observations = rng.normal(size=(3, 6, 2))
    from metalearn.rl.environments import Trajectories
    fitted = LinearFeatureBaseline(reg=0.0)(
        Trajectories(tf.constant(observations), None, tf.constant(rewards), tf.constant(mask)),
        tf.constant(returns), tf.ones([3], tf.float64) / 3)
    features = LinearFeatureBaseline.features(tf.constant(observations)).numpy()
    rows = mask.astype(bool)
    coefficients = np.linalg.lstsq(features[rows], returns[rows], rcond=None)[0]
    np.testing.assert_allclose(fitted.numpy(), features @ coefficients, rtol=1e-6, atol=1e-8)


def test_bad_policies_and_adapters_are_named():
    env = PointNavigation()
    mean = models.mlp((2,), hidden=(4,), outputs=2)
    with pytest.raises(ValueError, match="gaussian_policy"):
        PolicyLearner(mean, env)  # 2 outputs: a mean only
    with pytest.raises(ValueError, match="holds no Rollouts"):
        PolicyLearner(gaussian_policy(mean), env, GradientDescent(1, 0.1))
    shared = GradientDescent(1, 0.1, wrappers=[Rollouts()])
    PolicyLearner(gaussian_policy(mean), env, shared)
    with pytest.raises(ValueError, match="already bound to another"):
        PolicyLearner(gaussian_policy(mean), env, shared)
    with pytest.raises(ValueError, match="does not take"):
        PolicyLearner(gaussian_policy(models.mlp((3,), hidden=(4,), outputs=2)), env)
    with pytest.raises(ValueError, match="'exact' needs"):
        PolicyLearner(gaussian_policy(mean), env, rollouts="exact")
    with pytest.raises(ValueError, match="continuous"):
        PolicyLearner(models.mlp((2,), outputs=4), env,
                      distribution=metalearn.rl.Categorical())


def test_one_compiled_meta_step_on_point_navigation_reports_returns():
    learner = _nav_learner(rollouts=5)
    step = metalearn.training.make_meta_step(
        learner, metalearn.MetaGradient(keras.optimizers.Adam(0.01)), "map_fn")
    stream = iter(learner.environment.dataset(2, seed=0))
    metrics = step(next(stream))
    assert set(metrics) >= {"loss", "return"}
    assert np.isfinite(float(metrics["return"])) and float(metrics["return"]) < 0


TINY = ["PointNavigation.horizon = 5", "PolicyLearner.rollouts = 2",
        "Experiment.meta_batch_size = 2", "mlp.hidden = (8,)", "Loop.log_every = 1",
        "Loop.checkpoint_every = 1"]


def _config_path():
    return os.path.join(ROOT, "experiments", "rl", "point_nav_maml.gin")


def _train(workdir, steps, params=()):
    from metalearn.training import build_experiment, parse_config, train
    parse_config([_config_path()], TINY + [f"Loop.num_steps = {steps}", *params])
    experiment = build_experiment()
    metrics = train(experiment, workdir)
    return experiment, metrics


def test_the_point_navigation_config_builds_trains_evaluates_and_resumes(tmp_path):
    from metalearn.training import evaluate
    header = open(_config_path()).read().split("\nExperiment.", 1)[0]
    assert "python -m metalearn.train" in header and "python -m metalearn.evaluate" in header
    assert "Budget" in header and "Expected" in header
    experiment, metrics = _train(str(tmp_path / "run"), 2)
    assert isinstance(experiment.learner, PolicyLearner)
    assert metrics["step"] == 2 and np.isfinite(metrics["loss"])
    report = evaluate(experiment.learner, experiment.sampler, num_tasks=4, batch_size=2,
                      inner_steps=(0, 1))
    for by_metric in report["results"].values():
        assert by_metric["return"]["mean"] < 0
    assert len(report["per_task"]["1"]["return"]) == 4
    # stopped after one step and resumed: the same weights as the uninterrupted run
    _train(str(tmp_path / "resumed"), 1)
    resumed, _ = _train(str(tmp_path / "resumed"), 2)
    for a, b in zip(experiment.learner.meta_variables, resumed.learner.meta_variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_one_binding_selects_the_value_network_baseline(tmp_path):
    binding = "DiCE.baseline = @ValueNetworkBaseline()"
    assert f"--gin_param='{binding}'" in open(_config_path()).read()
    experiment, metrics = _train(str(tmp_path / "run"), 1, [binding])
    assert isinstance(experiment.learner.estimator.baseline, ValueNetworkBaseline)
    assert metrics["step"] == 1 and np.isfinite(metrics["loss"])


def _flattened(weights):
    """``(flat, unflat)``: ``weights`` as one vector (in their order) and the map back."""
    paths = list(weights)
    flat = tf.concat([tf.reshape(weights[p], [-1]) for p in paths], 0)
    sizes = [int(tf.size(weights[p])) for p in paths]

    def unflat(vector):
        parts = tf.split(vector, sizes)
        return {p: tf.reshape(v, weights[p].shape) for p, v in zip(paths, parts)}

    return flat, unflat


def _gradient(loss_fn, weights):
    """Gradient of ``loss_fn(flat)`` at the flattened ``weights`` (no Hessian: a
    Jacobian of the gradient costs many times the gradient)."""
    flat, unflat = _flattened(weights)
    with tf.GradientTape() as tape:
        tape.watch(flat)
        loss = loss_fn(unflat(flat))
    return tape.gradient(loss, flat).numpy()


def _hessian_and_gradient(loss_fn, weights):
    """Gradient and Hessian of ``loss_fn(flat)`` at the flattened ``weights``."""
    flat, unflat = _flattened(weights)
    with tf.GradientTape() as outer:
        outer.watch(flat)
        with tf.GradientTape() as inner:
            inner.watch(flat)
            loss = loss_fn(unflat(flat))
        gradient = inner.gradient(loss, flat)
    return gradient.numpy(), outer.jacobian(gradient, flat).numpy()


@pytest.mark.parametrize("estimator, hessian_ok", [(DiCE, True), (NaiveSurrogate, False)])
def test_sampled_rollouts_estimate_the_gradient_and_hessian(estimator, hessian_ok):
    """With sampled trajectories (the learner's rollout path, not the enumeration),
    DiCE's gradient and Hessian approach the exact ones (a fixed seed and many
    trajectories: Monte Carlo error of a few per cent); the naive surrogate's Hessian
    does not."""
    model = _model()
    learner = PolicyLearner(model, MDP, _adapter("sgd", True), rollouts=20000,
                            estimator=estimator(discount=1.0))
    reference = ExactReturn(model, _adapter("sgd", False), loss=lambda y, p: 0.0)
    episode = _episodes().task(0)
    weights = learner.initial_weights()

    def sampled(w):
        x, batch = learner.query_data(w, episode.query_x, episode.query_y)
        return learner.task_loss(batch, learner.predict(w, x))

    gradient, hessian = _hessian_and_gradient(tf.function(sampled), weights)
    exact_gradient, exact_hessian = _hessian_and_gradient(
        lambda w: -reference.value(w, episode.query_x), weights)
    error = lambda a, b: np.linalg.norm(a - b) / np.linalg.norm(b)
    assert error(gradient, exact_gradient) < 0.08
    assert (error(hessian, exact_hessian) < 0.1) == hessian_ok, error(hessian, exact_hessian)


# --- ProMP's LVC estimator --------------------------------------------------------

LVC_SETTINGS = dict(discount=0.9, baseline=LinearFeatureBaseline(),
                    normalize_advantages=True, mean_over_steps=True)


def _exact_batch(estimator, masked=False, seed=1):
    """A learner on the tabular MDP's exact enumeration, its initial weights, and one
    task's ``(x, batch)`` there (advantages of ``estimator``'s settings). ``masked``:
    some episodes end early (their later steps masked, with no advantage), as
    PointNavigation's do at the goal."""
    learner = PolicyLearner(_model(seed), MDP, _adapter("sgd", True), rollouts="exact",
                            estimator=estimator)
    episode = _episodes().task(0)
    weights = learner.initial_weights()
    x, batch = learner.query_data(weights, episode.query_x, episode.query_y)
    if masked:
        mask = np.ones(batch.mask.shape)
        mask[::3, 1:] = 0  # ended after the first step
        mask[1::3, 2:] = 0  # after the second
        mask = tf.constant(mask, batch.mask.dtype)
        batch = batch._replace(mask=mask, advantages=batch.advantages * mask)
    return learner, weights, x, batch


def _loss_of(learner, estimator, x, batch):
    """``loss(weights)``: ``estimator``'s loss of the fixed ``batch`` under the policy."""
    return lambda w: estimator(
        learner.policy_log_probs(w, batch_obs(x), batch.actions, batch.mask), batch)


def _step_scores(learner, weights, x, batch):
    """``g [n, T, P]``: each step's score ``grad log pi(a_t | s_t)`` in the flattened
    weights (autodiff of the policy's log-probabilities alone: no estimator is
    involved)."""
    flat, unflat = _flattened(weights)
    with tf.GradientTape() as tape:
        tape.watch(flat)
        log_probs = learner.policy_log_probs(unflat(flat), batch_obs(x), batch.actions,
                                             batch.mask)
    return tape.jacobian(log_probs, flat).numpy()


def _closed_forms(learner, weights, x, batch, scale=1.0, hessians=True):
    """The objective's derivatives written out from the per-step scores: ``(gradient,
    LVC's Hessian, the cross terms DiCE's Hessian adds)``, each trajectory weighted by its
    weight, times ``scale`` (``1 / T`` for ``mean_over_steps``); without ``hessians``, the
    gradient alone. The per-step Hessians ``H_t`` of the log-probabilities enter LVC's
    only as ``sum_t w_t H_t``, the Hessian of ``sum_t w_t log pi_t`` (autodiff of the
    policy alone, one P x P matrix: the [n, T, P, P] per step took gigabytes)."""
    w = scale * batch.weights.numpy()[:, None] * batch.advantages.numpy()  # [n, T]
    scores = _step_scores(learner, weights, x, batch)
    gradient = np.einsum("nt,ntp->p", w, scores)
    if not hessians:
        return gradient
    _, weighted = _hessian_and_gradient(lambda v: tf.reduce_sum(
        tf.constant(w) * learner.policy_log_probs(v, batch_obs(x), batch.actions,
                                                  batch.mask)), weights)
    lvc = np.einsum("nt,ntp,ntq->pq", w, scores, scores) + weighted
    earlier = np.cumsum(scores, axis=1) - scores  # sum over t' < t of g_t'
    cross = np.einsum("nt,ntp,ntq->pq", w, scores, earlier)
    return gradient, lvc, cross + cross.T


def test_lvc_value_is_the_return_and_its_ratios_weigh_the_advantages():
    """At the sampling policy the surrogate is 0 and the objective the weighted mean
    return (DiCE's, the learner's ``loss``); on collected trajectories at other weights
    the surrogate is ``sum_t (pi_new / pi_collected - 1) A_t``, the ratios written out
    from the softmax policies' tables."""
    estimator = LVC(discount=0.9, normalize_advantages=True)
    learner, weights, x, batch = _exact_batch(estimator, masked=True)
    log_probs = learner.policy_log_probs(weights, batch_obs(x), batch.actions, batch.mask)
    np.testing.assert_array_equal(estimator.surrogate(log_probs, batch).numpy(), 0.0)
    returns = np.sum(batch.rewards.numpy() * batch.mask.numpy(), -1)
    np.testing.assert_allclose(float(estimator.objective(log_probs, batch)),
                               np.sum(batch.weights.numpy() * returns), rtol=1e-12)
    np.testing.assert_allclose(float(estimator(log_probs, batch)),
                               float(DiCE(discount=0.9)(log_probs, batch)), rtol=1e-12)
    other = {p: w + 0.3 * tf.sin(tf.reshape(tf.range(tf.size(w), dtype=w.dtype), w.shape)
                                 + 1.0) for p, w in weights.items()}
    collected = batch._replace(behaviour=log_probs)
    new = learner.policy_log_probs(other, batch_obs(x), batch.actions, batch.mask)
    table = lambda w: tf.nn.softmax(learner.predict(w, tf.eye(MDP.states, dtype=tf.float64)))
    states = np.argmax(batch_obs(x).numpy(), -1)
    actions = batch.actions.numpy()
    ratio = table(other).numpy()[states, actions] / table(weights).numpy()[states, actions]
    mask, advantages = batch.mask.numpy(), batch.advantages.numpy()
    expected = np.sum(np.where(mask > 0, ratio - 1.0, 0.0) * advantages, -1)
    np.testing.assert_allclose(estimator.surrogate(new, collected).numpy(), expected,
                               rtol=1e-10, atol=1e-14)


def test_lvc_gradient_is_dices_and_the_exact_policy_gradient():
    """First order, batch by batch: LVC's gradient is DiCE's and the naive surrogate's
    (the same sample form, ``sum_t A_t g_t``; equal up to rounding), the closed form,
    and, on the exact enumeration with undiscounted returns, the exact return's."""
    plain, weights, x, batch = _exact_batch(LVC(discount=1.0))
    episode = _episodes().task(0)
    reference = ExactReturn(plain.model, _adapter("sgd", False), loss=lambda y, p: 0.0)
    exact = _gradient(lambda w: -reference.value(w, episode.query_x), weights)
    lvc = _gradient(_loss_of(plain, LVC(discount=1.0), x, batch), weights)
    assert np.linalg.norm(lvc - exact) / np.linalg.norm(exact) < 1e-10
    for masked in (False, True):  # advantages of a baseline, normalised; episodes ending
        learner, weights, x, batch = _exact_batch(LVC(**LVC_SETTINGS), masked)
        lvc = _gradient(_loss_of(learner, LVC(**LVC_SETTINGS), x, batch), weights)
        closed = _closed_forms(learner, weights, x, batch, 1.0 / MDP.horizon,
                               hessians=False)
        assert np.linalg.norm(lvc + closed) / np.linalg.norm(closed) < 1e-12
        for other in (DiCE, NaiveSurrogate):
            gradient = _gradient(_loss_of(learner, other(**LVC_SETTINGS), x, batch), weights)
            assert np.linalg.norm(gradient - lvc) / np.linalg.norm(lvc) < 1e-12, other


def test_lvc_hessian_is_the_per_step_closed_form_and_differences_of_its_gradient():
    """LVC's Hessian on a batch is ``sum_t A_t (g_t g_t^T + H_t)`` (weighted, over the
    horizon: ``mean_over_steps``), with episodes ending early; on the same trajectories
    collected (``behaviour``: the ratio to the collecting policy, a function of the
    weights alone) central differences of its gradient give the same matrix."""
    estimator = LVC(**LVC_SETTINGS)
    learner, weights, x, batch = _exact_batch(estimator, masked=True)
    _, closed, _ = _closed_forms(learner, weights, x, batch, 1.0 / MDP.horizon)
    _, hessian = _hessian_and_gradient(_loss_of(learner, estimator, x, batch), weights)
    assert np.linalg.norm(hessian + closed) / np.linalg.norm(closed) < 1e-12
    log_probs = learner.policy_log_probs(weights, batch_obs(x), batch.actions, batch.mask)
    collected = batch._replace(behaviour=tf.stop_gradient(log_probs))
    loss = _loss_of(learner, estimator, x, collected)
    _, replayed = _hessian_and_gradient(loss, weights)
    assert np.linalg.norm(replayed + closed) / np.linalg.norm(closed) < 1e-12
    flat, unflat = _flattened(weights)

    @tf.function
    def gradient(vector):
        with tf.GradientTape() as tape:
            tape.watch(vector)
            value = loss(unflat(vector))
        return tape.gradient(value, vector)

    eps, size = 1e-5, int(flat.shape[0])
    columns = [(gradient(flat + eps * e) - gradient(flat - eps * e)).numpy() / (2 * eps)
               for e in tf.unstack(tf.eye(size, dtype=flat.dtype))]
    numeric = np.stack(columns, 1)
    assert np.linalg.norm(numeric + closed) / np.linalg.norm(closed) < 1e-7
    # not the naive surrogate's: LVC keeps the products of each step's score
    scores = _step_scores(learner, weights, x, batch)
    outer = np.einsum("nt,ntp,ntq->pq", batch.weights.numpy()[:, None]
                      * batch.advantages.numpy() / MDP.horizon, scores, scores)
    _, naive = _hessian_and_gradient(_loss_of(learner, NaiveSurrogate(**LVC_SETTINGS), x,
                                              batch), weights)
    assert np.linalg.norm(naive - hessian - outer) / np.linalg.norm(outer) < 1e-10
    assert np.linalg.norm(outer) > 0.1 * np.linalg.norm(closed)


def test_dice_hessian_is_lvcs_plus_the_cross_terms():
    """DiCE's Hessian less LVC's, on the same batch, is exactly ``sum_t A_t sum_{t' < t}
    (g_t g_t'^T + g_t' g_t^T)``: what LVC drops, and not small here."""
    learner, weights, x, batch = _exact_batch(LVC(**LVC_SETTINGS), masked=True)
    _, closed, cross = _closed_forms(learner, weights, x, batch, 1.0 / MDP.horizon)
    _, lvc = _hessian_and_gradient(_loss_of(learner, LVC(**LVC_SETTINGS), x, batch), weights)
    _, dice = _hessian_and_gradient(_loss_of(learner, DiCE(**LVC_SETTINGS), x, batch),
                                    weights)
    assert np.linalg.norm((dice - lvc) + cross) / np.linalg.norm(cross) < 1e-10
    assert np.linalg.norm(cross) > 0.1 * np.linalg.norm(closed)


def test_the_meta_gradient_through_an_lvc_inner_step_is_its_closed_form():
    """One inner step on the exact enumeration with LVC as the learner's estimator: the
    meta-gradient is ``-(I + alpha H_LVC) grad V(theta')`` per task (``theta' = theta +
    alpha grad V(theta)``, ``V`` the exact return by dynamic programming, ``H_LVC`` the
    per-step closed form on the task's trajectories), averaged; it is not the exact
    return's (that is DiCE's): LVC's Hessian is biased."""
    learner = PolicyLearner(_model(), MDP, _adapter("sgd", True), rollouts="exact",
                            estimator=LVC(discount=1.0))
    reference = ExactReturn(learner.model, _adapter("sgd", False), loss=lambda y, p: 0.0)
    episodes = _episodes()
    analytic = _directions(learner, episodes)
    analytic = np.concatenate([np.ravel(analytic[i]) for i in range(len(analytic))])
    theta = learner.initial_weights()
    flat, unflat = _flattened(theta)
    expected = []
    for i in range(episodes.num_tasks):
        task = episodes.task(i)
        value = lambda w: -reference.value(w, task.query_x)
        start = _gradient(value, theta)  # minus the exact policy gradient
        adapted = unflat(flat - ALPHA * start)
        after = _gradient(value, adapted)
        x, batch = learner.query_data(theta, task.support_x, task.support_y)
        _, curvature, _ = _closed_forms(learner, theta, x, batch)
        expected.append(after + ALPHA * curvature @ after)
    expected = np.mean(expected, 0)
    assert np.linalg.norm(analytic - expected) / np.linalg.norm(expected) < 1e-10
    exact = _exact_meta_gradient("sgd")  # this reference's (the same model and adapter)
    exact = np.concatenate([np.ravel(exact[i]) for i in range(len(exact))])
    assert np.linalg.norm(analytic - exact) / np.linalg.norm(exact) > 1e-3


def test_lvc_bad_settings_are_named():
    with pytest.raises(HyperparameterRangeError,
                       match=r"LVC\.discount must be in \[0, 1\], got -0\.5"):
        LVC(discount=-0.5)
    with pytest.raises(HyperparameterRangeError, match=r"LVC\.gae_lambda .*got 1\.5"):
        LVC(gae_lambda=1.5)
    with pytest.raises(TypeError, match="baseline must be callable"):
        LVC(baseline="linear")


def _promp_config():
    return os.path.join(ROOT, "experiments", "rl", "point_nav_promp.gin")


def test_the_promp_config_adapts_with_lvc_and_takes_a_meta_step(tmp_path):
    """experiments/rl/point_nav_promp.gin (shrunk, one epoch) builds with LVC as the
    inner estimator, holding the config's DiCE settings (gin applies a base class's
    bindings to its subclasses), and trains one step; the estimator of the published
    figure is the one binding its header names."""
    from metalearn.training import build_experiment, parse_config, train
    expected = dict(discount=0.99, gae_lambda=1.0, normalize_advantages=True,
                    mean_over_steps=True)
    binding = "PolicyLearner.estimator = @DiCE()"
    assert f"--gin_param='{binding}'" in open(_promp_config()).read()
    for params, kind in (([], LVC), ([binding], DiCE)):
        parse_config([_promp_config()], TINY + ["Loop.num_steps = 1",
                                                "ClippedRatio.epochs = 1", *params])
        try:
            experiment = build_experiment()
            estimator = experiment.learner.estimator
            assert type(estimator) is kind
            assert {k: getattr(estimator, k) for k in expected} == expected
            assert isinstance(estimator.baseline, LinearFeatureBaseline)
            if kind is LVC:
                metrics = train(experiment, str(tmp_path / "run"))
        finally:
            gin.clear_config()
    assert metrics["step"] == 1 and np.isfinite(metrics["loss"])
    assert np.isfinite(metrics["return"])
