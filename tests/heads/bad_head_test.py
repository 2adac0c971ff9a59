"""Bad heads and support sets: a head that cannot fit padded episodes, the 0.3 spelling of
a head's capabilities, an SVM head's C, a support label outside the task's classes.
Cases of docs/errors.md (tests/bad_input.py)."""

import tensorflow as tf

import metalearn
from metalearn.heads.base import LabelOutsideClassesError
from metalearn.pieces import HyperparameterRangeError
from metalearn.tasks.episode import MaskedLabels
from tests.bad_input import CLASSIFICATION, Case, check, gin_case, parametrize

TITLE = "Heads"


class ThirdPartyHead(metalearn.heads.Head):
    """A head written outside the library that does not declare ``padding`` among its
    capabilities."""

    def fit(self, embeddings, labels, ways):
        return tf.zeros([tf.shape(embeddings)[1], ways], embeddings.dtype)

    def logits(self, state, embeddings):
        return tf.matmul(embeddings, state)


def head_without_padding_on_padded_episodes(tmp_path) -> None:
    learner = metalearn.EmbeddingLearner(metalearn.models.mlp((2,), hidden=(), outputs=3),
                                         head=ThirdPartyHead(), ways=2)
    labels = MaskedLabels(tf.constant([0, 1, 0]), tf.constant([True, True, False]),
                          tf.constant([True, True]))
    learner.adapt(tf.zeros([3, 2]), labels)


def head_with_a_padding_flag(tmp_path) -> None:
    class FlaggedHead(ThirdPartyHead):
        supports_padding = True


def label_outside_the_classes(tmp_path) -> None:
    learner = metalearn.learners.EmbeddingLearner(
        metalearn.models.mlp((2,), hidden=(), outputs=4), metalearn.heads.RidgeHead(),
        ways=3)
    learner.adapt(tf.zeros([3, 2]), tf.constant([0, 1, 7]))


CASES = [
    Case("head without padding on padded episodes", "`EmbeddingLearner(head=ThirdPartyHead())`"
         ", a `Head` subclass whose capabilities do not say `padding=True`, on "
         "`MaskedLabels` (e.g. `MetaDataset` episodes)", ValueError,
         "ThirdPartyHead cannot fit padded episodes (MaskedLabels",
         head_without_padding_on_padded_episodes, None, "the heads that can"),
    Case("a head's padding as a class flag", "`class MyHead(Head): supports_padding = True` "
         "(the 0.3 spelling)", TypeError, "defines 'supports_padding', which metalearn 0.3 "
         "asks of a head's capabilities", head_with_a_padding_flag, None,
         "own_capabilities() returning Capabilities(padding=True)"),
    gin_case("SVM head's C not positive", "SVMHead.c = 0.0", HyperparameterRangeError,
             "SVMHead.c must be > 0, got 0.0", base=CLASSIFICATION + [
                 "Experiment.learner = @EmbeddingLearner()",
                 "EmbeddingLearner.model = @conv_net()", "EmbeddingLearner.ways = 3",
                 "EmbeddingLearner.drop_head = 'head'", "EmbeddingLearner.head = @SVMHead()"]),
    Case("support label outside the task's classes", "label 7 in a 3-way task's support "
         "set, any head (`adapt`; in a `tf.function`: `InvalidArgumentError`)",
         LabelOutsideClassesError, "a support label is outside the 3 classes of the task",
         label_outside_the_classes, lambda p: "label 7 of support example 2",
         "the label, its example and the classes"),
]


@parametrize(CASES)
def test_bad_input_raises_the_documented_error(case, tmp_path):
    check(case, tmp_path)
