"""Bad settings of the experiment and its training loop (``Experiment``, ``Loop``), found
before the first meta-step and named with the gin file and line, and a run whose every
step is skipped. Cases of docs/errors.md (tests/bad_input.py)."""

import keras
import numpy as np

import metalearn
from metalearn.adapters import GradientDescent
from metalearn.models import mlp
from metalearn.tasks import Sinusoid
from metalearn.training import train
from tests.bad_input import Case, check, gin_case, parametrize

TITLE = "The experiment and its training loop"


class AlwaysNaN(metalearn.Learner):
    def query_metrics(self, query_y, predictions):
        results = dict(super().query_metrics(query_y, predictions))
        results["loss"] = results["loss"] + np.nan
        return results


def all_steps_skipped(tmp_path) -> None:
    keras.utils.set_random_seed(0)
    learner = AlwaysNaN(mlp(hidden=(4,)), adapter=GradientDescent(1, 0.01),
                        loss=keras.losses.MeanSquaredError())
    train(metalearn.Experiment(learner, Sinusoid(shots=5, queries=5), meta_batch_size=2,
                               loop=metalearn.training.Loop(num_steps=8, log_every=4,
                                                            on_non_finite="skip")),
          str(tmp_path / "run"))


CASES = [
    gin_case("mistyped value", "Loop.num_steps = '1000'", TypeError,
             "Loop.num_steps must be an integer, got '1000' (str)"),
    gin_case("fractional steps", "Loop.num_steps = 2.5", TypeError,
             "Loop.num_steps must be an integer, got 2.5 (float)"),
    gin_case("zero meta-steps", "Loop.num_steps = 0", ValueError,
             "Loop.num_steps must be >= 1, got 0"),
    gin_case("zero meta-batch", "Experiment.meta_batch_size = 0", ValueError,
             "Experiment.meta_batch_size must be >= 1, got 0"),
    gin_case("zero log interval", "Loop.log_every = 0", ValueError,
             "Loop.log_every must be >= 1, got 0"),
    gin_case("negative checkpoint interval", "Loop.checkpoint_every = -5", ValueError,
             "Loop.checkpoint_every must be >= 1, got -5"),
    gin_case("zero checkpoints kept", "Loop.keep_checkpoints = 0", ValueError,
             "Loop.keep_checkpoints must be >= 1, got 0"),
    gin_case("unknown log average", "Loop.log_average = 'mean'", ValueError,
             "Loop.log_average must be one of ('window', 'running'), got 'mean'"),
    gin_case("unknown non-finite policy", "Loop.on_non_finite = 'ignore'", ValueError,
             "Loop.on_non_finite must be one of ('raise', 'skip'), got 'ignore'"),
    gin_case("skipped fraction above 1", "Loop.max_skipped_fraction = 1.5", ValueError,
             "Loop.max_skipped_fraction must be a number in [0, 1], got 1.5"),
    gin_case("an experiment setting that moved", "Experiment.num_steps = 5", ValueError,
             "Experiment(num_steps=...) moved in metalearn 0.3: use Loop.num_steps"),
    Case("every step skipped", "`Loop.on_non_finite = 'skip'`, a NaN at every step",
         FloatingPointError, "3 of 8 steps skipped", all_steps_skipped,
         lambda p: "Loop.max_skipped_fraction = 0.25", "the limit's binding"),
]


@parametrize(CASES)
def test_bad_input_raises_the_documented_error(case, tmp_path):
    check(case, tmp_path)
