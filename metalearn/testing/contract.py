"""The contract every learner and inner-loop piece meets, as an abstract test class.

A new algorithm gets the whole contract by writing one small class::

    class TestMyAdapter(LearnerContract):
        covers = (MyAdapter,)
        def make_learner(self):
            return classification_learner(MyAdapter(steps=2))

``covers`` lists the classes the case exercises; the project's own tests check that
every exported adapter, update, wrapper, head, task initialiser, learner and outer rule
is covered by some case.

The tasks of :class:`LearnerContract` are tiny synthetic N-way classification problems:
each task draws ``ways`` random class centres in ``dim`` dimensions and Gaussian
examples around them, so a label means nothing across tasks (a model that has not seen
the support set is at chance) and the classes of one task are well separated (one
episode can be fitted). :class:`RegressionContract` runs the same contract on linear
regression tasks ``y = x . w_task`` (:func:`synthetic_regression`): ``w_task`` is drawn
per task, so a model that has not seen the support set cannot beat predicting zero.

What the contract measures on and what its meta-steps train on are two hooks,
:meth:`LearnerContract.episodes` and :meth:`LearnerContract.training_episodes`: a
learner that is not trained on episodes (a pre-training baseline trained on whole-class
batches) overrides the second.
"""

from __future__ import annotations

import abc
from typing import Dict, List, Optional

import keras
import numpy as np
import tensorflow as tf

import metalearn
from metalearn import models
from metalearn.functional import softmax_cross_entropy
from metalearn.tasks import Episode

WAYS = 3
"""Classes per task of the contract's synthetic episodes."""
SHOTS = 2
"""Support examples per class of the contract's synthetic episodes."""
QUERIES = 4
"""Query examples per class of the contract's synthetic episodes."""
DIM = 6
"""Features of an example of the contract's synthetic episodes."""


def synthetic_classification(seed: int, tasks: int, ways: int = WAYS, shots: int = SHOTS,
                             queries: int = QUERIES, dim: int = DIM, spread: float = 2.0,
                             dtype=tf.float32) -> Episode:
    """A batch of ``ways``-way ``shots``-shot tasks on Gaussian clusters, ``[tasks, ...]``.

    Examples are ordered by class (``ways`` blocks); labels are ``0 .. ways - 1``.
    """
    keys = tf.random.experimental.stateless_split([seed, 7], 3)
    centres = spread * tf.random.stateless_normal([tasks, ways, 1, dim], keys[0], dtype=dtype)

    def examples(key, count):  # [tasks, ways * count, dim]
        noise = tf.random.stateless_normal([tasks, ways, count, dim], key, dtype=dtype)
        return tf.reshape(centres + noise, [tasks, ways * count, dim])

    labels = lambda count: tf.tile(tf.repeat(tf.range(ways), count)[None], [tasks, 1])
    return Episode(examples(keys[1], shots), labels(shots), examples(keys[2], queries),
                   labels(queries))


def synthetic_regression(seed: int, tasks: int, shots: int = SHOTS * WAYS,
                         queries: int = QUERIES * WAYS, dim: int = DIM, noise: float = 0.05,
                         dtype=tf.float32) -> Episode:
    """A batch of linear regression tasks ``y = x . w_task + noise``, ``[tasks, ...]``:
    inputs ``[tasks, n, dim]``, targets ``[tasks, n, 1]``; ``w_task`` standard normal,
    so targets have variance about ``dim`` and mean zero over tasks."""
    keys = tf.random.experimental.stateless_split([seed, 13], 5)
    w = tf.random.stateless_normal([tasks, dim, 1], keys[0], dtype=dtype)

    def examples(key, noise_key, count):
        x = tf.random.stateless_normal([tasks, count, dim], key, dtype=dtype)
        return x, x @ w + noise * tf.random.stateless_normal([tasks, count, 1], noise_key,
                                                             dtype=dtype)

    return Episode(*examples(keys[1], keys[2], shots), *examples(keys[3], keys[4], queries))


