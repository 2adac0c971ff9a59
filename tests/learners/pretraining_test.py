"""Pre-training baselines: whole-class batches, the ClassifierBaseline learner (its
pre-training loss falls and resumes exactly), the per-episode heads of Baseline,
Baseline++, RFS and Meta-Baseline (fitted on separable toys, checked against a reference
solver and float64 finite differences), and a pre-trained backbone restored into
another learner."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import metalearn
from metalearn import models
from metalearn.heads import LinearProbeHead, LogisticRegressionHead, PrototypeHead
from metalearn.learners import ClassifierBaseline
from metalearn.tasks import Episode, FewShotClassification, WholeClassBatches
from metalearn.tasks.datasets.base import LabelledImages
from metalearn.testing import (DIM, WAYS, LearnerContract,
                               assert_meta_gradient_matches_finite_differences,
                               synthetic_classification, uninformative_support)
from metalearn.training import Experiment, Loop, WarmStart, restore_weights, train
from metalearn.training.checkpoint import UnmatchedCheckpointError

# Its tests share a module-scoped fixture: one worker runs them (tests/conftest.py).
pytestmark = pytest.mark.xdist_group(__name__)

CLASSES = [f"c{i}" for i in range(8)]


def tiny_images(classes: int = 8, per_class: int = 5) -> LabelledImages:
    """Images whose class shows in their mean brightness (learnable), 6x6x1."""
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(classes), per_class)
    images = rng.uniform(size=(classes * per_class, 6, 6, 1)) * 0.3 + \
        labels[:, None, None, None] / classes
    return LabelledImages(images.astype(np.float32), labels, CLASSES[:classes])


def episodes_sampler(**kwargs) -> FewShotClassification:
    return FewShotClassification(tiny_images(), ways=3, shots=1, queries=2,
                                 train=CLASSES[:5], test=CLASSES[5:],
                                 rotations=(0, 180), rotation_splits=("train",), **kwargs)


def test_whole_class_batches_walk_through_epochs():
    sampler = WholeClassBatches(episodes_sampler(), batch_size=10)
    assert sampler.num_classes("train") == 10 and sampler.examples_per_epoch == 50
    batches = list(sampler.dataset(1, seed=3, num_steps=10))  # two epochs of 50
    first = batches[0]
    assert first.support_x.shape == (1, 0, 6, 6, 1) and first.query_x.shape == (1, 10, 6, 6, 1)
    # every (label, image) of the training split exactly once per epoch, reshuffled
    flat = [(int(y), x.tobytes()) for b in batches for x, y in
            zip(b.query_x.numpy()[0], b.query_y.numpy()[0])]
    assert len(set(flat[:50])) == 50 and sorted(flat[:50]) == sorted(flat[50:])
    assert flat[:50] != flat[50:]
    assert sorted({label for label, _ in flat}) == list(range(10))
    # rotations are classes: label 2k + 1 holds class k's images turned by 180 degrees
    images = dict((label, []) for label in range(10))
    for label, x in flat[:50]:
        images[label].append(np.frombuffer(x, np.float32).reshape(6, 6))
    turned = {np.rot90(x, 2).tobytes() for x in images[0]}
    assert turned == {x.tobytes() for x in images[1]}
    # resumed at step 7 the stream continues exactly; the seed decides it
    resumed = next(iter(sampler.dataset(1, seed=3, start_step=7, num_steps=1)))
    np.testing.assert_array_equal(resumed.query_x, batches[7].query_x)
    other = next(iter(sampler.dataset(1, seed=4, num_steps=1)))
    assert not np.array_equal(other.query_y, first.query_y)


def test_other_splits_are_the_episode_samplers_episodes():
    episodes = episodes_sampler()
    sampler = WholeClassBatches(episodes, batch_size=4)
    ours = next(iter(sampler.dataset(2, seed=0, split="test", num_steps=1)))
    theirs = next(iter(episodes.dataset(2, seed=0, split="test", num_steps=1)))
    for a, b in zip(ours, theirs):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="more than the 50 training examples"):
        sampler.dataset(13, seed=0)


def _backbone(dtype=None):
    keras.utils.set_random_seed(0)
    return models.conv_net((6, 6, 1), outputs=3, filters=4, blocks=1, dtype=dtype)


def _pretraining(num_steps: int, **kwargs) -> Experiment:
    keras.utils.set_random_seed(1)
    learner = ClassifierBaseline(_backbone(), classes=10, ways=3, drop_head="head",
                                 metrics={"accuracy": "accuracy"}, **kwargs)
    optimizer = metalearn.MetaGradient(keras.optimizers.SGD(0.25, momentum=0.5))
    return Experiment(learner, WholeClassBatches(episodes_sampler(), batch_size=10),
                      outer_rule=optimizer, meta_batch_size=1,
                      loop=Loop(num_steps=num_steps, log_every=2, checkpoint_every=2))


def _state(learner):
    return [v.numpy().copy() for v in learner.model.variables] + [
        v.numpy().copy() for v in learner.classifier.meta_variables]


def test_pretraining_lowers_the_loss_updates_batch_norm_and_resumes_exactly(tmp_path):
    """4 steps in one go, and the same run cut after its step-2 checkpoint and resumed:
    bit-identical (weights, classifier, moving statistics, optimizer)."""
    import shutil
    batch = next(iter(WholeClassBatches(episodes_sampler(), batch_size=50).dataset(
        1, seed=9, num_steps=1)))

    def loss(learner):  # measured without moving the statistics
        learner.update_batch_norm = False
        value = float(learner.meta_loss(batch))
        learner.update_batch_norm = True
        return value

    whole = _pretraining(4)
    before = loss(whole.learner)
    moving = [v.numpy().copy() for v in whole.learner.model.non_trainable_variables]
    train(whole, str(tmp_path / "whole"))
    assert loss(whole.learner) < before
    assert all(not np.array_equal(a, v.numpy()) for a, v in
               zip(moving, whole.learner.model.non_trainable_variables))
    shutil.copytree(tmp_path / "whole", tmp_path / "cut")  # then back to its step 2
    folder = tmp_path / "cut" / "checkpoints"
    for path in folder.glob("ckpt-4*"):
        path.unlink()
    (folder / "checkpoint").unlink()
    resumed = _pretraining(4)
    train(resumed, str(tmp_path / "cut"))
    assert int(resumed.learner.meta_step) == 4
    for a, b in zip(_state(whole.learner), _state(resumed.learner)):
        np.testing.assert_array_equal(a, b)


def _separable(ways=3, shots=2, dim=5, dtype=tf.float64):
    episode = synthetic_classification(0, tasks=1, ways=ways, shots=shots, queries=3,
                                       dim=dim, spread=4.0, dtype=dtype).task(0)
    return episode


@pytest.mark.parametrize("head", [LinearProbeHead(), LinearProbeHead("cosine"),
                                  LinearProbeHead(normalize=True, learning_rate=0.5),
                                  LogisticRegressionHead(),
                                  PrototypeHead("cosine", scale=10.0)],
                         ids=["baseline", "baseline_pp", "normalised", "rfs", "cosine_protos"])
def test_per_episode_heads_fit_a_separable_support_set(head):
    episode = _separable()
    state = head.fit(episode.support_x, episode.support_y, 3)
    for x, y in ((episode.support_x, episode.support_y), (episode.query_x, episode.query_y)):
        predicted = np.argmax(head.logits(state, x).numpy(), axis=-1)
        np.testing.assert_array_equal(predicted, y.numpy())


def test_logistic_regression_is_the_regularised_minimiser():
    """The same objective minimised by SciPy's L-BFGS (RFS fits it with scikit-learn)."""
    from scipy import optimize
    rng = np.random.default_rng(0)
    n, ways, dim = 10, 5, 7
    x = rng.normal(size=(n, dim)) + 2 * np.repeat(rng.normal(size=(ways, dim)), 2, axis=0)
    y = np.repeat(np.arange(ways), 2)
    head = LogisticRegressionHead(C=2.0)
    state = head.fit(tf.constant(x), tf.constant(y), ways)
    unit = x / np.linalg.norm(x, axis=1, keepdims=True)

    def objective(theta):
        kernel, bias = theta[:dim * ways].reshape(dim, ways), theta[dim * ways:]
        logits = unit @ kernel + bias
        logits = logits - logits.max(axis=1, keepdims=True)
        log_p = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
        return -2.0 * log_p[np.arange(n), y].sum() + 0.5 * np.sum(kernel ** 2)

    best = optimize.minimize(objective, np.zeros(dim * ways + ways), method="L-BFGS-B",
                             options=dict(maxiter=10000, gtol=1e-12, ftol=1e-16)).x
    queries = rng.normal(size=(4, dim))
    ours = head.logits(state, tf.constant(queries)).numpy()
    theirs = queries / np.linalg.norm(queries, axis=1, keepdims=True) @ \
        best[:dim * ways].reshape(dim, ways) + best[dim * ways:]
    centre = lambda v: v - v.mean(axis=1, keepdims=True)  # noqa: E731 (bias shift)
    np.testing.assert_allclose(centre(ours), centre(theirs), atol=1e-5)


