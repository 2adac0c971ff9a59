"""Bad learners, losses and models: a model's output that does not fit the tasks, a loss
or metric of the wrong kind or shape, keywords that moved, backbones of impossible sizes.
Cases of docs/errors.md (tests/bad_input.py)."""

import gin
import keras
import tensorflow as tf

import metalearn
from metalearn.adapters import GradientDescent
from metalearn.models import mlp
from metalearn.tasks import Episode
from metalearn.tasks.episode import MaskedLabels
from tests.bad_input import CLASSIFICATION, Case, check, gin_case, gin_only, parametrize

TITLE = "Learners, losses and models"


def broadcasting_loss():
    def squared_error(y, p):  # [N] - [N, 1] -> [N, N]
        return tf.square(tf.squeeze(y, -1) - p)
    return squared_error


def short_loss():
    def first_five(y, p):  # 5 values for 10 examples
        return tf.square(y - p)[:5, 0]
    return first_five


with gin.unlock_config():
    gin.configurable("broadcasting_loss")(broadcasting_loss)
    gin.configurable("short_loss")(short_loss)


PRETRAINING = [
    "Experiment.learner = @ClassifierBaseline()",
    "Experiment.sampler = @WholeClassBatches()",
    "WholeClassBatches.episodes = @FewShotClassification()",
    "WholeClassBatches.batch_size = 4",
    "Experiment.meta_batch_size = 1",
    "Loop.num_steps = 2",
    "Loop.log_every = 1",
] + [line for line in CLASSIFICATION
     if line.startswith(("FewShotClassification", "conv_net"))] + [
    "ClassifierBaseline.model = @conv_net()",
    "ClassifierBaseline.drop_head = 'head'",
    "ClassifierBaseline.ways = 3",
]


def scalar_metric_on_padded_episodes(tmp_path) -> None:
    learner = metalearn.Learner(metalearn.models.mlp((2,), hidden=(), outputs=3),
                                loss="sparse_categorical_crossentropy",
                                metrics={"mean_accuracy": lambda y, p: tf.reduce_mean(
                                    metalearn.learners.learner.accuracy(y, p))})
    labels = MaskedLabels(tf.constant([0, 1, -1]), tf.constant([True, True, False]),
                          tf.constant([True, True, False]))
    learner.query_metrics(labels, tf.zeros([3, 3]))


def _regression_learner(**kwargs):
    keras.utils.set_random_seed(0)
    model = mlp(hidden=(4,))
    for name, value in kwargs.items():
        setattr(model, name, value)
    return metalearn.Learner(model, adapter=GradientDescent(1, 0.01), loss="mse")


def adapt_wide_targets(tmp_path) -> None:
    _regression_learner().adapt(tf.zeros([10, 1]), tf.zeros([10, 7]))


def meta_loss_unequal_tasks(tmp_path) -> None:
    _regression_learner().meta_loss(Episode(tf.zeros([2, 5, 1]), tf.zeros([2, 5, 1]),
                                            tf.zeros([3, 10, 1]), tf.zeros([3, 10, 1])))


