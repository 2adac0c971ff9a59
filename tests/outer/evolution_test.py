"""Evolution strategies as an outer rule: the estimate converges to the exact
meta-gradient as the population grows (cosine similarity rising, variance falling as
1/population, fixed seeds and stated tolerances), centred ranks by hand, the noise
seeded by the rule's seed and the step counter (a resumed run is bit-identical), bad
input named. The contract case (every formulation, XLA, a strategy, against a per-task
float64 reference) is in tests/outer/outer_rules_test.py."""

import os

import gin
import keras
import numpy as np
import pytest
import tensorflow as tf

import metalearn
from metalearn.adapters import GradientDescent
from metalearn.outer import EvolutionStrategies
from metalearn.outer.evolution import centred_ranks, noise
from metalearn.tasks import Episode
from metalearn.testing import OuterRuleContract, evolution_estimate, mse, values
from metalearn.training import build_experiment, parse_config, restore, train
from metalearn.repository import ROOT
from tests.neural_process_fixtures import latent_learner
from tests.objective_fixtures import ShiftedObjective

ES_GIN = os.path.join(ROOT, "experiments", "sinusoid", "maml_es.gin")


def linear_tasks(tasks=4, shots=5, dim=2, seed=0):
    """float64 linear regression tasks ``y = x w_t + b_t``."""
    keys = tf.random.experimental.stateless_split([seed, 7], 4)
    normal = lambda key, shape: tf.random.stateless_normal(shape, key, dtype=tf.float64)
    w, b = normal(keys[0], [tasks, dim, 1]), normal(keys[1], [tasks, 1, 1])
    support_x, query_x = normal(keys[2], [tasks, shots, dim]), normal(keys[3], [tasks, shots, dim])
    return Episode(support_x, support_x @ w + b, query_x, query_x @ w + b)


def tiny_maml():
    """MAML (one second-order step) on a float64 MLP 2-4-1 tanh: 17 meta-variables' entries."""
    keras.utils.set_random_seed(1)
    model = metalearn.models.mlp((2,), hidden=(4,), outputs=1, activation="tanh",
                                 dtype="float64")
    return metalearn.Learner(model, GradientDescent(1, 0.1), loss=mse)


def flat(tensors):
    return np.concatenate([np.asarray(t).ravel() for t in tensors])


def test_estimate_converges_to_the_meta_gradient_with_the_population():
    """R = 24 estimates per population size (each step's noise from ``meta_step = r``).
    For a smooth meta-loss and small sigma, one antithetic pair's estimate
    ``(eps . g) eps`` has total variance ``(D + 1) |g|^2``, so N pairs have
    ``(D + 1) |g|^2 / N``. Tolerances: the normalised variance within 30 % of 1 (its
    sampling error at R = 24 is about 10 %), the ratio between populations 4x apart
    within [2.4, 6.4]."""
    learner, episodes = tiny_maml(), linear_tasks()
    formulation = metalearn.execution.MapFn()
    exact = flat(formulation.gradients(learner, episodes, learner.meta_variables)[0])
    dims, repeats = exact.size, 24
    cosine = lambda g: g @ exact / np.linalg.norm(g, axis=-1) / np.linalg.norm(exact)
    mean_cosine, variance = {}, {}
    for population in (2, 8, 32):
        rule = EvolutionStrategies(keras.optimizers.SGD(0.1), population=population,
                                   sigma=1e-3, seed=population)
        estimate = tf.function(lambda: rule.directions(learner, episodes, formulation)[0])
        found = []
        for r in range(repeats):
            learner.meta_step.assign(r)
            found.append(flat(estimate()))
        found = np.array(found)
        mean_cosine[population] = float(np.mean(cosine(found)))
        variance[population] = np.sum((found - found.mean(0)) ** 2) / (repeats - 1)
        normalised = population * variance[population] / ((dims + 1) * exact @ exact)
        assert 0.7 < normalised < 1.3, (population, normalised)
    assert mean_cosine[2] < mean_cosine[8] < mean_cosine[32], mean_cosine
    assert mean_cosine[32] > 0.7, mean_cosine
    assert cosine(found.mean(0)) > 0.98  # 24 x 32 pairs
    for small, large in ((2, 8), (8, 32)):
        assert 2.4 < variance[small] / variance[large] < 6.4, variance


