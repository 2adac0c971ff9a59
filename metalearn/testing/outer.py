"""The contract every outer rule meets: one step under every formulation, on one device
and under a strategy, with and without XLA, equal in float64 to the rule's reference
computed one task at a time.

A new outer rule gets the whole contract by writing one small test class::

    from metalearn.testing import OuterRuleContract, task_meta_gradient

    class TestMyRule(OuterRuleContract):
        covers = (MyRule,)
        def make_rule(self):
            return MyRule(keras.optimizers.SGD(0.5))
        def reference_step(self, learner, episodes):
            ...   # the meta-variables after one step, by path, one task at a time

Nothing here imports pytest.
"""

from __future__ import annotations

import abc
from typing import Dict, List, Optional, Sequence, Tuple

import keras
import numpy as np
import tensorflow as tf

import metalearn
from metalearn import execution
from metalearn.adapters import GradientDescent
from metalearn.tasks.episode import Episode
from metalearn.testing.reference import finite_difference_variables
from metalearn.testing.tasks import mse, regression_episodes

FORMULATIONS = ("map_fn", "unrolled", "batched", "accumulate", "auto")


def task_meta_gradient(learner: metalearn.Learner, episode: Episode) -> List[np.ndarray]:
    """One task's meta-gradient (of its query loss after adaptation), eagerly, with one
    tape around :meth:`Learner.run_task`: no formulation involved."""
    with tf.GradientTape() as tape:
        loss = learner.run_task(episode).metrics["loss"]
    return [g.numpy() for g in tape.gradient(loss, learner.meta_variables)]


def task_adapted(learner: metalearn.Learner, episode: Episode,
                 weights: Optional[Dict[str, tf.Tensor]] = None) -> Dict[str, np.ndarray]:
    """One task's adapted weights by path, eagerly (from ``weights`` or the model's)."""
    adapted = learner.adapt(episode.support_x, episode.support_y, weights=weights)
    return {p: np.asarray(w) for p, w in adapted.weights.items()}


def values(learner: metalearn.Learner) -> Dict[str, np.ndarray]:
    """The learner's meta-variables' values by path."""
    return {v.path: v.numpy() for v in learner.meta_variables}


def evolution_noise(seed: Sequence[int], pair: int, k: int, shape: Sequence[int]
                    ) -> np.ndarray:
    """Evolution strategies' noise by hand: Philox bits under the documented seed
    derivation, Box-Muller in numpy (float64)."""
    fold = lambda s, d: tf.random.experimental.stateless_fold_in(
        s, tf.constant(d, tf.int64), alg="philox")
    key = fold(fold(tf.constant(seed, tf.int64), pair), k)
    size = max(int(np.prod(shape)), 1)
    bits = tf.random.stateless_uniform([2, size], seed=key, dtype=tf.uint32, minval=None,
                                       maxval=None, alg="philox").numpy().astype(np.float64)
    u = (bits + 0.5) / 2.0 ** 32
    z = np.sqrt(-2.0 * np.log(u[0])) * np.cos(2.0 * np.pi * u[1])
    return z[:int(np.prod(shape))].reshape(shape)


def evolution_estimate(learner: metalearn.Learner, episodes: Episode, population: int,
                       sigma: float, seed: int, step: int = 0, ranks: bool = False,
                       inner_steps: Optional[int] = None) -> List[np.ndarray]:
    """The ES estimate by hand: each task's query loss at theta +- sigma eps_j, the
    variables assigned and restored, one task at a time, eagerly; the pair weights are the
    mean over tasks of the antithetic differences (or of the centred ranks of the mean
    losses). ``inner_steps``: the adapter's steps unless given (PES's first segment
    is ES on a loop of ``truncation`` steps)."""
    variables = learner.meta_variables
    start = [v.numpy() for v in variables]
    eps = [[evolution_noise([seed, step], j, k, v.shape) for k, v in enumerate(variables)]
           for j in range(population)]

    def loss_at(values):
        for variable, value in zip(variables, values):
            variable.assign(value)
        return np.mean([learner.run_task(episodes.task(i), inner_steps).metrics["loss"].numpy()
                        for i in range(episodes.num_tasks)])

    plus = np.array([loss_at([w + sigma * e for w, e in zip(start, eps[j])])
                     for j in range(population)])
    minus = np.array([loss_at([w - sigma * e for w, e in zip(start, eps[j])])
                      for j in range(population)])
    for variable, value in zip(variables, start):
        variable.assign(value)
    if ranks:
        both = np.concatenate([plus, minus])
        centred = np.argsort(np.argsort(both, kind="stable"), kind="stable") / (
            2 * population - 1) - 0.5
        plus, minus = centred[:population], centred[population:]
    return [sum((plus[j] - minus[j]) * eps[j][k] for j in range(population))
            / (2 * population * sigma) for k in range(len(variables))]


