"""Bad task samplers and episodes: shots, queries, ways and splits the data cannot give,
normalisation without statistics, episode batches whose parts disagree. Cases of
docs/errors.md (tests/bad_input.py)."""

import numpy as np
import tensorflow as tf

from metalearn.tasks import Episode, FewShotClassification, pad_episodes
from tests.bad_input import CLASSIFICATION, Case, check, gin_case, parametrize, tiny_images

TITLE = "Task samplers and episodes"


def unequal_task_counts(tmp_path) -> None:
    Episode(tf.zeros([2, 5, 1]), tf.zeros([2, 5, 1]), tf.zeros([3, 10, 1]),
            tf.zeros([3, 10, 1])).check_tasks()


def mixed_padded_episodes(tmp_path) -> None:
    real = Episode(np.zeros([2, 1], np.float32), np.zeros([2, 1], np.float32),
                   np.zeros([1, 1], np.float32), np.zeros([1, 1], np.float32))
    labelled = Episode(np.zeros([2, 1], np.float32), np.array([0, 1]),
                       np.zeros([1, 1], np.float32), np.array([0]))
    pad_episodes([real, labelled], max_support=3, max_query=2, max_ways=2)


CASES = [
    gin_case("zero sinusoid shots", "Sinusoid.shots = 0", ValueError,
             "shots must be >= 1, got 0"),
    gin_case("ways above the training classes", "FewShotClassification.ways = 8", ValueError,
             "ways=8 is more than the 6 classes the 'train' split has in all",
             base=CLASSIFICATION),
    gin_case("ways above the test classes", "FewShotClassification.ways = 5", ValueError,
             "ways=5 is more than the 4 classes the 'test' split has in all",
             base=CLASSIFICATION),
    gin_case("shots + queries above the examples", "FewShotClassification.queries = 4",
             ValueError, "1 shots + 4 queries need 5 examples per class, but class 'c0' of "
             "the 'train' split has 4", base=CLASSIFICATION),
    gin_case("unknown class in a split", "FewShotClassification.test = ['c6', 'x1']",
             ValueError, "unknown class ['x1'] in the 'test' split", base=CLASSIFICATION),
    Case("normalisation without statistics", "`FewShotClassification(normalize=True)` on "
         "data whose preprocessing has no mean and std", ValueError,
         "normalize=True needs the data set's per-channel mean and std",
         lambda p: FewShotClassification(tiny_images(), ways=2, normalize=True), None,
         "the loaders that record them"),
    gin_case("zero sinusoid queries", "Sinusoid.queries = 0", ValueError,
             "queries must be >= 1, got 0"),
    gin_case("inverted amplitude range", "Sinusoid.amplitude = (5.0, 0.1)", ValueError,
             "must be a (low, high) pair with low <= high, got (5.0, 0.1)"),
    gin_case("zero classification queries", "FewShotClassification.queries = 0", ValueError,
             "queries must be >= 1, got 0", base=CLASSIFICATION),
    gin_case("negative image shift", "FewShotClassification.max_shift = -1", ValueError,
             "max_shift must be >= 0 pixels, got -1", base=CLASSIFICATION),
    Case("support and query of different task counts", "an episode batch of 2 support and "
         "3 query tasks", ValueError, "different numbers of tasks (leading axis): "
         "support_x 2", unequal_task_counts, None, "each part's count"),
    Case("padded batch of real targets and labels", "`pad_episodes` of a regression "
         "episode and a classification one", ValueError,
         "pad_episodes got real targets in episodes [0] and integer labels in [1]",
         mixed_padded_episodes, None, "the episodes of each kind"),
]


@parametrize(CASES)
def test_bad_input_raises_the_documented_error(case, tmp_path):
    check(case, tmp_path)