CASES = [
    gin_case("model output size, regression", "mlp.outputs = 2", ValueError,
             "predicts shape [10, 2] but the query targets of Sinusoid have shape [10, 1]"),
    gin_case("model output size, classification", "conv_net.outputs = 4", ValueError,
             "outputs 4 classes (shape [3, 4]) but the tasks have 3 "
             "(FewShotClassification.ways=3)", base=CLASSIFICATION),
    Case("metric of a scalar on padded episodes", "`Learner.metrics = {'mean_accuracy': "
         "fn}` whose `fn` averages itself, on `MaskedLabels`", ValueError,
         "'mean_accuracy' <lambda> gives values of shape [], but padded episodes "
         "(MaskedLabels) need one value per example", scalar_metric_on_padded_episodes,
         None, "the metric"),
    gin_case("classification metric on regression", "Learner.metrics = {'acc': 'accuracy'}",
             ValueError, "metric 'acc' accuracy is for classification, but the tasks are "
             "regression (float targets)"),
    gin_case("cross-entropy loss on regression",
             "Learner.loss = @keras.losses.SparseCategoricalCrossentropy()", ValueError,
             "loss SparseCategoricalCrossentropy is for classification, but the tasks are "
             "regression"),
    gin_case("regression loss on classification",
             "Learner.loss = @keras.losses.MeanSquaredError()", ValueError,
             "loss MeanSquaredError is a regression loss, but the tasks are classification",
             base=CLASSIFICATION),
    gin_case("custom loss that broadcasts", "Learner.loss = @broadcasting_loss()",
             ValueError, "loss squared_error gives values of shape [10, 10] for 10 "
             "examples"),
    gin_case("custom loss of the wrong length", "Learner.loss = @short_loss()", ValueError,
             "loss first_five gives values of shape [5] for 10 examples"),
    gin_case("a learner keyword that moved", "Learner.task_batching = 'map_fn'", ValueError,
             "Learner(task_batching=...) moved in metalearn 0.3: use the formulation"),
    gin_case("unknown loss name", "Learner.loss = 'msee'", ValueError,
             "unknown loss 'msee'"),
    gin_only("a metric named loss", "Learner.metrics = {'loss': 'mse'}", ValueError,
             "'loss' is reserved for the query loss", points_to="the configurable"),
    gin_case("pre-training classes below the training classes",
             "ClassifierBaseline.classes = 4", ValueError,
             "outputs 4 classes (shape [4, 4]) but the tasks have 6 (the 6 training classes "
             "WholeClassBatches labels", base=PRETRAINING),
    Case("regression targets of another shape", "`learner.adapt(x [10, 1], y [10, 7])`, "
         "a model of 1 output", ValueError, "targets of shape [10, 7] do not fit "
         "predictions of shape [10, 1]", adapt_wide_targets, None, "the shapes"),
    Case("meta-loss of support and query of different task counts",
         "`learner.meta_loss` of 2 support and 3 query tasks", ValueError,
         "different numbers of tasks (leading axis): support_x 2", meta_loss_unequal_tasks,
         None, "each part's count"),
    Case("built model without trainable weights", "`Learner(model)` with "
         "`model.trainable = False`", ValueError, "is built but has no trainable weights",
         lambda p: _regression_learner(trainable=False), None, "the model"),
    Case("Wide ResNet depth not 6n + 4", "`wide_resnet.depth = 27`", ValueError,
         "wide_resnet depth must be 6n + 4 with n >= 1 (10, 16, 22, 28, ...), got 27",
         lambda p: metalearn.models.wide_resnet(depth=27), None,
         "the bad value"),
    Case("a backbone width of zero", "`resnet12.widths = (64, 0)`", ValueError,
         "widths must be a non-empty sequence of positive ints, got (64, 0)",
         lambda p: metalearn.models.resnet12(widths=(64, 0)), None,
         "the bad value"),
    Case("DropBlock that drops everything", "`resnet12.drop_rate = 1.0`", ValueError,
         "DropBlock rate must be in [0, 1), got 1.0",
         lambda p: metalearn.models.resnet12(drop_rate=1.0), None,
         "the bad value"),
    Case("non-positive predicted scale", "`gaussian_nll(y, Gaussian(mean, scale))` with a "
         "scale <= 0", tf.errors.InvalidArgumentError,
         "the predicted scale (standard deviation) must be positive",
         lambda p: metalearn.functional.gaussian_nll(tf.ones([2, 1]), metalearn.functional.
                                                     Gaussian(tf.ones([2, 1]),
                                                              -tf.ones([2, 1]))),
         None, "the scale values (in the message's data)"),
    Case("Gaussian loss of a point prediction", "`Learner.loss = @gaussian_nll` for a "
         "model without a neural process (a point prediction)", TypeError,
         "gaussian_nll needs a Gaussian(mean, scale) prediction",
         lambda p: metalearn.functional.gaussian_nll(tf.ones([2, 1]), tf.ones([2, 1])),
         None, "what it got and what to use instead"),
]


@parametrize(CASES)
def test_bad_input_raises_the_documented_error(case, tmp_path):
    check(case, tmp_path)