@pytest.mark.parametrize("kind", ["linear", "cosine"])
def test_linear_probe_gradient_is_the_losss_gradient(kind):
    """The closed-form gradient of the probe's fit equals automatic differentiation."""
    episode = _separable()
    head = LinearProbeHead(kind, weight_decay=0.1)
    rng = np.random.default_rng(1)
    kernel = tf.constant(rng.normal(size=(5, 3)))
    bias = tf.constant(rng.normal(size=(3,)))
    x, targets = episode.support_x, tf.one_hot(episode.support_y, 3, dtype=tf.float64)
    with tf.GradientTape() as tape:
        tape.watch([kernel, bias])
        loss = tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits(
            targets, head.logits((kernel, bias), x))) + 0.05 * tf.reduce_sum(kernel ** 2)
    expected = tape.gradient(loss, [kernel, bias])
    if kind == "cosine":
        expected[1] = tf.zeros_like(bias)
    for got, want in zip(head.gradients((kernel, bias), x, targets), expected):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def _embedding():
    keras.utils.set_random_seed(0)
    return models.mlp((DIM,), hidden=(), outputs=5, activation="tanh", dtype="float64",
                      name="embedding")


@pytest.mark.parametrize("head", [
    lambda: PrototypeHead("cosine", scale=3.0, learn_scale=True),
    lambda: LinearProbeHead(steps=3, learning_rate=0.5),
    lambda: LinearProbeHead("cosine", steps=3, learning_rate=0.5),
    lambda: LogisticRegressionHead(C=3.0, iterations=3)],
    ids=["meta_baseline", "baseline", "baseline_pp", "rfs"])
