"""Learners and calls that export_saved_model refuses, each named with the reason:
a learner whose queries its task run makes (meta-RL), a task run that does not trace
or differs from the library's when traced with the set sizes unknown, padded episodes,
inner steps for a learner without an inner loop, no example, a non-empty version
folder. Cases of docs/errors.md (tests/bad_input.py)."""

import keras
import tensorflow as tf

import metalearn
from metalearn import models
from metalearn.adapters import GradientDescent
from metalearn.rl import PointNavigation, PolicyLearner, gaussian_policy
from metalearn.serving import UnsupportedExport, export_saved_model
from metalearn.tasks import Episode
from metalearn.tasks.episode import MaskedLabels
from tests.bad_input import Case, check, parametrize

TITLE = "Exports for serving"


def _maml(learner_class=metalearn.Learner):
    keras.utils.set_random_seed(0)
    return learner_class(models.mlp((2,), hidden=(4,), outputs=1),
                         adapter=GradientDescent(1, 0.1), loss="mse")


def _episode(shots=3, queries=2):
    x = tf.reshape(tf.range(2 * shots, dtype=tf.float32), [shots, 2]) / 10.0
    q = tf.reshape(tf.range(2 * queries, dtype=tf.float32), [queries, 2]) / 7.0
    return Episode(x, x[:, :1], q, q[:, :1])


class CountingLearner(metalearn.Learner):
    """Predictions shaped from the queries' static count (``int(None)`` with the set
    sizes unknown)."""

    def predict(self, adapted, x):
        return super().predict(adapted, x) + tf.zeros([int(x.shape[0]), 1])


class StaticSizeLearner(metalearn.Learner):
    """Predictions that change when the queries' count is not static."""

    def predict(self, adapted, x):
        return super().predict(adapted, x) + (1.0 if x.shape[0] is None else 0.0)


def meta_rl_policy(tmp_path) -> None:
    keras.utils.set_random_seed(0)
    policy = gaussian_policy(models.mlp((2,), hidden=(4,), outputs=2))
    learner = PolicyLearner(policy, PointNavigation(horizon=3), rollouts=2)
    export_saved_model(learner, str(tmp_path / "m"), example=_episode())


def untraceable(tmp_path) -> None:
    export_saved_model(_maml(CountingLearner), str(tmp_path / "m"), example=_episode())


def differs_when_traced(tmp_path) -> None:
    export_saved_model(_maml(StaticSizeLearner), str(tmp_path / "m"), example=_episode())


def padded(tmp_path) -> None:
    episode = _episode()
    labels = MaskedLabels(episode.support_y, tf.constant([True, True, False]),
                          tf.constant([True]))
    export_saved_model(_maml(), str(tmp_path / "m"), example=episode._replace(
        support_y=labels))


def inner_steps_without_a_loop(tmp_path) -> None:
    keras.utils.set_random_seed(0)
    learner = metalearn.Learner(models.mlp((6,), hidden=(4,), outputs=2),
                                metalearn.adapters.ConditionalNeuralProcess(
                                    models.mlp((3,), hidden=(4,), outputs=4)),
                                loss=metalearn.functional.gaussian_nll)
    export_saved_model(learner, str(tmp_path / "m"), inner_steps=2, example=_episode())


def no_example(tmp_path) -> None:
    export_saved_model(_maml(), str(tmp_path / "m"))


def non_empty_version(tmp_path) -> None:
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "1" / "saved_model.pb").write_text("an earlier model")
    export_saved_model(_maml(), str(tmp_path / "m"), example=_episode())


CASES = [
    Case("export of a meta-RL policy", "`export_saved_model(PolicyLearner(...), ...)`",
         UnsupportedExport, "PolicyLearner (adapter GradientDescent) cannot be exported to "
         "'saved_model': PolicyLearner overrides query_data", meta_rl_policy, None,
         "the learner and why, before any tracing"),
    Case("export of a task run that needs static set sizes", "a `Learner` subclass whose "
         "`predict` reads `int(x.shape[0])`", UnsupportedExport,
         "tracing its task run (run_task) with the set sizes unknown failed: TypeError",
         untraceable, lambda p: "CountingLearner (adapter GradientDescent)",
         "the learner, what was traced and the error"),
    Case("export whose traced predictions differ", "a `Learner` subclass whose `predict` "
         "branches on `x.shape[0] is None`", UnsupportedExport,
         "on the example episode, output predictions differs from the library's by 1",
         differs_when_traced, lambda p: "StaticSizeLearner (adapter GradientDescent)",
         "the learner, the output and the difference, before anything is written"),
    Case("export of padded episodes", "`export_saved_model(..., example=<an episode of "
         "MaskedLabels>)`", UnsupportedExport, "example.support_y is a MaskedLabels: only "
         "episodes of single tensors", padded, None, "the episode's field"),
    Case("export inner steps without an inner loop", "`export_saved_model(<a neural "
         "process>, ..., inner_steps=2)`", ValueError, "has no inner loop: inner_steps=2 "
         "does not apply", inner_steps_without_a_loop,
         lambda p: "Learner (adapter ConditionalNeuralProcess)", "the learner and adapter"),
    Case("export without an example", "`export_saved_model(learner, folder)`", ValueError,
         "export_saved_model needs an example episode", no_example, None,
         "the argument"),
    Case("export into a non-empty version folder", "`export_saved_model(..., folder)` "
         "whose `folder/1` holds files", FileExistsError, "exists and is not empty: give "
         "another version, or overwrite=True", non_empty_version, lambda p: str(
             p / "m" / "1"), "the folder, before any tracing"),
]


@parametrize(CASES)
def test_bad_export_raises_the_documented_error(case, tmp_path):
    check(case, tmp_path)