def test_centred_ranks_by_hand():
    fitness = tf.constant([3.0, -1.0, 7.0, 0.5], tf.float64)
    np.testing.assert_allclose(centred_ranks(fitness).numpy(), [1 / 6, -0.5, 0.5, -1 / 6])
    learner, episodes = tiny_maml(), linear_tasks()
    learner.meta_step.assign(5)
    rule = EvolutionStrategies(keras.optimizers.SGD(0.1), population=3, sigma=0.05,
                               centred_ranks=True, seed=2)
    found, metrics = rule.directions(learner, episodes, metalearn.execution.Unrolled())
    expected = evolution_estimate(learner, episodes, 3, 0.05, seed=2, step=5, ranks=True)
    for f, e in zip(found, expected):
        np.testing.assert_allclose(f.numpy(), e, rtol=1e-10, atol=1e-12)
    assert metrics["loss"].shape == (episodes.num_tasks,)


def test_every_meta_variable_is_perturbed_and_moved():
    """Meta-SGD's learned rates are meta-variables of a piece: ES perturbs and moves them
    with the model's weights (``Learner.objective``): 256 pairs, every coordinate of the
    estimate within 4 standard deviations of the exact meta-gradient's."""
    keras.utils.set_random_seed(1)
    model = metalearn.models.mlp((2,), hidden=(4,), outputs=1, activation="tanh",
                                 dtype="float64")
    learner = metalearn.Learner(model, metalearn.adapters.MetaSGD(1, 0.1), loss=mse)
    episodes, formulation = linear_tasks(), metalearn.execution.MapFn()
    paths = [v.path for v in learner.meta_variables]
    assert sum(p.endswith("_lr") for p in paths) == 4 and len(paths) == 8, paths
    exact = formulation.gradients(learner, episodes, learner.meta_variables)[0]
    rule = EvolutionStrategies(keras.optimizers.SGD(0.1), population=256, sigma=1e-3)
    found, _ = tf.function(lambda: rule.directions(learner, episodes, formulation))()
    for path, f in zip(paths, found):
        assert np.all(f.numpy() != 0), path
    exact, found = flat(exact), flat(found)
    # one coordinate's variance over N pairs: (|g|^2 + g_i^2) / N; within 4 of its SD
    bound = 4 * np.sqrt((exact @ exact + exact ** 2) / rule.population)
    assert np.all(np.abs(found - exact) <= bound), (found - exact) / bound
    assert found @ exact / np.linalg.norm(found) / np.linalg.norm(exact) > 0.8


def test_figures_are_the_population_mean():
    """The reported per-task loss is the mean over the 2 N members (the smoothed
    meta-loss), not the loss at the unperturbed values."""
    learner, episodes = tiny_maml(), linear_tasks()
    rule = EvolutionStrategies(keras.optimizers.SGD(0.1), population=2, sigma=0.5)
    _, metrics = rule.directions(learner, episodes, metalearn.execution.MapFn())
    seed = rule.step_seed(learner)
    members = []
    for j in range(2):
        eps = rule.perturbations(learner, seed, j)
        for sign in (1.0, -1.0):
            members.append(metalearn.learners.objective(learner, 
                [v + sign * 0.5 * e for v, e in zip(learner.meta_variables, eps)],
                episodes)["loss"].numpy())
    np.testing.assert_allclose(metrics["loss"].numpy(), np.mean(members, axis=0), rtol=1e-12)