def test_meta_gradient_through_the_head_equals_finite_differences(head):
    learner = metalearn.EmbeddingLearner(_embedding(), head=head(), ways=WAYS)
    episodes = synthetic_classification(0, tasks=2, dtype=tf.float64)
    assert_meta_gradient_matches_finite_differences(learner, episodes)


def test_whole_class_gradient_equals_finite_differences():
    for classifier in ("linear", "cosine"):
        learner = ClassifierBaseline(_embedding(), classes=4, ways=WAYS,
                                     classifier=classifier, scale=3.0)
        assert len(learner.classifier.meta_variables) == 2  # kernel and bias, or scale
        batch = as_whole_class(synthetic_classification(1, tasks=2, ways=4,
                                                        dtype=tf.float64))
        assert_meta_gradient_matches_finite_differences(learner, batch)


def test_a_head_with_meta_variables_is_refused():
    with pytest.raises(ValueError, match="whole-class pre-training never trains"):
        ClassifierBaseline(_embedding(), classes=4, ways=WAYS,
                           head=PrototypeHead("cosine", learn_scale=True))


# --- a pre-trained backbone starts another learner --------------------------------


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """A one-step pre-training run: its workdir and its model's weights by path."""
    workdir = tmp_path_factory.mktemp("pretrain")
    source = _pretraining(1)
    train(source, str(workdir))
    return workdir, {v.path: v.numpy() for v in source.learner.model.variables}