def uninformative_support(episodes: Episode, seed: int = 0) -> Episode:
    """``episodes`` with each task's support labels shuffled against its examples, so the
    support set says nothing about the query labels."""
    labels = episodes.support_y
    keys = tf.random.experimental.stateless_split([seed, 11], labels.shape[0])
    shuffled = tf.stack([tf.gather(labels[i], tf.argsort(tf.random.stateless_uniform(
        [labels.shape[1]], keys[i]))) for i in range(labels.shape[0])])
    return episodes._replace(support_y=shuffled)


def contract_model(dtype: Optional[str] = None, hidden=(16,), ways: int = WAYS) -> keras.Model:
    """The contract's model: a ReLU MLP from ``DIM`` features through ``hidden`` to
    ``ways`` logits, built after seeding Keras with 0 (the same weights on every call)."""
    keras.utils.set_random_seed(0)
    return models.mlp((DIM,), hidden=hidden, outputs=ways, activation="relu", dtype=dtype)


def classification_learner(adapter, model: Optional[keras.Model] = None,
                           learner_class=metalearn.Learner, **kwargs) -> metalearn.Learner:
    """A learner for the synthetic tasks: cross-entropy loss and accuracy."""
    model = contract_model() if model is None else model
    return learner_class(model, adapter=adapter, loss=softmax_cross_entropy,
                         metrics={"accuracy": "accuracy"}, **kwargs)


def regression_learner(adapter, model: Optional[keras.Model] = None,
                       learner_class=metalearn.Learner, **kwargs) -> metalearn.Learner:
    """A learner for the synthetic regression tasks: a ``DIM -> 16 -> 1`` tanh MLP, mean
    squared error."""
    if model is None:
        keras.utils.set_random_seed(0)
        model = models.mlp((DIM,), hidden=(16,), outputs=1, activation="tanh")
    return learner_class(model, adapter=adapter, loss="mse", **kwargs)


def _state(learner: metalearn.Learner) -> List[np.ndarray]:
    variables = list(learner.model.variables) + [
        v for piece in learner.pieces for v in piece.meta_variables]
    return [np.array(v.numpy(), copy=True) for v in variables] + [learner.meta_step.numpy()]