def carried_segment_gradients(rule: "metalearn.outer.TruncatedUnroll",
                              learner: metalearn.Learner, episodes: Episode,
                              segment: int = 1,
                              formulation: Optional[execution.Formulation] = None,
                              eps: float = 1e-5
                              ) -> Tuple[Dict[str, np.ndarray], Dict[str, np.ndarray]]:
    """A :class:`~metalearn.outer.TruncatedUnroll`'s direction at segment ``segment`` of
    a horizon, and its reference: float64 central differences of that segment's mean
    query loss in every meta-variable, from the carried state the earlier segments
    (run here on ``episodes``) left, held constant. Returns ``(analytic, numeric)`` by
    meta-variable path, for :func:`relative_error`. ``rule``: a new rule, built here;
    nothing is applied to the meta-variables."""
    formulation = formulation or execution.MapFn()
    rule.build(learner)
    hand_back = lambda learner, directions, metrics: {f"direction_{k}": d
                                                      for k, d in enumerate(directions)}
    step = tf.function(lambda batch: rule.step(learner, batch, formulation,
                                               apply=hand_back))
    for _ in range(segment):
        step(episodes)
    saved = [v.numpy() for v in rule.carried]
    figures = step(episodes)
    analytic = {v.path: figures[f"direction_{k}"].numpy()
                for k, v in enumerate(learner.meta_variables)}

    def segment_loss():
        for variable, value in zip(rule.carried, saved):
            variable.assign(value)
        rule.position.assign(segment)
        _, weights, state, _ = rule.read_carried()
        _, _, metrics = rule.segment(learner, rule.horizon_episodes(episodes), formulation,
                                     weights, state)
        return tf.reduce_mean(metrics["loss"])

    return analytic, finite_difference_variables(segment_loss, learner.meta_variables, eps)


def two_replicas() -> tf.distribute.MirroredStrategy:
    """A ``MirroredStrategy`` on the first two logical CPU devices: the contracts'
    strategy case, two replicas on one machine.

    Raises:
      RuntimeError: fewer than two logical CPUs; split the CPU before TensorFlow starts
        (``tf.config.set_logical_device_configuration(tf.config.list_physical_devices(
        "CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2)``, as the project's
        ``tests/conftest.py`` does).
    """
    devices = [d.name for d in tf.config.list_logical_devices("CPU")]
    if len(devices) < 2:
        raise RuntimeError(
            f"the contracts' strategy case runs on two replicas, but TensorFlow has "
            f"{len(devices)} logical CPU device(s) {devices}: split the CPU into two before "
            "TensorFlow starts (tf.config.set_logical_device_configuration(tf.config."
            "list_physical_devices('CPU')[0], [tf.config.LogicalDeviceConfiguration()] "
            "* 2), e.g. in a conftest.py)")
    # reduced on one device: TensorFlow's collectives cannot be reused across the
    # strategies of one process, and a contract makes one per case
    return tf.distribute.MirroredStrategy(
        devices[:2], cross_device_ops=tf.distribute.ReductionToOneDevice())