def test_restore_a_pretrained_backbone_into_other_learners(pretrained, tmp_path):
    source_dir, saved = pretrained
    (tmp_path / "pretrain").symlink_to(source_dir)
    # Prototypical Networks on the same (headless) backbone: every weight, moving
    # statistics included
    protonets = metalearn.PrototypicalNetworks(_backbone(), ways=3, drop_head="head")
    matched = restore_weights(protonets.model, str(tmp_path / "pretrain"))
    assert sorted(matched) == sorted(saved)
    for v in protonets.model.variables:
        np.testing.assert_array_equal(v.numpy(), saved[v.path])
    # MAML's learner on the whole conv net: its head has no saved counterpart
    maml = metalearn.Learner(_backbone(), loss="sparse_categorical_crossentropy")
    with pytest.raises(UnmatchedCheckpointError, match=r"no saved weights for 2 variable\(s\) "
                       r"of model 'conv_net': conv_net/head/kernel, conv_net/head/bias"):
        restore_weights(maml.model, str(tmp_path / "pretrain"))
    head = maml.model.get_layer("head").kernel.numpy()
    restore_weights(maml.model, str(tmp_path / "pretrain"), exclude=("head",))
    np.testing.assert_array_equal(maml.model.get_layer("conv0").kernel.numpy(),
                                  saved["conv_net/conv0/kernel"])
    np.testing.assert_array_equal(maml.model.get_layer("head").kernel.numpy(), head)
    keras.utils.set_random_seed(0)
    wider = models.conv_net((6, 6, 1), outputs=3, filters=5, blocks=1)
    with pytest.raises(UnmatchedCheckpointError, match=r"conv_net/conv0/kernel \(3, 3, 1, 5\) "
                       r"vs saved conv_net/conv0/kernel \(3, 3, 1, 4\)"):
        restore_weights(wider, str(tmp_path / "pretrain"), exclude=("head",))


def test_warm_start_applies_when_a_run_starts_not_when_it_resumes(pretrained, tmp_path):
    source_dir, saved = pretrained
    (tmp_path / "pretrain").symlink_to(source_dir)
    calls = []

    def experiment(num_steps):
        learner = metalearn.PrototypicalNetworks(_backbone(), ways=3, drop_head="head")
        warm = WarmStart(str(tmp_path / "pretrain"))
        def counted(target):
            calls.append(num_steps)
            matched = warm(target)
            for v in target.model.variables:  # the start is the pre-trained backbone
                np.testing.assert_array_equal(v.numpy(), saved[v.path])
            return matched
        return Experiment(learner, episodes_sampler(), meta_batch_size=2,
                          loop=Loop(num_steps=num_steps, log_every=1, checkpoint_every=1),
                          warm_start=counted)

    train(experiment(1), str(tmp_path / "meta"))
    train(experiment(2), str(tmp_path / "meta"))
    assert calls == [1]
    with pytest.raises(FileNotFoundError, match="no checkpoint in"):
        WarmStart(str(tmp_path / "nowhere"))(experiment(1).learner)


# --- contract cases -----------------------------------------------------------------


def as_whole_class(episodes: Episode) -> Episode:
    """Episodes as whole-class batches: no support set, the query labels as classes."""
    return Episode(episodes.support_x[:, :0], episodes.support_y[:, :0], episodes.query_x,
                   episodes.query_y)


def _contract_embedding():
    keras.utils.set_random_seed(0)
    return models.mlp((DIM,), hidden=(16,), outputs=8, activation="relu", name="embedding")


class _ProbeContract(LearnerContract):
    def chance_metrics(self, learner, episodes):
        """Shuffled support labels say nothing about the queries (compiled: the heads'
        fitting loops run eagerly slowly)."""
        return tf.function(lambda e: learner.meta_metrics(e))(uninformative_support(episodes))


class TestBaselineProbe(_ProbeContract):
    covers = (LinearProbeHead,)

    def make_learner(self):
        return metalearn.EmbeddingLearner(_contract_embedding(),
                                          head=LinearProbeHead(steps=10, learning_rate=0.5),
                                          ways=WAYS, metrics={"accuracy": "accuracy"})


class TestRFSHead(_ProbeContract):
    covers = (LogisticRegressionHead,)

    def make_learner(self):
        return metalearn.EmbeddingLearner(_contract_embedding(),
                                          head=LogisticRegressionHead(C=50.0, iterations=5),
                                          ways=WAYS, metrics={"accuracy": "accuracy"})


class TestMetaBaselineHead(_ProbeContract):
    covers = (PrototypeHead,)

    def make_learner(self):
        return metalearn.EmbeddingLearner(_contract_embedding(), head=PrototypeHead(
            "cosine", scale=10.0, learn_scale=True), ways=WAYS,
            metrics={"accuracy": "accuracy"})


class TestClassifierBaseline(_ProbeContract):
    """Episodes: the head; the training steps run on whole-class batches made of the
    same synthetic examples (the contract's steps, with its episodes' support sets
    emptied)."""
    covers = (ClassifierBaseline,)

    def make_learner(self):
        return ClassifierBaseline(_contract_embedding(), classes=WAYS, ways=WAYS,
                                  metrics={"accuracy": "accuracy"})

    def training_episodes(self, seed, tasks):
        return as_whole_class(self.episodes(seed, tasks))