class LearnerContract(abc.ABC):
    """Abstract test class: subclass it (``class TestX(LearnerContract)``) and implement
    :meth:`make_learner`; override the other hooks where the algorithm needs to."""

    overfit_steps = 60
    covers: tuple = ()
    """The classes (pieces, learners, outer rules) this case exercises."""

    @abc.abstractmethod
    def make_learner(self) -> metalearn.Learner:
        """A fresh learner for the synthetic ``WAYS``-way tasks."""

    def episodes(self, seed: int, tasks: int) -> Episode:
        """The tasks the contract measures on (``seed`` fixed per test)."""
        return synthetic_classification(seed, tasks)

    def training_episodes(self, seed: int, tasks: int) -> Episode:
        """What the contract's meta-steps train on: :meth:`episodes` (override for a
        learner trained otherwise, e.g. on whole-class batches)."""
        return self.episodes(seed, tasks)

    prediction_shape = (WAYS * QUERIES, WAYS)
    """One task's query predictions."""

    required_metrics = ("accuracy", "loss")

    fit_metric = "loss"
    """The figure whose fall shows that one episode was fitted (:meth:`assert_fitted`
    compares it with its value before training): one that is 0 for a perfect fit and
    never below, so that a fraction of it measures progress. A Gaussian negative
    log-likelihood is not (a fit drives it below zero at a rate set by how fast the
    predicted scale shrinks): a learner trained on one names its mean's error instead
    (``"mse"``, :func:`~metalearn.functional.predictive_mse`)."""

    def assert_uninformed(self, metrics: Dict[str, tf.Tensor], episodes: Episode) -> None:
        """``metrics`` (of :meth:`chance_metrics`) are what a learner that has not seen
        the tasks' support sets can reach: chance accuracy."""
        accuracy = metrics["accuracy"].numpy()
        assert abs(accuracy.mean() - 1 / WAYS) < 0.1, accuracy.mean()

    def assert_fitted(self, metrics: Dict[str, tf.Tensor], first_loss: float) -> None:
        """``metrics`` after overfitting one episode: every query right, the
        :attr:`fit_metric` (``first_loss``: its value before training) below a quarter
        of the first."""
        assert float(metrics["accuracy"][0]) == 1.0
        fitted = float(metrics[self.fit_metric][0])
        assert fitted < 0.25 * first_loss, (self.fit_metric, first_loss, fitted)

    def make_outer_rule(self) -> metalearn.outer.OuterRule:
        return metalearn.MetaGradient(keras.optimizers.Adam(learning_rate=0.01))

    def make_formulation(self) -> Optional[metalearn.execution.Formulation]:
        """How the contract runs a batch of tasks (:mod:`metalearn.execution`), in its
        metrics and its meta-steps; ``None``: ``Auto()``."""
        return None

    def chance_metrics(self, learner: metalearn.Learner, episodes: Episode
                       ) -> Dict[str, tf.Tensor]:
        """Metrics of the untrained learner when it has not seen the task's support set
        (no inner steps), which must be at chance: compiled (one trace of the
        formulation's per-task function instead of one eager run per task; the
        learner runs under ``tf.function`` by :meth:`test_works_under_tf_function`),
        or eagerly where a piece has a custom gradient (every formulation then unrolls
        the tasks, and tracing a copy per task costs several times running them)."""
        formulation = self.make_formulation()
        metrics = lambda e: learner.meta_metrics(e, steps=0, formulation=formulation)
        if learner.pieces.capabilities.custom_gradient:
            return metrics(episodes)
        return tf.function(metrics)(episodes)

    # --- the contract -------------------------------------------------------------

    def test_shapes(self):
        learner = self.make_learner()
        episodes = self.episodes(0, tasks=2)
        task = episodes.task(0)
        start = learner.initial_weights()
        adapted = learner.adapt(task.support_x, task.support_y)
        assert isinstance(adapted, metalearn.learners.Adapted), type(adapted)
        weights = adapted.weights
        for path, value in start.items():
            assert weights.get(path, value).shape == value.shape, path
        predictions = learner.predict(adapted, task.query_x)
        assert tuple(predictions.shape) == tuple(self.prediction_shape)
        metrics = learner.meta_metrics(episodes, formulation=self.make_formulation())
        assert sorted(metrics) == sorted(learner.metric_names)
        assert set(self.required_metrics) <= set(metrics)
        for value in metrics.values():
            assert value.shape == (2,)
            assert np.all(np.isfinite(value))

    def test_chance_before_training(self):
        learner = self.make_learner()
        episodes = self.episodes(1, tasks=60)
        self.assert_uninformed(self.chance_metrics(learner, episodes), episodes)

    def test_meta_step_lowers_the_loss(self):
        """One compiled meta-step on 4 tasks lowers their meta-loss (measured eagerly
        before and after it, on the run of :meth:`meta_step_run`)."""
        run = self.meta_step_run()
        assert run["after"] < run["before"], (run["before"], run["after"])

    def test_overfits_one_episode(self):
        learner = self.make_learner()
        episode = self.training_episodes(3, tasks=1)
        formulation = self.make_formulation()
        meta_step = metalearn.training.make_meta_step(learner, self.make_outer_rule(),
                                                      formulation)
        first = float(tf.reduce_mean(learner.meta_metrics(
            episode, formulation=formulation)[self.fit_metric]))
        for _ in range(self.overfit_steps):
            meta_step(episode)
        self.assert_fitted(learner.meta_metrics(episode, formulation=formulation), first)

    def test_adaptation_leaves_every_variable_untouched(self):
        """Adapting to a support set and measuring the tasks, eagerly and compiled,
        assign no variable (model, piece, counter): on the fresh learner of
        :meth:`meta_step_run`, before its meta-steps."""
        assert self.meta_step_run()["untouched"]

    def test_works_under_tf_function(self):
        """The compiled metrics equal the eager ones, and the compiled meta-step traces
        once for four batches of the same shapes, each counted (:meth:`meta_step_run`)."""
        run = self.meta_step_run()
        for name in run["eager"]:
            np.testing.assert_allclose(run["eager"][name], run["compiled"][name], rtol=1e-5,
                                       atol=1e-6)
        assert run["tracing_count"] == 1
        assert run["counter"] == 4

    _runs: Dict[type, Dict] = {}

    def meta_step_run(self) -> Dict:
        """One run on a fresh :meth:`make_learner`, shared by the three tests above and
        made once per test class (its hooks are fixed, so each test reads the same run):

        1. every variable's value kept; one task of :meth:`episodes` (seed 2, 4 tasks)
           adapted to, and the 4 tasks' metrics taken eagerly and under
           ``tf.function``; ``untouched``: no variable changed (bit for bit);
        2. ``eager`` and ``compiled``: the metrics of the :meth:`training_episodes` of
           the same seed, eagerly and under ``tf.function`` (those of step 1 when
           :meth:`training_episodes` gives the same tensors);
        3. ``before``: the eager meta-loss of those training episodes; one compiled
           meta-step on them; ``after``: their eager meta-loss again;
        4. the meta-step on the training episodes of seeds 6, 7 and 8 (4 tasks each):
           ``tracing_count``, its number of traces, and ``counter``, the learner's
           meta-step counter after the four steps.
        """
        cache = LearnerContract._runs
        if type(self) in cache:
            return cache[type(self)]
        learner = self.make_learner()
        formulation = self.make_formulation()
        metrics = lambda e: learner.meta_metrics(e, formulation=formulation)
        compiled_metrics = tf.function(metrics)
        measured = self.episodes(2, tasks=4)
        training = self.training_episodes(2, tasks=4)
        before = _state(learner)
        learner.adapt(measured.support_x[0], measured.support_y[0])
        eager, compiled = metrics(measured), compiled_metrics(measured)
        untouched = all(old.tobytes() == new.tobytes()
                        for old, new in zip(before, _state(learner)))
        if not all(a.shape == b.shape and np.array_equal(a, b)
                   for a, b in zip(measured, training)):
            eager, compiled = metrics(training), compiled_metrics(training)
        loss_before = float(learner.meta_loss(training, formulation=formulation))
        meta_step = metalearn.training.make_meta_step(learner, self.make_outer_rule(),
                                                      formulation)
        meta_step(training)
        loss_after = float(learner.meta_loss(training, formulation=formulation))
        for seed in (6, 7, 8):
            meta_step(self.training_episodes(seed, tasks=4))
        cache[type(self)] = dict(
            untouched=untouched, eager={k: v.numpy() for k, v in eager.items()},
            compiled={k: v.numpy() for k, v in compiled.items()}, before=loss_before,
            after=loss_after, tracing_count=meta_step.experimental_get_tracing_count(),
            counter=int(learner.meta_step))
        return cache[type(self)]


class RegressionContract(LearnerContract):
    """The contract on linear regression tasks (:func:`synthetic_regression`): subclass
    it and implement :meth:`make_learner` (e.g. with :func:`regression_learner`)."""

    prediction_shape = (WAYS * QUERIES, 1)
    required_metrics = ("loss",)
    overfit_steps = 100

    def episodes(self, seed: int, tasks: int) -> Episode:
        return synthetic_regression(seed, tasks)

    def assert_uninformed(self, metrics: Dict[str, tf.Tensor], episodes: Episode) -> None:
        """Without the support set no model beats predicting zero on tasks whose
        weights are drawn per task: the loss is at least half the targets' mean
        square."""
        floor = 0.5 * float(tf.reduce_mean(tf.square(episodes.query_y)))
        assert float(tf.reduce_mean(metrics["loss"])) > floor, (metrics["loss"], floor)

    def assert_fitted(self, metrics: Dict[str, tf.Tensor], first_loss: float) -> None:
        fitted = float(metrics[self.fit_metric][0])
        assert fitted < 0.25 * first_loss, (self.fit_metric, first_loss, fitted)