class OuterRuleContract(abc.ABC):
    """Abstract test class: subclass it and implement :meth:`make_rule` and
    :meth:`reference_step`; override :meth:`make_learner` / :meth:`make_episodes`
    where the rule needs another learner (the default: a float64 MLP 2-4-1 with two
    second-order inner steps, four regression tasks)."""

    covers: tuple = ()
    """The classes this case exercises."""
    formulations: Sequence[str] = FORMULATIONS
    tolerance: float = 1e-10
    _expected: Dict[type, Dict[str, np.ndarray]] = {}  # expected_step's, by test class

    @abc.abstractmethod
    def make_rule(self) -> metalearn.outer.OuterRule:
        """A fresh outer rule."""

    @abc.abstractmethod
    def reference_step(self, learner: metalearn.Learner, episodes: Episode
                       ) -> Dict[str, np.ndarray]:
        """The meta-variables after one step of the rule on ``episodes``, by path,
        computed without the library's formulations (one task at a time, eagerly;
        :func:`task_meta_gradient`, :func:`task_adapted`). Called once per test class
        (:meth:`expected_step`)."""

    def make_learner(self) -> metalearn.Learner:
        keras.utils.set_random_seed(5)
        model = metalearn.models.mlp((2,), hidden=(4,), outputs=1, activation="tanh",
                                     dtype="float64")
        return metalearn.Learner(model, GradientDescent(2, 0.1), loss=mse)

    def make_episodes(self) -> Episode:
        return regression_episodes(tasks=4, shots=4)

    def after_step(self, formulation: str, jit_compile: bool = False,
                   strategy: Optional[tf.distribute.Strategy] = None
                   ) -> Dict[str, np.ndarray]:
        """The meta-variables after one compiled step of :meth:`make_rule`."""
        given, strategy = strategy is not None, strategy or tf.distribute.get_strategy()
        with strategy.scope():
            learner = self.make_learner()
        step = metalearn.training.make_meta_step(
            learner, self.make_rule(), execution.formulation(formulation),
            jit_compile=jit_compile, skip_non_finite=True, strategy=strategy)
        episodes = self.make_episodes()
        if given:  # per-replica episodes, as the training loop's stream gives them
            episodes = metalearn.training.distribute.split_episodes(strategy, episodes)
        metrics = step(episodes)
        assert not np.any(metrics["non_finite"].numpy()), metrics["non_finite"]
        return values(learner)

    def distinct_formulations(self) -> List[str]:
        """The formulations the XLA and strategy cases run: :attr:`formulations` less
        ``"auto"`` where Auto would run one of the others (on a CPU it always runs
        ``accumulate``), and less ``"unrolled"`` where others remain (the per-task
        reference, which Auto never chooses: a Python loop of plain ops, with no control
        flow of its own for XLA or a strategy to meet). Each formulation Auto may run
        is then compiled and distributed once; the plain case runs every other one
        (:meth:`plain_formulations`)."""
        names = list(self.formulations)
        if "auto" in names:
            chosen = execution.Auto().choice(self.make_learner(), self.make_episodes()).mode
            if chosen in names:
                names.remove("auto")
        if "unrolled" in names and len(names) > 1:
            names.remove("unrolled")
        return names

    def plain_formulations(self) -> List[str]:
        """The formulations the plain case runs: :attr:`formulations`, less the one
        ``Auto`` runs here when ``"auto"`` is among them (on a CPU ``accumulate``): under
        Auto that formulation's every call runs, op for op, through the rule's handling
        of Auto, and the XLA and strategy cases run it by its own name."""
        names = list(self.formulations)
        if "auto" in names:
            chosen = execution.Auto().choice(self.make_learner(), self.make_episodes()).mode
            if chosen in names:
                names.remove(chosen)
        return names

    def expected_step(self) -> Dict[str, np.ndarray]:
        """:meth:`reference_step` on a fresh :meth:`make_learner` and
        :meth:`make_episodes`, computed once per test class (both are fixed, so every
        case of the contract compares with the same values), after checking that it
        moves some meta-variable."""
        cache = OuterRuleContract._expected
        if type(self) not in cache:
            expected = self.reference_step(self.make_learner(), self.make_episodes())
            start = values(self.make_learner())
            assert any(not np.allclose(start[p], expected[p]) for p in start), \
                "the reference step moves nothing"
            cache[type(self)] = expected
        return cache[type(self)]

    def _check(self, jit_compile: bool, strategy=None,
               formulations: Optional[Sequence[str]] = None) -> None:
        expected = self.expected_step()
        name = type(self.make_rule()).__name__
        for formulation in formulations or self.formulations:
            found = self.after_step(formulation, jit_compile, strategy)
            for path, value in expected.items():
                np.testing.assert_allclose(
                    found[path], value, rtol=self.tolerance, atol=self.tolerance,
                    err_msg=f"{name} under {formulation} "
                            f"(jit_compile={jit_compile}, strategy={strategy}): {path}")

    # --- the contract -------------------------------------------------------------

    def test_every_formulation(self):
        self._check(jit_compile=False, formulations=self.plain_formulations())

    def test_every_formulation_under_xla(self):
        self._check(jit_compile=True, formulations=self.distinct_formulations())

    def test_every_formulation_under_a_strategy(self):
        """On two replicas, each holding half the tasks: a rule whose update depends on
        how the tasks are dealt to replicas (one that only sees its replica's tasks
        where it needs the whole batch) fails it."""
        rule = self.make_rule()
        if rule.interleaves_updates or rule.replicas_unsupported:  # one replica only:
            try:  # it must say so, by name
                self.after_step(self.formulations[0], strategy=two_replicas())
            except ValueError as error:
                assert "replicas" in str(error), error
                return
            raise AssertionError(f"{type(rule).__name__} runs on one replica only "
                                 "(interleaves_updates or replicas_unsupported), yet ran "
                                 "on two without refusing")
        self._check(jit_compile=False, strategy=two_replicas(),
                    formulations=self.distinct_formulations())