def test_noise_is_standard_gaussian_and_seeded():
    seed = tf.constant([4, 9], tf.int64)
    [z] = noise(seed, [[200_000]], [tf.float64])
    z = z.numpy()
    assert abs(z.mean()) < 0.01 and abs(z.std() - 1) < 0.01  # 4.5 and 2 standard errors
    assert abs(np.mean(z ** 4) - 3) < 0.1  # Gaussian kurtosis
    np.testing.assert_array_equal(noise(seed, [[200_000]], [tf.float64])[0], z)
    eager = noise(seed, [[1000]], [tf.float32])[0].numpy()
    compiled = tf.function(lambda: noise(seed, [[1000]], [tf.float32]), jit_compile=True)
    np.testing.assert_allclose(compiled()[0].numpy(), eager, rtol=1e-5, atol=1e-5)  # XLA
    learner = tiny_maml()
    rule = EvolutionStrategies(population=2, seed=1)
    first = rule.perturbations(learner, rule.step_seed(learner), 0)
    again = rule.perturbations(learner, rule.step_seed(learner), 0)
    other_pair = rule.perturbations(learner, rule.step_seed(learner), 1)
    learner.meta_step.assign(1)
    next_step = rule.perturbations(learner, rule.step_seed(learner), 0)
    other_seed = EvolutionStrategies(seed=2).perturbations(learner, tf.constant([2, 0],
                                                                                tf.int64), 0)
    np.testing.assert_array_equal(flat(first), flat(again))
    for different in (other_pair, next_step, other_seed):
        assert not np.allclose(flat(first), flat(different))


LR = 0.5


class RankedCase(OuterRuleContract):
    """The contract's ES case (tests/outer/outer_rules_test.py) with centred ranks (not
    collected: its name does not start with Test)."""
    covers = (EvolutionStrategies,)
    ranks = True

    def make_rule(self):
        return EvolutionStrategies(keras.optimizers.SGD(LR), population=2, sigma=0.1, seed=3,
                                   centred_ranks=self.ranks)

    def reference_step(self, learner, episodes):
        estimate = evolution_estimate(learner, episodes, population=2, sigma=0.1, seed=3,
                                ranks=self.ranks)
        return {v.path: v.numpy() - LR * g for v, g in zip(learner.meta_variables, estimate)}


def test_two_replicas_make_the_whole_meta_batch_s_step():
    """Each of two replicas (logical CPUs, tests/conftest.py) evaluates the population on
    half the tasks; the step equals the reference on all four: centred ranks of the
    fitnesses averaged over replicas, under XLA with the all-reduce between the compiled
    parts. (Raw losses average linearly through the optimizer's all-reduce, as the
    gradient rule's do; the contract runs them under a one-replica strategy.)"""
    case, jit_compile = RankedCase(), True
    expected = case.reference_step(case.make_learner(), case.make_episodes())
    # reduce_to_one_device: default collectives of several MirroredStrategy objects in
    # one process share instance keys (as in tests/training/distribute_test.py)
    strategy = metalearn.training.distribute.make_strategy(
        "mirrored", ["/cpu:0", "/cpu:1"], cross_device_ops="reduce_to_one_device")
    found = case.after_step("map_fn", jit_compile, strategy)
    for path, value in expected.items():
        np.testing.assert_allclose(found[path], value, rtol=1e-10, atol=1e-10, err_msg=path)


SMALL = ["Experiment.meta_batch_size = 4", "mlp.hidden = (8,)", "Loop.log_every = 2",
         "Loop.checkpoint_every = 2", "EvolutionStrategies.population = 2",
         "keras.optimizers.Adam.learning_rate = 0.01"]


def test_a_resumed_run_draws_the_same_noise(tmp_path):
    """The gin config trains with ES; a run stopped after 3 steps and resumed ends
    bit-identical to an uninterrupted run of 5 (the noise depends on the checkpointed
    step counter, not on a generator's state)."""
    try:
        parse_config([ES_GIN], SMALL + ["Loop.num_steps = 5"])
        experiment = build_experiment()
        assert isinstance(experiment.outer_rule, EvolutionStrategies)
        assert experiment.outer_rule.population == 2
        whole = str(tmp_path / "whole")
        assert train(experiment, whole)["step"] == 5
        broken = str(tmp_path / "broken")
        parse_config([ES_GIN], SMALL + ["Loop.num_steps = 3"])
        train(build_experiment(), broken)
        parse_config([ES_GIN], SMALL + ["Loop.num_steps = 5"])
        train(build_experiment(), broken)
        resumed, expected = restore(broken).learner, restore(whole).learner
        assert int(resumed.meta_step.numpy()) == 5
        for path, value in values(expected).items():
            np.testing.assert_array_equal(values(resumed)[path], value, err_msg=path)
    finally:
        gin.clear_config()


@pytest.mark.parametrize("keyword, value, message", [
    ("sigma", 0.0, r"sigma \(the noise scale\) must be > 0, got 0.0"),
    ("sigma", -0.1, r"sigma \(the noise scale\) must be > 0, got -0.1"),
    ("sigma", float("inf"), r"sigma .* got inf"),
    ("population", 0, r"population \(antithetic pairs\) must be a whole number >= 1, got 0"),
    ("population", 2.5, r"population .* got 2.5"),
    ("seed", 1.5, r"seed must be a whole number, got 1.5")])
def test_bad_input_is_named(keyword, value, message):
    with pytest.raises(ValueError, match=f"EvolutionStrategies.{message}"):
        EvolutionStrategies(**{keyword: value})


def objective_learner(kind):
    """Three inner steps on a float64 linear model (so every objective below is a
    quadratic of the meta-variables), or the latent NP (its ELBO, smooth)."""
    keras.utils.set_random_seed(1)
    if kind == "latent np":
        return latent_learner(x_size=2, representation=3, latent=2, hidden=(3,),
                              dtype="float64")
    model = metalearn.models.mlp((2,), hidden=(), outputs=1, dtype="float64")
    if kind == "maml++":
        return metalearn.MultiStepLossLearner(model, GradientDescent(3, 0.2), loss=mse,
                                              anneal_steps=10 ** 6)
    cls = ShiftedObjective if kind == "subclass" else metalearn.Learner
    return cls(model, GradientDescent(3, 0.2), loss=mse)


@pytest.mark.parametrize("kind, sigma, tolerance", [
    ("plain", 0.3, 1e-10), ("maml++", 0.3, 1e-10), ("subclass", 0.3, 1e-10),
    ("latent np", 1e-4, 1e-6)])
def test_an_objective_changing_learner_s_expectation_is_the_meta_gradient(
        kind, sigma, tolerance):
    """ES descends the learner's own objective (objective_of), the one MetaGradient
    differentiates. On a quadratic objective each antithetic difference is exactly
    ``2 sigma eps . g``, so with the rule's own noise the estimate is
    ``mean_j eps_j eps_j^T g`` (whose expectation is ``g``) for any sigma, to rounding
    (1e-10 relative); for the latent NP's smooth ELBO, to ``O(sigma^2)`` (1e-6 at
    sigma = 1e-4). A rule that measured the last step's query loss instead would miss
    by the objective's change, which the plain learner's gradient shows is not small."""
    learner = objective_learner(kind)
    episodes = linear_tasks(tasks=3, shots=4)
    formulation = metalearn.execution.MapFn()
    exact = flat(formulation.gradients(learner, episodes, learner.meta_variables)[0])
    rule = EvolutionStrategies(keras.optimizers.SGD(0.1), population=6, sigma=sigma, seed=3)
    found, _ = rule.directions(learner, episodes, formulation)
    seed = rule.step_seed(learner)
    eps = np.array([flat(rule.perturbations(learner, seed, j))
                    for j in range(rule.population)])
    expected = eps.T @ (eps @ exact) / rule.population
    scale = np.linalg.norm(expected)
    np.testing.assert_allclose(flat(found), expected, rtol=0, atol=tolerance * scale)
    if kind in ("maml++", "subclass"):  # the objective matters
        plain = objective_learner("plain")
        other = flat(formulation.gradients(plain, episodes, plain.meta_variables)[0])
        assert np.linalg.norm(other - exact) > 1e-3 * np.linalg.norm(exact)
