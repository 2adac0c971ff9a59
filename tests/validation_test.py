"""Bad input is found before training and named: one case per row of docs/errors.md.

Every case builds a bad configuration, data file or workdir and checks the error's type,
an excerpt of its message and where it points (the gin file and line, the data file,
the workdir). ``test_docs_table_lists_every_case`` keeps docs/errors.md and these cases
in step; ``python -m tests.validation_test`` prints the table from the cases.
"""

from __future__ import annotations

import dataclasses
import gzip
import os
import zipfile
from typing import Callable, List, Optional, Type

import gin
import numpy as np
import pytest
import tensorflow as tf

import metalearn  # noqa: F401  (registers the configurables)
from metalearn.tasks import FewShotClassification, MetaDataset, pad_episodes
from metalearn.tasks.datasets import (ChecksumError, LabelledImages, load_cub,
                                      load_image_folder, load_meta_dataset_source,
                                      load_mini_imagenet, load_mnist, load_omniglot,
                                      load_tiered_imagenet)

from metalearn.flags import resolve_gin_files
from metalearn.repository import MovedGinFileError
from metalearn.adapters.learned_optimizer import RuleFileError, RuleMismatchError
from metalearn.functional.memory import MemoryBudgetError
from metalearn.heads.base import LabelOutsideClassesError
from metalearn.pieces import HyperparameterRangeError
from metalearn.runs import validation
from metalearn.runs.lock import WorkdirLockedError
from metalearn.runs.modules import ModuleImportError, UntrustedModulesError
from metalearn.runs.validation import RoleOrderError
from metalearn.training.checkpoint import DamagedCheckpointError, UnmatchedCheckpointError
from metalearn.training import build_experiment, parse_config, train
from metalearn.training.evaluation import evaluate
from metalearn.report import IncompleteError
from metalearn.testing import softmax_cross_entropy, synthetic_classification
from tests.run_fixtures import (EVALUATE_SMALL, full_disk, no_free_space, not_installed,
                                saved_run)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS_TABLE = os.path.join(ROOT, "docs", "errors.md")

SINUSOID = ["include 'experiments/sinusoid/maml.gin'", "Loop.num_steps = 2",
            "Loop.log_every = 1"]
POINT_NAV = ["include 'experiments/rl/point_nav_maml.gin'", "Loop.num_steps = 2",
             "Loop.log_every = 1", "PointNavigation.horizon = 5", "PolicyLearner.rollouts = 2",
             "Experiment.meta_batch_size = 2", "mlp.hidden = (8,)"]
SINUSOID_ES = ["include 'experiments/sinusoid/maml_es.gin'", "Loop.num_steps = 2",
               "Loop.log_every = 1"]
SINUSOID_TRUNCATED = ["include 'experiments/sinusoid/maml.gin'",
                      "include 'experiments/learners/truncated.gin'", "INNER_STEPS = 4",
                      "HORIZON = 4", "TRUNCATION = 2", "Loop.num_steps = 2",
                      "Loop.log_every = 1"]
SINUSOID_PES = [line for line in SINUSOID_TRUNCATED if "truncated.gin" not in line] + [
    "include 'experiments/learners/pes.gin'"]  # one outer-rule learner (check_roles)
LEARNED_OPTIMIZER = ["include 'experiments/sinusoid/learned_optimizer.gin'",
                     "Loop.num_steps = 2", "Loop.log_every = 1"]

CLASSES = [f"c{i}" for i in range(10)]
CLASSIFICATION = [
    "Experiment.learner = @Learner()",
    "Experiment.sampler = @FewShotClassification()",
    "Experiment.meta_batch_size = 2",
    "Loop.num_steps = 2",
    "Loop.log_every = 1",
    "FewShotClassification.dataset = @validation_test_images()",
    "FewShotClassification.ways = 3",
    "FewShotClassification.shots = 1",
    "FewShotClassification.queries = 1",
    f"FewShotClassification.train = {CLASSES[:6]}",
    f"FewShotClassification.test = {CLASSES[6:]}",
    "Learner.model = @conv_net()",
    "Learner.loss = @keras.losses.SparseCategoricalCrossentropy()",
    "Experiment.formulation = @Unrolled()",
    "keras.losses.SparseCategoricalCrossentropy.from_logits = True",
    "conv_net.input_shape = (4, 4, 1)",
    "conv_net.filters = 4",
    "conv_net.blocks = 1",
    "conv_net.outputs = 3",
]


def tiny_images(classes: int = 10, per_class: int = 4) -> LabelledImages:
    """``classes`` x ``per_class`` distinct 4x4 images, class names ``c0 ..``."""
    rng = np.random.default_rng(0)
    images = rng.uniform(size=(classes * per_class, 4, 4, 1)).astype(np.float32)
    labels = np.repeat(np.arange(classes), per_class)
    return LabelledImages(images, labels, [f"c{i}" for i in range(classes)])


with gin.unlock_config():
    gin.configurable("validation_test_images")(tiny_images)


# --- how a case runs -------------------------------------------------------------


def run_gin(tmp_path, lines: List[str]) -> None:
    """Writes ``lines`` to ``bad.gin``, then parses, builds and trains it in a fresh
    workdir; the error must come before anything is written there."""
    path = tmp_path / "bad.gin"
    path.write_text("\n".join(lines) + "\n")
    workdir = tmp_path / "workdir"
    try:
        parse_config([str(path)])
        train(build_experiment(), str(workdir))
    finally:
        assert not workdir.exists() or not os.listdir(workdir), \
            f"files written before the error: {os.listdir(workdir)}"


def gin_line(lines: List[str]) -> Callable[[object], str]:
    """Where the error must point: the last line of ``bad.gin``."""
    return lambda tmp_path: f'"{tmp_path / "bad.gin"}", line {len(lines)}'


def _omniglot_zip(folder, entries) -> str:
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "images_background_small1.zip")
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in entries:
            zf.writestr(f"images_background_small1/{name}", data)
    return path


def damaged_zip(tmp_path) -> None:
    folder = tmp_path / "omniglot"
    folder.mkdir()
    (folder / "images_background_small1.zip").write_bytes(b"PK\x03\x04 not really a zip")
    load_omniglot(str(folder), archives=("images_background_small1",),
                  verify_checksums=False)


def undecodable_png(tmp_path) -> None:
    _omniglot_zip(tmp_path / "omniglot", [("Greek/character01/0101_01.png",
                                           b"\x89PNG\r\n\x1a\n garbage")])
    load_omniglot(str(tmp_path / "omniglot"), archives=("images_background_small1",),
                  verify_checksums=False)


def corrupted_zip_entry(tmp_path) -> None:
    png = tf.io.encode_png(tf.zeros([3, 3, 1], tf.uint8)).numpy()
    path = tmp_path / "omniglot" / "images_background_small1.zip"
    path.parent.mkdir()
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as zf:
        zf.writestr("images_background_small1/Greek/character01/0101_01.png", png)
    data = bytearray(path.read_bytes())
    start = data.index(png)  # stored uncompressed: flip a byte of the image itself
    data[start + len(png) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    load_omniglot(str(path.parent), archives=("images_background_small1",),
                  verify_checksums=False)


def swapped_mnist_files(tmp_path) -> None:
    folder = tmp_path / "mnist"
    folder.mkdir()
    labels = gzip.compress(b"\x00\x00\x08\x01" + (3).to_bytes(4, "big") + bytes(3))
    (folder / "t10k-images-idx3-ubyte.gz").write_bytes(labels)  # a labels file
    (folder / "t10k-labels-idx1-ubyte.gz").write_bytes(labels)
    load_mnist(str(folder), verify_checksums=False)


def truncated_mnist(tmp_path) -> None:
    folder = tmp_path / "mnist"
    folder.mkdir()
    whole = gzip.compress(b"\x00\x00\x08\x03" + b"\x00" * 400)
    (folder / "t10k-images-idx3-ubyte.gz").write_bytes(whole[:len(whole) // 2])
    (folder / "t10k-labels-idx1-ubyte.gz").write_bytes(gzip.compress(b"\x00\x00\x08\x01"))
    load_mnist(str(folder), verify_checksums=False)


def unpublished_omniglot_archive(tmp_path) -> None:
    png = tf.io.encode_png(tf.zeros([3, 3, 1], tf.uint8)).numpy()
    _omniglot_zip(tmp_path / "omniglot", [("Greek/character01/0101_01.png", png)])
    load_omniglot(str(tmp_path / "omniglot"), archives=("images_background_small1",))


def mnist_file_of_the_published_size(tmp_path) -> None:
    folder = tmp_path / "mnist"
    folder.mkdir()
    (folder / "t10k-images-idx3-ubyte.gz").write_bytes(bytes(1648877))
    (folder / "t10k-labels-idx1-ubyte.gz").write_bytes(bytes(4542))
    load_mnist(str(folder))


def cub_archive_as_path(tmp_path) -> None:
    (tmp_path / "CUB_200_2011.tgz").write_bytes(b"")
    load_cub(str(tmp_path / "CUB_200_2011.tgz"))


def workdir_of_another_config(tmp_path) -> None:
    workdir = tmp_path / "workdir"
    workdir.mkdir()
    parse_config(["experiments/sinusoid/maml.gin"], ["GradientDescent.learning_rate = 0.01"])
    saved = build_experiment().config
    (workdir / "config.gin").write_text(saved)
    parse_config(["experiments/sinusoid/maml.gin"], ["GradientDescent.learning_rate = 0.1",
                                                     "Loop.num_steps = 2"])
    try:
        train(build_experiment(), str(workdir))
    finally:
        assert (workdir / "config.gin").read_text() == saved  # not overwritten
        assert sorted(os.listdir(workdir)) == ["config.gin"]


def evaluate_more_ways(tmp_path) -> None:
    (tmp_path / "classification.gin").write_text("\n".join(CLASSIFICATION) + "\n")
    parse_config([str(tmp_path / "classification.gin")])
    experiment = build_experiment()  # a 3-way model
    sampler = FewShotClassification(tiny_images(), ways=4, shots=1, queries=1,
                                    train=CLASSES[:6], test=CLASSES[6:])
    evaluate(experiment.learner, sampler, num_tasks=2, batch_size=1)


def evaluate_zero_batch(tmp_path) -> None:
    parse_config(["experiments/sinusoid/maml.gin"])
    experiment = build_experiment()
    evaluate(experiment.learner, experiment.sampler, num_tasks=10, batch_size=0)


def empty_class_folder(tmp_path) -> None:
    (tmp_path / "images" / "cat").mkdir(parents=True)
    (tmp_path / "images" / "cat" / "notes.txt").write_text("no images here")
    load_image_folder(str(tmp_path / "images"))


def undecodable_folder_image(tmp_path) -> None:
    (tmp_path / "images" / "cat").mkdir(parents=True)
    (tmp_path / "images" / "cat" / "001.jpg").write_bytes(b"\xff\xd8 not a jpeg")
    load_image_folder(str(tmp_path / "images"))


def dangling_folder_image(tmp_path) -> None:
    (tmp_path / "images" / "cat").mkdir(parents=True)
    (tmp_path / "images" / "cat" / "001.jpg").symlink_to(tmp_path / "moved.jpg")
    load_image_folder(str(tmp_path / "images"))


def leaked_test_image(tmp_path) -> None:
    from tests import benchmark_fixtures
    classes = benchmark_fixtures.write_mini_imagenet_csv(str(tmp_path / "mini"),
                                                         per_class=1, size=8)
    with open(tmp_path / "mini" / "train.csv", "a") as f:
        f.write(f"{classes['test'][0]}00000001.jpg,{classes['train'][0]}\n")
    load_mini_imagenet(str(tmp_path / "mini"), image_size=8)


def classes_of_the_same_indices(tmp_path) -> None:
    import pickle
    (tmp_path / "mini").mkdir()
    cache = {"image_data": np.zeros([2, 84, 84, 3], np.uint8),
             "class_dict": {"n01": [0, 1], "n02": [1]}}
    for split in ("train", "val", "test"):
        (tmp_path / "mini" / f"mini-imagenet-cache-{split}.pkl").write_bytes(
            pickle.dumps(cache, protocol=4))
    load_mini_imagenet(str(tmp_path / "mini"))


def malformed_split_csv(tmp_path) -> None:
    (tmp_path / "mini" / "images").mkdir(parents=True)
    (tmp_path / "mini" / "train.csv").write_text("filename,label\nn0153282900000005.jpg\n")
    load_mini_imagenet(str(tmp_path / "mini"))


def truncated_pickle_cache(tmp_path) -> None:
    import pickle
    (tmp_path / "mini").mkdir()
    cache = {"image_data": np.zeros([2, 84, 84, 3], np.uint8), "class_dict": {"n01": [0, 1]}}
    data = pickle.dumps(cache, protocol=4)
    (tmp_path / "mini" / "mini-imagenet-cache-train.pkl").write_bytes(data[:len(data) // 2])
    load_mini_imagenet(str(tmp_path / "mini"))


def pickle_cache_naming_code(tmp_path) -> None:
    import pickle
    (tmp_path / "mini").mkdir()
    (tmp_path / "mini" / "mini-imagenet-cache-train.pkl").write_bytes(
        pickle.dumps({"image_data": print, "class_dict": {}}))
    load_mini_imagenet(str(tmp_path / "mini"))


def split_of_other_counts(tmp_path) -> None:
    from tests import benchmark_fixtures
    benchmark_fixtures.write_mini_imagenet_csv(str(tmp_path / "mini"), per_class=1, size=8)
    rows = (tmp_path / "mini" / "val.csv").read_text().splitlines()
    (tmp_path / "mini" / "val.csv").write_text("\n".join(rows[:-1]) + "\n")
    load_mini_imagenet(str(tmp_path / "mini"), image_size=8)


def undecodable_cache_png(tmp_path) -> None:
    from tests import benchmark_fixtures
    (tmp_path / "tiered").mkdir()
    labels = {"label_specific": np.zeros(1, np.int64), "label_general": np.zeros(1, np.int64),
              "label_specific_str": ["n01"], "label_general_str": ["c"]}
    (tmp_path / "tiered" / "train_labels.pkl").write_bytes(benchmark_fixtures.py2_pickle(labels))
    (tmp_path / "tiered" / "train_images_png.pkl").write_bytes(benchmark_fixtures.py2_pickle(
        [np.frombuffer(b"\x89PNG\r\n\x1a\n broken", np.uint8)]))
    load_tiered_imagenet(str(tmp_path / "tiered"))


def tiered_split_file_missing_a_class(tmp_path) -> None:
    from tests import benchmark_fixtures
    small = {split: (benchmark_fixtures.wnids(2, 10 * i), ["c", "c"])
             for i, split in enumerate(("train", "validation", "test"))}
    benchmark_fixtures.write_tiered_imagenet_images(str(tmp_path / "tiered"), 1, classes=small)
    (tmp_path / "tiered" / "train.csv").write_text("n01000000,c\n")
    load_tiered_imagenet(str(tmp_path / "tiered"), strict=False, image_size=8)


def _meta_dataset_source(tmp_path):
    from tests.benchmark_fixtures import write_meta_dataset
    write_meta_dataset(str(tmp_path), ("aircraft",))
    return tmp_path / "aircraft"


def missing_meta_dataset_class_file(tmp_path) -> None:
    os.remove(_meta_dataset_source(tmp_path) / "2.tfrecords")
    MetaDataset(str(tmp_path), train_sources=("aircraft",), min_ways=2).dataset(1)


def damaged_meta_dataset_record(cut: bool):
    def run(tmp_path) -> None:
        from metalearn.tasks.datasets.meta_dataset import RecordReader
        source = _meta_dataset_source(tmp_path)
        data = (source / "0.tfrecords").read_bytes()
        length = int.from_bytes(data[:8], "little")  # the first record's, kept
        (source / "0.tfrecords").write_bytes(data[:-7] if cut else data[:12] + b"\xff" *
                                             length + data[12 + length:])
        RecordReader(load_meta_dataset_source(str(source))).read(0, [0])
    return run


def meta_dataset_spec_of_other_counts(tmp_path) -> None:
    source = _meta_dataset_source(tmp_path)
    spec = (source / "dataset_spec.json").read_text()
    (source / "dataset_spec.json").write_text(spec.replace('"1": 4', '"1": 5', 1))
    from metalearn.tasks.datasets.meta_dataset import RecordReader
    RecordReader(load_meta_dataset_source(str(source))).offsets(1)


def damaged_meta_dataset_spec(tmp_path) -> None:
    (_meta_dataset_source(tmp_path) / "dataset_spec.json").write_text("{not json")
    load_meta_dataset_source(str(tmp_path / "aircraft"))


def scalar_metric_on_padded_episodes(tmp_path) -> None:
    from metalearn.tasks.episode import MaskedLabels
    learner = metalearn.Learner(metalearn.models.mlp((2,), hidden=(), outputs=3),
                                loss="sparse_categorical_crossentropy",
                                metrics={"mean_accuracy": lambda y, p: tf.reduce_mean(
                                    metalearn.learners.learner.accuracy(y, p))})
    labels = MaskedLabels(tf.constant([0, 1, -1]), tf.constant([True, True, False]),
                          tf.constant([True, True, False]))
    learner.query_metrics(labels, tf.zeros([3, 3]))


class ThirdPartyHead(metalearn.heads.Head):
    """A head written outside the library that does not declare ``padding`` among its
    capabilities."""

    def fit(self, embeddings, labels, ways):
        return tf.zeros([tf.shape(embeddings)[1], ways], embeddings.dtype)

    def logits(self, state, embeddings):
        return tf.matmul(embeddings, state)


def head_without_padding_on_padded_episodes(tmp_path) -> None:
    from metalearn.tasks.episode import MaskedLabels
    learner = metalearn.EmbeddingLearner(metalearn.models.mlp((2,), hidden=(), outputs=3),
                                         head=ThirdPartyHead(), ways=2)
    labels = MaskedLabels(tf.constant([0, 1, 0]), tf.constant([True, True, False]),
                          tf.constant([True, True]))
    learner.adapt(tf.zeros([3, 2]), labels)


def head_with_a_padding_flag(tmp_path) -> None:
    class FlaggedHead(ThirdPartyHead):
        supports_padding = True


def malformed_cub_index(tmp_path) -> None:
    (tmp_path / "CUB_200_2011").mkdir()
    (tmp_path / "CUB_200_2011" / "images.txt").write_text("001.Bird/a.jpg\n")
    load_cub(str(tmp_path / "CUB_200_2011"))

# --- issue 18: more bad inputs, each a row -----------------------------------------


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


IMAML = ["include 'experiments/sinusoid/imaml.gin'", "Loop.num_steps = 2",
         "Loop.log_every = 1"]


def _gauss_newton_with_opaque_loss():
    class OpaqueLoss(metalearn.Learner):
        def support_loss(self, weights, x, y):
            return super().support_loss(weights, x, y)

    model = metalearn.models.mlp((1,), hidden=(), outputs=1)
    learner = OpaqueLoss(model, metalearn.adapters.ImplicitGradientDescent(
        curvature="gauss_newton"), loss="mse")
    learner.adapt(tf.zeros([4, 1]), tf.zeros([4, 1]))


def broken_module(tmp_path):
    (tmp_path / "broken_rule.py").write_text("import gin\n\nrate = learning_rat\n")
    parse_config(["experiments/sinusoid/maml.gin"],
                 modules=[str(tmp_path / "broken_rule.py")])


def exiting_module(tmp_path):
    (tmp_path / "exiting_rule.py").write_text("import sys\n\nsys.exit(0)\n")
    parse_config(["experiments/sinusoid/maml.gin"],
                 modules=[str(tmp_path / "exiting_rule.py")])


def received_workdir(tmp_path):
    from tests.run_fixtures import saved_run
    saved_run(str(tmp_path / "run"))
    (tmp_path / "run" / "modules.json").write_text(f'["{tmp_path / "their_rule.py"}"]')
    from metalearn.training import restore
    restore(str(tmp_path / "run"))


def gin_only(name, bad_line, error, excerpt, base=SINUSOID, points_to="the binding"):
    """A bad binding whose error names the parameter (not gin's file and line)."""
    lines = list(base) + [bad_line]
    return Case(name, f"`{bad_line}`", error, excerpt, lambda p: run_gin(p, lines), None,
                points_to)


# issue 32: the library's cases of the third reliability round


def resumed_below_its_step(tmp_path) -> None:
    saved_run(tmp_path / "run", step=5)
    parse_config(["experiments/sinusoid/maml.gin"], ["mlp.hidden = (4,)",
                                                     "Loop.num_steps = 3"])
    train(build_experiment(), str(tmp_path / "run"))


def restored_after_an_edit(tmp_path) -> None:
    saved_run(tmp_path / "run")
    config = tmp_path / "run" / "config.gin"
    config.write_text(config.read_text().replace("mlp.activation = 'relu'",
                                                 "mlp.activation = 'tanh'"))
    metalearn.restore(str(tmp_path / "run"))


def unknown_gymnasium_id(tmp_path) -> None:
    from metalearn.rl import GymCollector, HalfCheetahVelocity
    GymCollector(HalfCheetahVelocity(env_id="HalfCheetah-v99"), rollouts=1)


def simulator_gives_nan(tmp_path) -> None:
    from metalearn.rl import GymCollector, HalfCheetahVelocity
    nan_policy = lambda observations, seed: (np.full([1, 6], np.nan, np.float32),
                                             np.zeros([1], np.float32))
    GymCollector(HalfCheetahVelocity(horizon=3), rollouts=1).collect(nan_policy, 1.5, [4, 2])


def task_reward_raises(tmp_path) -> None:
    from metalearn.rl import GymCollector, HalfCheetahVelocity

    class SpeedReward(HalfCheetahVelocity):
        def task_reward(self, task, reward, info):
            return -np.abs(info["x_speed"] - task)  # HalfCheetah's key is x_velocity
    policy = lambda observations, seed: (np.zeros([1, 6], np.float32),
                                         np.zeros([1], np.float32))
    GymCollector(SpeedReward(horizon=3), rollouts=1).collect(policy, 1.5, [4, 2])


def simulator_step_hangs(tmp_path) -> None:
    import time
    from metalearn.rl import GymCollector, HalfCheetahVelocity
    collector = GymCollector(HalfCheetahVelocity(horizon=3), rollouts=1,
                             step_time_limit=0.5)
    step, calls = collector.env.step, []

    def hanging(actions):  # the third step hangs
        calls.append(actions)
        if len(calls) == 3:
            time.sleep(60)
        return step(actions)
    collector.env.step = hanging
    policy = lambda observations, seed: (np.zeros([1, 6], np.float32),
                                         np.zeros([1], np.float32))
    collector.collect(policy, 1.5, [4, 2])


def simulator_time_limit_negative(tmp_path) -> None:
    from metalearn.rl import GymCollector, HalfCheetahVelocity
    GymCollector(HalfCheetahVelocity(horizon=3), rollouts=1, step_time_limit=-1.0)


def mujoco_not_installed(tmp_path) -> None:
    from metalearn.rl import GymCollector, HalfCheetahVelocity
    environment = HalfCheetahVelocity(horizon=3)
    with not_installed("mujoco"):
        GymCollector(environment, rollouts=1)


def python_environment_in_the_step(tmp_path) -> None:
    parse_config(["experiments/rl/half_cheetah_vel_maml.gin"],
                 ["HalfCheetahVelocity.horizon = 3", "mlp.hidden = (4,)",
                  "Experiment.meta_batch_size = 1"])
    try:
        experiment = build_experiment()
        episodes = experiment.sampler.sample(tf.constant([0, 0], tf.int64), 1)
        experiment.learner.meta_metrics(episodes, formulation="unrolled")
    finally:
        gin.clear_config()


def restored_into_other_sizes(tmp_path) -> None:
    saved_run(tmp_path / "run")
    metalearn.restore(str(tmp_path / "run"), gin_params=["mlp.hidden = (8,)"])


def label_outside_the_classes(tmp_path) -> None:
    learner = metalearn.learners.EmbeddingLearner(
        metalearn.models.mlp((2,), hidden=(), outputs=4), metalearn.heads.RidgeHead(),
        ways=3)
    learner.adapt(tf.zeros([3, 2]), tf.constant([0, 1, 7]))


def evaluation_on_a_disk_that_fills(tmp_path) -> None:
    from metalearn import evaluate as entry_point
    saved_run(tmp_path / "run")
    gin.clear_config()
    with full_disk("eval.json"):
        entry_point.run(str(tmp_path / "run"), gin_params=EVALUATE_SMALL)


def evaluation_on_a_full_disk(tmp_path) -> None:
    from metalearn import evaluate as entry_point
    (tmp_path / "config.gin").write_text("")
    with no_free_space():
        entry_point.run(str(tmp_path))


def report_of_no_finished_run(tmp_path) -> None:
    from metalearn import report
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.gin").write_text("Loop.num_steps = 10\n")
    report.report([str(tmp_path)], plots=False)


def evaluate_workdir_that_is_a_file(tmp_path) -> None:
    from metalearn import evaluate as entry_point
    (tmp_path / "run").write_text("")
    entry_point.run(str(tmp_path / "run"))


def non_utf8_gin_file(tmp_path) -> None:
    (tmp_path / "bad.gin").write_bytes(b"include 'experiments/sinusoid/maml.gin'\n"
                                       b"# caf\xe9\n")
    parse_config([str(tmp_path / "bad.gin")])


def undecodable_meta_dataset_image(tmp_path) -> None:
    file = _meta_dataset_source(tmp_path) / "0.tfrecords"
    records = [r.numpy() for r in tf.data.TFRecordDataset(str(file))]
    example = tf.train.Example()
    example.ParseFromString(records[0])
    image = example.features.feature["image"].bytes_list
    image.value[0] = image.value[0][:2] + b"\x00" * 64  # JPEG's magic, no JPEG
    with tf.io.TFRecordWriter(str(file)) as writer:
        for record in [example.SerializeToString()] + records[1:]:
            writer.write(record)
    sampler = MetaDataset(str(tmp_path), train_sources=("aircraft",), min_ways=2,
                          max_ways=6, max_query=1, max_support_set_size=20, image_size=8)
    for _ in sampler.dataset(1, num_steps=30):  # until an episode reads record 0
        pass


def metasgd_into_maml(tmp_path) -> None:
    metasgd = saved_run(tmp_path / "metasgd", "experiments/sinusoid/metasgd.gin")
    saved_run(tmp_path / "maml")
    metalearn.restore(str(tmp_path / "maml"), checkpoint=metasgd)


def maml_into_metasgd(tmp_path) -> None:
    maml = saved_run(tmp_path / "maml")
    saved_run(tmp_path / "metasgd", "experiments/sinusoid/metasgd.gin")
    metalearn.restore(str(tmp_path / "metasgd"), checkpoint=maml)


def lost_config_changed(tmp_path) -> None:
    saved_run(tmp_path / "run")
    os.remove(tmp_path / "run" / "config.gin")
    parse_config(["experiments/sinusoid/maml.gin"], ["mlp.hidden = (4,)",
                                                     "GradientDescent.learning_rate = 0.5"])
    train(build_experiment(), str(tmp_path / "run"))


def no_intact_checkpoint(tmp_path) -> None:
    saved_run(tmp_path / "run")
    os.remove(tmp_path / "run" / "checkpoints" / "ckpt-1.index")
    metalearn.restore(str(tmp_path / "run"))


def damaged_given_checkpoint(tmp_path) -> None:
    path = saved_run(tmp_path / "run")
    with open(path + ".data-00000-of-00001", "wb") as f:
        f.write(b"garbage")
    metalearn.restore(str(tmp_path / "run"), checkpoint=path)


def workdir_in_use(tmp_path) -> None:
    from metalearn.runs.lock import WorkdirLock
    with WorkdirLock(str(tmp_path / "run")):
        parse_config(["experiments/sinusoid/maml.gin"], ["Loop.num_steps = 1"])
        train(build_experiment(), str(tmp_path / "run"))


def evaluate_output(output):
    def run(tmp_path) -> None:
        from metalearn import evaluate as entry_point
        (tmp_path / "config.gin").write_text("")
        entry_point.run(str(tmp_path), output)
    return run


class AlwaysNaN(metalearn.Learner):
    def query_metrics(self, query_y, predictions):
        results = dict(super().query_metrics(query_y, predictions))
        results["loss"] = results["loss"] + np.nan
        return results


def all_steps_skipped(tmp_path) -> None:
    import keras
    from metalearn.adapters import GradientDescent
    from metalearn.models import mlp
    from metalearn.tasks import Sinusoid
    keras.utils.set_random_seed(0)
    learner = AlwaysNaN(mlp(hidden=(4,)), adapter=GradientDescent(1, 0.01),
                        loss=keras.losses.MeanSquaredError())
    train(metalearn.Experiment(learner, Sinusoid(shots=5, queries=5), meta_batch_size=2,
                               loop=metalearn.training.Loop(num_steps=8, log_every=4,
                                                            on_non_finite="skip")),
          str(tmp_path / "run"))


def sinusoid_evaluate(**kwargs):
    def run(tmp_path) -> None:
        parse_config(["experiments/sinusoid/maml.gin"], ["mlp.hidden = (4,)"])
        experiment = build_experiment()
        evaluate(experiment.learner, experiment.sampler, **dict(
            dict(num_tasks=4, batch_size=2), **kwargs))
    return run


def with_environment(name, value, run):
    def wrapped(tmp_path) -> None:
        saved = os.environ.get(name)
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
        try:
            run()
        finally:
            if saved is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = saved
    return wrapped


def run_json(name, text):
    def run(tmp_path) -> None:
        from metalearn.studies import results
        (tmp_path / "run").mkdir()
        (tmp_path / "run" / name).write_text(text)
        results.load_run(str(tmp_path / "run"))
    return run


def garbled_progress(tmp_path) -> None:
    from metalearn.training.checkpoint import Progress
    progress = Progress()
    progress.state.assign("{'window': oops")
    progress.load("ckpt-7")


def unequal_task_counts(tmp_path) -> None:
    from metalearn.tasks import Episode
    Episode(tf.zeros([2, 5, 1]), tf.zeros([2, 5, 1]), tf.zeros([3, 10, 1]),
            tf.zeros([3, 10, 1])).check_tasks()


def gin_text(name, text, params=()):
    """Parses ``<tmp>/<name>`` holding ``text`` (and ``params``), then builds."""
    def run(tmp_path) -> None:
        (tmp_path / name).write_text(text.replace("<tmp>", str(tmp_path)))
        parse_config([str(tmp_path / name)], list(params))
        build_experiment()
    return run


def include_cycle(tmp_path) -> None:
    (tmp_path / "b.gin").write_text(f"Sinusoid.shots = 5\ninclude '{tmp_path}/a.gin'\n")
    gin_text("a.gin", "include '<tmp>/b.gin'\n")(tmp_path)


def omniglot_other_layout(tmp_path) -> None:
    png = tf.io.encode_png(tf.zeros([3, 3, 1], tf.uint8)).numpy()
    _omniglot_zip(tmp_path / "omniglot", [("Greek_character01_0101_01.png", png)])
    load_omniglot(str(tmp_path / "omniglot"), archives=("images_background_small1",),
                  verify_checksums=False)


def _regression_learner(**kwargs):
    import keras
    from metalearn.adapters import GradientDescent
    from metalearn.models import mlp
    keras.utils.set_random_seed(0)
    model = mlp(hidden=(4,))
    for name, value in kwargs.items():
        setattr(model, name, value)
    return metalearn.Learner(model, adapter=GradientDescent(1, 0.01), loss="mse")


def adapt_wide_targets(tmp_path) -> None:
    _regression_learner().adapt(tf.zeros([10, 1]), tf.zeros([10, 7]))


def meta_loss_unequal_tasks(tmp_path) -> None:
    from metalearn.tasks import Episode
    _regression_learner().meta_loss(Episode(tf.zeros([2, 5, 1]), tf.zeros([2, 5, 1]),
                                            tf.zeros([3, 10, 1]), tf.zeros([3, 10, 1])))


def _two_workers(index=0):
    import json
    from tests.distributed_case import free_ports
    ports = free_ports(2)
    return json.dumps({"cluster": {"worker": [f"localhost:{p}" for p in ports]},
                       "task": {"type": "worker", "index": index}})


def multi_worker(tf_config, **kwargs):
    return with_environment("TF_CONFIG", tf_config, lambda: _distribute().make_strategy(
        "multi_worker", **kwargs))


def port_taken(tmp_path) -> None:
    import json
    import socket
    config = _two_workers()
    port = int(json.loads(config)["cluster"]["worker"][0].rsplit(":", 1)[1])
    with socket.create_server(("", port)):
        multi_worker(config, peer_timeout=1.0)(tmp_path)


def finished_run_garbled_metrics(tmp_path) -> None:
    parse_config(["experiments/sinusoid/maml.gin"], ["mlp.hidden = (4,)",
                                                     "Loop.num_steps = 1"])
    train(build_experiment(), str(tmp_path / "run"))
    (tmp_path / "run" / "metrics.json").write_text('{"loss": 0.')
    parse_config(["experiments/sinusoid/maml.gin"], ["mlp.hidden = (4,)",
                                                     "Loop.num_steps = 1"])
    train(build_experiment(), str(tmp_path / "run"))


def sweep_run_without_keys(tmp_path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "sweep_run.json").write_text('{"name": "lr=0.1", "bindings": {}}')
    sweeps_module().train_and_evaluate(str(tmp_path / "run"))


def garbled_workdir_config(tmp_path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.gin").write_text("Sinusoid.shots = 5\nSinusoid.queries = = 3\n")
    metalearn.restore(str(tmp_path / "run"))


def cluster_error():
    from metalearn.runs import cluster
    return cluster.ClusterTimeoutError


def sweeps_module():
    from metalearn.studies import sweeps
    return sweeps


def sweeps_error():
    return sweeps_module().SweepError


def _distribute():
    from metalearn.training import distribute
    return distribute


PRETRAINING = [
    "Experiment.learner = @ClassifierBaseline()",
    "Experiment.sampler = @WholeClassBatches()",
    "WholeClassBatches.episodes = @FewShotClassification()",
    "WholeClassBatches.batch_size = 4",
    "Experiment.meta_batch_size = 1",
    "Loop.num_steps = 2",
    "Loop.log_every = 1",
] + [line for line in CLASSIFICATION if line.startswith(("FewShotClassification", "conv_net"))] + [
    "ClassifierBaseline.model = @conv_net()",
    "ClassifierBaseline.drop_head = 'head'",
    "ClassifierBaseline.ways = 3",
]


def warm_start_without_head(tmp_path) -> None:
    """A pre-training run's backbone has no classifier head: MAML's net does."""
    import keras
    import tensorflow as tf
    from metalearn import models
    from metalearn.training import restore_weights
    full = models.conv_net((4, 4, 1), outputs=3, filters=4, blocks=1)
    body = keras.Model(full.inputs, full.get_layer("head").input)
    holder = tf.Module()
    holder.model = body
    tf.train.Checkpoint(learner=holder).write(str(tmp_path / "pretrain" / "checkpoints" /
                                                  "ckpt-1"))
    restore_weights(models.conv_net((4, 4, 1), outputs=3, filters=4, blocks=1),
                    str(tmp_path / "pretrain" / "checkpoints" / "ckpt-1"))


def _neural_process_steps():
    learner = metalearn.Learner(
        metalearn.models.mlp((9,), hidden=(), outputs=2, name="decoder"),
        metalearn.adapters.ConditionalNeuralProcess(
            metalearn.models.mlp((2,), hidden=(), outputs=8, name="encoder")),
        loss=metalearn.functional.gaussian_nll)
    learner.adapt(tf.zeros([3, 1]), tf.zeros([3, 1]), steps=1)


def _in_context_ways(padded: bool = True):
    learner = metalearn.Learner(metalearn.models.mlp((6,), hidden=(), outputs=4),
                                metalearn.adapters.InContext(ways=3, width=4, depth=1),
                                loss=softmax_cross_entropy)
    if not padded:  # a 5-way episode as it is
        learner.meta_metrics(synthetic_classification(0, tasks=1, ways=5))
    task = synthetic_classification(0, tasks=1).task(0)
    padded = pad_episodes([task], task.support_x.shape[0], task.query_x.shape[0], 5)
    learner.meta_metrics(padded)


def learned_rule_on_other_weights(tmp_path) -> None:
    from metalearn.adapters import GradientDescent, LearnedRule, Mask, StepInfo
    rule = LearnedRule(0.01)
    metalearn.Learner(metalearn.models.mlp((2,), hidden=(3,), outputs=1),
                      GradientDescent(2, update=[Mask(("head",)), rule]), loss="mse")
    rule.update({"mlp/hidden0/kernel": tf.zeros([2, 3])},
                rule.init({"mlp/hidden0/kernel": tf.zeros([2, 3])}), {}, StepInfo(0, 2))


def learned_rule_optimizer_climbing(tmp_path) -> None:
    from metalearn.adapters import LearnedRule, LearnedRuleOptimizer
    rule = LearnedRule(hidden=(4,))
    rule.create()
    LearnedRuleOptimizer(rule, learning_rate=-0.5)


def learned_rule_of_another_shape(tmp_path) -> None:
    from metalearn.adapters import LearnedRule
    saved = LearnedRule(hidden=(16,))
    saved.create()
    LearnedRule(hidden=(8,)).create("float32", saved.values())


def attentive_np_beyond_its_budget(tmp_path) -> None:
    from metalearn.adapters import AttentiveNeuralProcess
    from metalearn.functional import gaussian_nll
    encoder = metalearn.models.mlp((2,), hidden=(8,), outputs=8, name="encoder")
    decoder = metalearn.models.mlp((9,), hidden=(8,), outputs=2, name="decoder")
    learner = metalearn.Learner(decoder, AttentiveNeuralProcess(
        encoder, heads=2, memory_budget="1MiB"), loss=gaussian_nll)
    x = tf.zeros([2000, 1])
    learner.predict(learner.adapt(x, x), x)


def _rule_file(tmp_path, change=None):
    """A saved rule's file, its members changed by ``change(members)``."""
    from metalearn.adapters import LearnedRule
    rule = LearnedRule(hidden=(4,))
    rule.create()
    path = tmp_path / "rule.npz"
    rule.save(str(path))
    if change is not None:
        with np.load(path, allow_pickle=False) as data:
            members = {k: data[k] for k in data.files}
        change(members)
        np.savez(path, **members)
    return str(path)


def truncated_rule_file(tmp_path) -> None:
    from metalearn.adapters import LearnedRule
    path = _rule_file(tmp_path)
    with open(path, "rb") as f:
        whole = f.read()
    with open(path, "wb") as f:
        f.write(whole[:len(whole) // 2])
    LearnedRule.load(path)


def rule_file_of_bad_json(tmp_path) -> None:
    from metalearn.adapters import LearnedRule
    LearnedRule.load(_rule_file(tmp_path, lambda m: m.update(
        __config__=np.array("{not json"))))


def rule_file_of_nan_weights(tmp_path) -> None:
    from metalearn.adapters import LearnedRule
    LearnedRule.load(_rule_file(tmp_path, lambda m: m.update(
        output_bias=np.array([0.0, np.nan]))))


def mixed_padded_episodes(tmp_path) -> None:
    from metalearn.tasks import Episode
    real = Episode(np.zeros([2, 1], np.float32), np.zeros([2, 1], np.float32),
                   np.zeros([1, 1], np.float32), np.zeros([1, 1], np.float32))
    labelled = Episode(np.zeros([2, 1], np.float32), np.array([0, 1]),
                       np.zeros([1, 1], np.float32), np.array([0]))
    pad_episodes([real, labelled], max_support=3, max_query=2, max_ways=2)


# --- the cases: one per row of docs/errors.md --------------------------------------


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    bad_input: str                 # as the docs table shows it
    error: Type[BaseException]
    excerpt: str                   # in the message
    run: Callable[[object], None]  # raises, given a tmp_path
    where: Optional[Callable[[object], str]] = None  # in the message too
    points_to: str = "gin file and line"


def gin_case(name, bad_line, error, excerpt, base=SINUSOID) -> Case:
    lines = list(base) + [bad_line]
    return Case(name, f"`{bad_line}`", error, excerpt, lambda p: run_gin(p, lines),
                gin_line(lines))


CASES: List[Case] = [
    gin_case("unknown configurable", "GradientDescnet.steps = 5", ValueError,
             "No configurable matching 'GradientDescnet'"),
    gin_case("unknown parameter", "Experiment.num_stepz = 5", ValueError,
             "doesn't have a parameter named 'num_stepz'"),
    gin_case("mistyped value", "Loop.num_steps = '1000'", TypeError,
             "Loop.num_steps must be an integer, got '1000' (str)"),
    gin_case("mistyped inner steps", "GradientDescent.steps = 'two'", TypeError,
             "GradientDescent.steps must be a whole number >= 0, got 'two' (str)"),
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
    gin_case("negative inner steps", "GradientDescent.steps = -1", ValueError,
             "GradientDescent.steps must be a whole number >= 0, got -1"),
    gin_case("zero inner learning rate", "GradientDescent.learning_rate = 0.0", ValueError,
             "GradientDescent.learning_rate must be > 0, got 0.0"),
    gin_case("negative outer learning rate", "keras.optimizers.Adam.learning_rate = -0.001",
             ValueError, "the optimizer's learning_rate must be > 0, got -0.001 (Adam)"),
    gin_case("zero noise scale of evolution strategies", "EvolutionStrategies.sigma = 0.0",
             ValueError, "EvolutionStrategies.sigma (the noise scale) must be > 0, got 0.0",
             base=SINUSOID_ES),
    gin_case("empty population of evolution strategies",
             "EvolutionStrategies.population = 0", ValueError,
             "EvolutionStrategies.population (antithetic pairs) must be a whole number >= 1, "
             "got 0", base=SINUSOID_ES),
    gin_case("zero sinusoid shots", "Sinusoid.shots = 0", ValueError,
             "shots must be >= 1, got 0"),
    gin_case("model output size, regression", "mlp.outputs = 2", ValueError,
             "predicts shape [10, 2] but the query targets of Sinusoid have shape [10, 1]"),
    gin_case("ways above the training classes", "FewShotClassification.ways = 8", ValueError,
             "ways=8 is more than the 6 classes the 'train' split has in all",
             base=CLASSIFICATION),
    gin_case("ways above the test classes", "FewShotClassification.ways = 5", ValueError,
             "ways=5 is more than the 4 classes the 'test' split has in all",
             base=CLASSIFICATION),
    gin_case("shots + queries above the examples", "FewShotClassification.queries = 4",
             ValueError, "1 shots + 4 queries need 5 examples per class, but class 'c0' of "
             "the 'train' split has 4", base=CLASSIFICATION),
    gin_case("model output size, classification", "conv_net.outputs = 4", ValueError,
             "outputs 4 classes (shape [3, 4]) but the tasks have 3 "
             "(FewShotClassification.ways=3)", base=CLASSIFICATION),
    gin_case("unknown class in a split", "FewShotClassification.test = ['c6', 'x1']",
             ValueError, "unknown class ['x1'] in the 'test' split", base=CLASSIFICATION),
    Case("missing data folder", "`load_omniglot(path='<tmp>/nowhere')`", FileNotFoundError,
         "Omniglot folder", lambda p: load_omniglot(str(p / "nowhere")),
         lambda p: str(p / "nowhere"), "the folder"),
    Case("missing archive", "Omniglot folder without `images_background_small1.zip`",
         FileNotFoundError, "not found (folder",
         lambda p: (p / "empty").mkdir() or load_omniglot(
             str(p / "empty"), archives=("images_background_small1",)),
         lambda p: str(p / "empty" / "images_background_small1.zip"), "the missing file"),
    Case("damaged zip", "`images_background_small1.zip` that is not a zip (checksums off)", ValueError,
         "is not a readable zip file", damaged_zip,
         lambda p: str(p / "omniglot" / "images_background_small1.zip"), "the zip file"),
    Case("undecodable PNG", "a zip entry `.png` holding no PNG (checksums off)", ValueError,
         "is not a decodable PNG image", undecodable_png,
         lambda p: "images_background_small1/Greek/character01/0101_01.png", "entry and zip"),
    Case("corrupted zip entry", "a zip whose PNG entry fails its CRC check (checksums off)", ValueError,
         "is damaged: entry 'images_background_small1/Greek/character01/0101_01.png' cannot "
         "be read", corrupted_zip_entry,
         lambda p: str(p / "omniglot" / "images_background_small1.zip"), "entry and zip"),
    Case("missing MNIST files", "`load_mnist(path=<empty folder>)`", FileNotFoundError,
         "MNIST 'test' split: none of",
         lambda p: (p / "mnist").mkdir() or load_mnist(str(p / "mnist")),
         lambda p: str(p / "mnist" / "t10k-images-idx3-ubyte.gz"), "the files looked for"),
    Case("truncated MNIST file", "a cut-off `t10k-images-idx3-ubyte.gz` (checksums off)", ValueError,
         "cannot be read as gzip-compressed IDX data", truncated_mnist,
         lambda p: str(p / "mnist" / "t10k-images-idx3-ubyte.gz"), "the file"),
    Case("MNIST file of the wrong kind", "a labels file named `t10k-images-idx3-ubyte.gz` (checksums off)",
         ValueError, "is not an IDX file of the expected kind: magic number 2049, expected "
         "2051", swapped_mnist_files,
         lambda p: str(p / "mnist" / "t10k-images-idx3-ubyte.gz"), "the file"),
    Case("archive other than the published one", "a valid `images_background_small1.zip` "
         "of other bytes", ChecksumError, "is not the published file: ",
         unpublished_omniglot_archive,
         lambda p: str(p / "omniglot" / "images_background_small1.zip"),
         "the file, both sizes, the published SHA-256, its source, `verify_checksums=False`"),
    Case("published size, other bytes", "a `t10k-images-idx3-ubyte.gz` of 1648877 zero "
         "bytes", ChecksumError, "the published file's is "
         "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
         mnist_file_of_the_published_size,
         lambda p: str(p / "mnist" / "t10k-images-idx3-ubyte.gz"),
         "the file, both SHA-256s, their source, `verify_checksums=False`"),
    Case("empty class folder", "`load_image_folder` on a folder whose `cat/` has no images",
         ValueError, "holds no image files", empty_class_folder,
         lambda p: str(p / "images" / "cat"), "the class folder"),
    Case("undecodable image in an image folder", "`cat/001.jpg` holding no JPEG", ValueError,
         "is not a decodable image", undecodable_folder_image,
         lambda p: str(p / "images" / "cat" / "001.jpg"), "the file"),
    Case("dangling symbolic link in an image folder", "`cat/001.jpg` a link to a file "
         "that was moved", FileNotFoundError, "is a dangling symbolic link",
         dangling_folder_image, lambda p: str(p / "images" / "cat" / "001.jpg"),
         "the link and its target"),
    Case("test image listed for training", "a mini-ImageNet test image also listed in "
         "`train.csv` (under a training class)", ValueError, "is in both class",
         leaked_test_image, lambda p: str(p / "mini" / "test.csv"),
         "the image, both classes, splits and files"),
    Case("two classes of the same images", "`class_dict` of a mini-ImageNet cache giving "
         "two classes the same image index", ValueError,
         "of the 'train' split", classes_of_the_same_indices,
         lambda p: str(p / "mini" / "mini-imagenet-cache-train.pkl"),
         "the image, both classes and the file"),
    Case("malformed split CSV row", "a mini-ImageNet `train.csv` row without its label",
         ValueError, "line 2: expected 'filename,label'", malformed_split_csv,
         lambda p: str(p / "mini" / "train.csv"), "the file and line"),
    Case("truncated pickle cache", "a cut-off `mini-imagenet-cache-train.pkl`", ValueError,
         "is not a pickle of plain data: the file ends", truncated_pickle_cache,
         lambda p: str(p / "mini" / "mini-imagenet-cache-train.pkl"), "the file"),
    Case("pickle cache naming code", "a `mini-imagenet-cache-train.pkl` that refers to a "
         "function", ValueError, "it refers to builtins.print, which is not plain data",
         pickle_cache_naming_code,
         lambda p: str(p / "mini" / "mini-imagenet-cache-train.pkl"), "the file"),
    Case("split of other class counts", "a mini-ImageNet `val.csv` with a class cut off",
         ValueError, "the 'validation' split has 15 classes, the canonical split has 16",
         split_of_other_counts, lambda p: "strict=False", "the files and `strict=False`"),
    Case("undecodable PNG in a pickle cache", "a tiered-ImageNet `train_images_png.pkl` "
         "entry holding no PNG", ValueError, "image 0 of tiered-ImageNet images file",
         undecodable_cache_png, lambda p: str(p / "tiered" / "train_images_png.pkl"),
         "the entry and file"),
    Case("split file missing a class folder", "tiered-ImageNet's `train.csv` without a "
         "class that `train/` holds", ValueError, "does not list the class folder(s) "
         "['n01000001']", tiered_split_file_missing_a_class,
         lambda p: str(p / "tiered" / "train.csv"), "the file and the classes"),
    Case("malformed CUB index line", "an `images.txt` line without its id", ValueError,
         "line 1: expected '<id> <value>'", malformed_cub_index,
         lambda p: str(p / "CUB_200_2011" / "images.txt"), "the file and line"),
    Case("missing Meta-Dataset class file", "a source folder without `2.tfrecords`",
         FileNotFoundError, "Meta-Dataset class file of class 2", missing_meta_dataset_class_file,
         lambda p: str(p / "aircraft" / "2.tfrecords"), "the file (found by `dataset()`)"),
    Case("truncated Meta-Dataset class file", "a cut-off `0.tfrecords`", ValueError,
         "past the end of the file", damaged_meta_dataset_record(cut=True),
         lambda p: str(p / "aircraft" / "0.tfrecords"), "the file and record (in a stream: "
         "inside `tf.errors.InvalidArgumentError`)"),
    Case("Meta-Dataset record that is not an Example", "a `0.tfrecords` record of garbled "
         "bytes", ValueError, "is damaged: record 0 is not a tf.train.Example",
         damaged_meta_dataset_record(cut=False), lambda p: str(p / "aircraft" / "0.tfrecords"),
         "the file and record"),
    Case("Meta-Dataset class file of another size", "`images_per_class` of 5 for a class "
         "file of 4 records", ValueError, "holds 4 records; dataset_spec.json says class 1 "
         "has 5 images", meta_dataset_spec_of_other_counts,
         lambda p: str(p / "aircraft" / "1.tfrecords"), "the file"),
    Case("metric of a scalar on padded episodes", "`Learner.metrics = {'mean_accuracy': "
         "fn}` whose `fn` averages itself, on `MaskedLabels`", ValueError,
         "'mean_accuracy' <lambda> gives values of shape [], but padded episodes "
         "(MaskedLabels) need one value per example", scalar_metric_on_padded_episodes,
         None, "the metric"),
    Case("head without padding on padded episodes", "`EmbeddingLearner(head=ThirdPartyHead())`"
         ", a `Head` subclass whose capabilities do not say `padding=True`, on "
         "`MaskedLabels` (e.g. `MetaDataset` episodes)", ValueError,
         "ThirdPartyHead cannot fit padded episodes (MaskedLabels",
         head_without_padding_on_padded_episodes, None, "the heads that can"),
    Case("a head's padding as a class flag", "`class MyHead(Head): supports_padding = True` "
         "(the 0.3 spelling)", TypeError, "defines 'supports_padding', which metalearn 0.3 "
         "asks of a head's capabilities", head_with_a_padding_flag, None,
         "own_capabilities() returning Capabilities(padding=True)"),
    Case("damaged Meta-Dataset spec", "a `dataset_spec.json` that is not JSON", ValueError,
         "is damaged: not JSON", damaged_meta_dataset_spec,
         lambda p: str(p / "aircraft" / "dataset_spec.json"), "the file"),
    Case("CUB archive not extracted", "`load_cub(path='<tmp>/CUB_200_2011.tgz')`",
         ValueError, "is a file, not the extracted folder",
         cub_archive_as_path,
         lambda p: str(p / "CUB_200_2011.tgz"), "the file, and how to check and extract it"),
    Case("normalisation without statistics", "`FewShotClassification(normalize=True)` on "
         "data whose preprocessing has no mean and std", ValueError,
         "normalize=True needs the data set's per-channel mean and std",
         lambda p: FewShotClassification(tiny_images(), ways=2, normalize=True), None,
         "the loaders that record them"),
    Case("workdir of another config", "`train` into a workdir whose `config.gin` has "
         "another `GradientDescent.learning_rate`", validation.ConfigChangeError,
         "GradientDescent.learning_rate: 0.01 in the workdir, 0.1 now",
         workdir_of_another_config, lambda p: "--allow_config_change",
         "the differing bindings and the override flag"),
    Case("evaluation tasks of more ways than the model's outputs",
         "`evaluate(learner, sampler)`, a 3-way model on 4-way tasks", ValueError,
         "outputs 3 classes (shape [4, 3]) but the tasks have 4 (FewShotClassification.ways=4)",
         evaluate_more_ways, None, "the sampler's binding"),
    Case("zero evaluation batch", "`evaluate(..., batch_size=0)`", ValueError,
         "batch_size must be >= 1, got 0", evaluate_zero_batch, None, "the argument"),
    # issue 18
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
    gin_case("unknown log average", "Loop.log_average = 'mean'", ValueError,
             "Loop.log_average must be one of ('window', 'running'), got 'mean'"),
    gin_case("unknown non-finite policy", "Loop.on_non_finite = 'ignore'", ValueError,
             "Loop.on_non_finite must be one of ('raise', 'skip'), got 'ignore'"),
    gin_case("skipped fraction above 1", "Loop.max_skipped_fraction = 1.5", ValueError,
             "Loop.max_skipped_fraction must be a number in [0, 1], got 1.5"),
    gin_case("unknown formulation", "Experiment.formulation = 'loop'", ValueError,
             "unknown formulation 'loop': one of ['accumulate', 'auto', 'batched', "
             "'map_fn', 'unrolled']"),
    gin_case("thread pools that are not two counts", "Runtime.threads = (2,)",
             ValueError, "Runtime.threads must be (intra_op, inter_op), two whole numbers"),
    gin_case("memory budget that is not a size", "Auto.memory_budget = '2 gigs'",
             ValueError, "memory_budget must be bytes or a size like '2GiB'",
             base=SINUSOID + ["Experiment.formulation = @Auto()"]),
    gin_case("no task in flight", "Accumulate.parallel_iterations = 0", ValueError,
             "Accumulate.parallel_iterations must be a whole number >= 1, got 0",
             base=SINUSOID + ["Experiment.formulation = @Accumulate()"]),
    gin_case("a learner keyword that moved", "Learner.task_batching = 'map_fn'", ValueError,
             "Learner(task_batching=...) moved in metalearn 0.3: use the formulation"),
    gin_case("an experiment setting that moved", "Experiment.num_steps = 5", ValueError,
             "Experiment(num_steps=...) moved in metalearn 0.3: use Loop.num_steps"),
    gin_case("the old outer rule's name", "Experiment.outer_rule = @MetaOptimizer()",
             TypeError, "MetaOptimizer is MetaGradient since metalearn 0.3"),
    gin_case("clipping as an outer rule's keyword", "MetaGradient.clipnorm = 1.0", ValueError,
             "MetaGradient(clipnorm=...) moved in metalearn 0.3: use a guard: "
             "ClipDirections"),
    gin_case("unknown loss name", "Learner.loss = 'msee'", ValueError,
             "unknown loss 'msee'"),
    gin_only("a metric named loss", "Learner.metrics = {'loss': 'mse'}", ValueError,
             "'loss' is reserved for the query loss", points_to="the configurable"),
    gin_case("zero sinusoid queries", "Sinusoid.queries = 0", ValueError,
             "queries must be >= 1, got 0"),
    gin_case("inverted amplitude range", "Sinusoid.amplitude = (5.0, 0.1)", ValueError,
             "must be a (low, high) pair with low <= high, got (5.0, 0.1)"),
    gin_case("zero classification queries", "FewShotClassification.queries = 0", ValueError,
             "queries must be >= 1, got 0", base=CLASSIFICATION),
    gin_case("negative image shift", "FewShotClassification.max_shift = -1", ValueError,
             "max_shift must be >= 0 pixels, got -1", base=CLASSIFICATION),
    gin_case("SVM head's C not positive", "SVMHead.c = 0.0", HyperparameterRangeError,
             "SVMHead.c must be > 0, got 0.0", base=CLASSIFICATION + [
                 "Experiment.learner = @EmbeddingLearner()",
                 "EmbeddingLearner.model = @conv_net()", "EmbeddingLearner.ways = 3",
                 "EmbeddingLearner.drop_head = 'head'", "EmbeddingLearner.head = @SVMHead()"]),
    gin_only("unknown dtype policy", "Runtime.dtype_policy = 'float17'", ValueError,
             "Runtime.dtype_policy:"),
    Case("fractional evaluation inner steps", "`evaluate.inner_steps = (1.9, 2.5)`",
         TypeError, "evaluate.inner_steps must be whole numbers of inner steps, got "
         "(1.9, 2.5)", sinusoid_evaluate(inner_steps=(1.9, 2.5)), None, "the argument"),
    Case("negative evaluation inner steps", "`evaluate.inner_steps = (-1,)`", ValueError,
         "inner_steps must be >= 0, got [-1]", sinusoid_evaluate(inner_steps=(-1,)), None,
         "the argument"),
    Case("one evaluation task", "`evaluate.num_tasks = 1`", ValueError,
         "num_tasks must be >= 2, got 1", sinusoid_evaluate(num_tasks=1), None,
         "the argument"),
    Case("mirrored devices that do not exist", "`make_strategy.devices = ['/cpu:0', "
         "'/cpu:9']`", ValueError, "make_strategy.devices: ['/cpu:9'] not among the "
         "visible devices", lambda p: _distribute().make_strategy(
             "mirrored", devices=["/cpu:0", "/cpu:9"]), None, "the devices, and the visible ones"),
    Case("mirrored GPUs on a CPU-only machine", "`make_strategy.devices = ['/gpu:0', "
         "'/gpu:1']` without GPUs", ValueError, "['/gpu:0', '/gpu:1'] not among the visible "
         "devices", lambda p: _distribute().make_strategy(
             "mirrored", devices=["/gpu:0", "/gpu:1"]), None, "the devices, and the visible ones"),
    Case("no mirrored devices", "`make_strategy.devices = []`", ValueError,
         "make_strategy.devices is empty", lambda p: _distribute().make_strategy(
             "mirrored", devices=[]), None, "the argument"),
    Case("unknown strategy", "`--strategy=tpu`", ValueError, "strategy must be one of "
         "('default', 'mirrored', 'multi_worker'), got 'tpu'",
         lambda p: _distribute().make_strategy("tpu"), None, "the choices"),
    Case("unknown all-reduce", "`make_strategy.cross_device_ops = 'ring'`", ValueError,
         "cross_device_ops must be one of", lambda p: _distribute().make_strategy(
             "mirrored", cross_device_ops="ring"), None, "the choices"),
    Case("multi_worker without TF_CONFIG", "`--strategy=multi_worker`, no `TF_CONFIG`",
         ValueError, "strategy 'multi_worker' needs the TF_CONFIG environment variable",
         with_environment("TF_CONFIG", None,
                          lambda: _distribute().make_strategy("multi_worker")),
         None, "the variable"),
    Case("TF_CONFIG that is not JSON", "`TF_CONFIG='{cluster: ...'`", ValueError,
         "TF_CONFIG is not valid JSON", with_environment(
             "TF_CONFIG", "{cluster: ", lambda: _distribute().make_strategy("multi_worker")),
         None, "the variable's text"),
    Case("meta-batch that does not divide among replicas", "`Experiment.meta_batch_size = "
         "5` on 2 replicas", ValueError, "meta_batch_size=5 does not divide among 2 "
         "replicas", lambda p: _distribute().tasks_per_replica(
             5, tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])), None, "the multiple"),
    Case("sweep axis given twice", "`--axis='Runtime.seed=[0, 1]' "
         "--axis='Runtime.seed=[2]'`", sweeps_error(), "--axis key 'Runtime.seed' is "
         "given twice", lambda p: sweeps_module().add_axes(
             {}, ["Runtime.seed=[0, 1]", "Runtime.seed=[2]"]), None, "the key"),
    Case("sweep axis without brackets", "`--axis='Runtime.seed=0,1'`", sweeps_error(),
         "must look like 'Configurable.parameter=[v1, v2]'",
         lambda p: sweeps_module().parse_axis("Runtime.seed=0,1"), None, "the axis"),
    Case("sweep axis without values", "`--axis='Runtime.seed=[]'`", sweeps_error(),
         "has no values", lambda p: sweeps_module().parse_axis("Runtime.seed=[]"), None,
         "the axis"),
    Case("sweep binding on a swept key", "`--gin_param=GradientDescent.learning_rate=0.1 "
         "--axis='GradientDescent.learning_rate=[0.01, 0.1]'`", sweeps_error(),
         "GradientDescent.learning_rate is both swept and bound",
         lambda p: sweeps_module().check_params_against_axes(sweeps_module().SweepSpec(
             gin_params=["GradientDescent.learning_rate=0.1"],
             axes={"GradientDescent.learning_rate": ["0.01", "0.1"]})),
         lambda p: "'GradientDescent.learning_rate=0.1' binds it, and the axis",
         "the key, the binding and the axis with its values"),
    Case("gin file not found", "`--gin_file=nowhere.gin`", FileNotFoundError,
         "gin file 'nowhere.gin' not found", lambda p: resolve_gin_files(["nowhere.gin"]),
         None, "the places looked in"),
    Case("gin file that moved", "`--gin_file=experiments/omniglot/base.gin`",
         MovedGinFileError, "moved to experiments/setups/omniglot_common.gin",
         lambda p: resolve_gin_files(["experiments/omniglot/base.gin"]), None,
         "the new path (CHANGELOG.md's table, as data)"),
    Case("restore of a directory that is no run", "`metalearn.restore(<empty folder>)`",
         FileNotFoundError, "is not a run directory: it has neither config.gin", lambda p: metalearn.restore(str(p)),
         lambda p: str(p), "the folder"),
    Case("no intact checkpoint", "every checkpoint of a workdir damaged (index missing)",
         DamagedCheckpointError, "ckpt-1.index is missing", no_intact_checkpoint,
         lambda p: "Nothing was deleted", "each checkpoint and why"),
    Case("damaged checkpoint given", "`restore(workdir, checkpoint=<garbage data>)`",
         DamagedCheckpointError, "is damaged: it cannot be read", damaged_given_checkpoint,
         lambda p: str(p / "run" / "checkpoints" / "ckpt-1"), "the checkpoint"),
    Case("Meta-SGD checkpoint into a MAML config", "`restore(maml_run, "
         "checkpoint=<Meta-SGD checkpoint>)`", UnmatchedCheckpointError,
         "the checkpoint holds 4 variable(s) the config does not build (adapter ",
         metasgd_into_maml, None, "the variables by piece, name and shape"),
    Case("MAML checkpoint into a Meta-SGD config", "`restore(metasgd_run, "
         "checkpoint=<MAML checkpoint>)`", UnmatchedCheckpointError,
         "the config builds 4 variable(s) the checkpoint does not hold (adapter variable "
         "mlp_hidden0_kernel_lr (1, 4)", maml_into_metasgd, None,
         "the variables by piece, name and shape"),
    Case("config.gin lost, config changed", "`train` into a workdir without `config.gin` "
         "whose checkpoint has another `GradientDescent.learning_rate`",
         validation.ConfigChangeError, "GradientDescent.learning_rate: 0.01 in the workdir, "
         "0.5 now", lost_config_changed,
         lambda p: "the config its checkpoint carries", "the checkpoint's config"),
    Case("workdir in use", "a second `train` on a workdir another process trains in",
         WorkdirLockedError, "is in use: process", workdir_in_use,
         lambda p: f"process {os.getpid()} on host", "the holder's pid and host"),
    Case("evaluation output that is a folder", "`evaluate --output=.`", ValueError,
         "is a folder: give a file name", evaluate_output("."), None, "the path"),
    Case("evaluation output under a file", "`evaluate --output=config.gin/eval.json`",
         FileExistsError, "cannot write the output", evaluate_output("config.gin/eval.json"),
         lambda p: "nothing was run", "the path, before any work"),
    Case("every step skipped", "`Loop.on_non_finite = 'skip'`, a NaN at every step",
         FloatingPointError, "3 of 8 steps skipped", all_steps_skipped,
         lambda p: "Loop.max_skipped_fraction = 0.25", "the limit's binding"),
    Case("metrics.json that is not JSON", "a truncated `metrics.json`", ValueError,
         "is not valid JSON", run_json("metrics.json", '{"loss": 0.'),
         lambda p: str(p / "run" / "metrics.json"), "the file"),
    Case("metrics.json of no numbers", '`metrics.json` holding `{"loss": "low"}`',
         ValueError, "does not hold final metrics", run_json("metrics.json",
                                                             '{"loss": "low"}'),
         lambda p: str(p / "run" / "metrics.json"), "the file"),
    Case("evaluation report without results", '`eval.json` holding `{"num_tasks": 5}`',
         ValueError, "is not an evaluation report", run_json("eval.json",
                                                             '{"num_tasks": 5}'),
         lambda p: str(p / "run" / "eval.json"), "the file"),
    Case("sweep run record without a name", '`sweep_run.json` holding `{}`', ValueError,
         "is not a sweep run record", run_json("sweep_run.json", "{}"),
         lambda p: str(p / "run" / "sweep_run.json"), "the file"),
    Case("garbled training progress", "a checkpoint whose `progress` is not JSON",
         ValueError, "the training progress in ckpt-7 is not a progress record",
         garbled_progress, None, "the checkpoint"),
    Case("support and query of different task counts", "an episode batch of 2 support and "
         "3 query tasks", ValueError, "different numbers of tasks (leading axis): "
         "support_x 2", unequal_task_counts, None, "each part's count"),
    gin_case("pre-training classes below the training classes",
             "ClassifierBaseline.classes = 4", ValueError,
             "outputs 4 classes (shape [4, 4]) but the tasks have 6 (the 6 training classes "
             "WholeClassBatches labels", base=PRETRAINING),
    Case("warm start without the weights", "`restore_weights` (`WarmStart`) of a conv net "
         "from a run whose model has no `head`", UnmatchedCheckpointError,
         "no saved weights for 2 variable(s) of model 'conv_net': conv_net/head/kernel",
         warm_start_without_head, None, "each variable, and the saved ones"),
    gin_case("bad gin syntax", "Loop.num_steps = = 5", SyntaxError,
             "bad gin syntax in gin file"),
    Case("bad gin syntax in an included file", "`include 'bad.gin'`, whose line 1 is "
         "`Sinusoid.shots = (5`", SyntaxError, "a bracket or quote opened on this line or "
         "before is not closed",
         lambda p: (p / "bad.gin").write_text("Sinusoid.shots = (5\n") and gin_text(
             "top.gin", "include '<tmp>/bad.gin'\n")(p),
         lambda p: f'"{p / "bad.gin"}", line 1', "both files and lines"),
    Case("bad gin syntax in a binding", "`--gin_param='Loop.num_steps = = 2'`",
         SyntaxError, "bad gin syntax in --gin_param 'Loop.num_steps = = 2'",
         gin_text("ok.gin", "include 'experiments/sinusoid/maml.gin'\n",
                  ["Loop.num_steps = = 2"]), None, "the binding"),
    Case("gin include cycle", "`a.gin` includes `b.gin`, which includes `a.gin`",
         validation.GinIncludeError, "a.gin' includes itself", include_cycle,
         lambda p: f'"{p / "b.gin"}", line 2', "each include's file and line"),
    Case("gin include not found", "`include 'nowhere.gin'`", OSError,
         "Unable to open file: nowhere.gin", gin_text("top.gin", "include 'nowhere.gin'\n"),
         lambda p: f'In file "{p / "top.gin"}", line 1', "gin file and line (gin's own)"),
    Case("gin include of a file that moved", "`include 'experiments/mini_imagenet/smoke.gin'`",
         MovedGinFileError, "moved to experiments/budgets/smoke.gin",
         gin_text("top.gin", "include 'experiments/mini_imagenet/smoke.gin'\n"),
         lambda p: f'In file "{p / "top.gin"}", line 1',
         "the new path, the include's file and line"),
    gin_case("gin macro never given a value", "Sinusoid.shots = %SHOTZ", ValueError,
             "gin macro %SHOTZ is used but never given a value"),
    Case("Omniglot archive of another layout", "a zip of `Greek_character01_0101_01.png` "
         "entries (checksums off)", ValueError, "has none of the expected entries "
         "'images_background_small1/<Alphabet>/characterNN/NNNN_NN.png'",
         omniglot_other_layout,
         lambda p: str(p / "omniglot" / "images_background_small1.zip"), "the zip file"),
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
    Case("multi_worker peer that never starts", "`TF_CONFIG` of 2 workers, worker 1 never "
         "started", cluster_error(), "worker 1 at localhost:",
         multi_worker(_two_workers(), peer_timeout=1.0), lambda p: "never started",
         "the task and its address, the limit's binding"),
    Case("multi_worker task not in the cluster", "`TF_CONFIG` task `worker 3` of a "
         "1-worker cluster", ValueError, "is not in its cluster, which holds worker 0..0",
         multi_worker('{"cluster": {"worker": ["localhost:1"]}, "task": {"type": '
                      '"worker", "index": 3}}'), None, "the task and the cluster"),
    Case("multi_worker without a task", "`TF_CONFIG` with a cluster and no task",
         ValueError, "TF_CONFIG has no 'task'", multi_worker(
             '{"cluster": {"worker": ["localhost:1"]}}'), None, "the variable's text"),
    Case("multi_worker port in use", "`TF_CONFIG` gives this task a port another process "
         "holds", OSError, "which cannot be opened on this machine", port_taken, None,
         "the task and port"),
    Case("finished run's metrics.json garbled", "`train` again on a finished run whose "
         "`metrics.json` is cut off", ValueError, "is not valid JSON",
         finished_run_garbled_metrics, lambda p: str(p / "run" / "metrics.json"), "the file"),
    Case("sweep run record without its settings", '`sweep_run.json` holding only '
         '`{"name", "bindings"}`, run by `--execute`', ValueError,
         "is not a sweep run record: it lacks ['num_steps'", sweep_run_without_keys,
         lambda p: str(p / "run" / "sweep_run.json"), "the file and the missing keys"),
    Case("garbled config.gin in a workdir", "`restore` of a workdir whose `config.gin` line 2 "
         "is `Sinusoid.queries = = 3`", SyntaxError, "bad gin syntax in gin file",
         garbled_workdir_config, lambda p: f'"{p / "run" / "config.gin"}", line 2',
         "the file and line"),
    Case("zero peer wait", "`make_strategy.peer_timeout = 0`", ValueError,
         "make_strategy.peer_timeout must be a number of seconds > 0, got 0",
         multi_worker(_two_workers(), peer_timeout=0), None, "the argument"),
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
    gin_only("unknown iMAML curvature", "ImplicitGradientDescent.curvature = 'fisher'",
             ValueError, "curvature must be one of ('hessian', 'gauss_newton'), got 'fisher'",
             base=IMAML),
    Case("Gauss-Newton iMAML with an opaque support loss",
         "`ImplicitGradientDescent(curvature='gauss_newton')` in a `Learner` subclass that "
         "overrides `support_loss`", ValueError,
         "needs the support loss as model outputs and a loss of them",
         lambda p: _gauss_newton_with_opaque_loss(), None, "the loss and what to do"),
    Case("a meta-learned hyperparameter in iMAML's inner solve",
         "`ImplicitGradientDescent(update=GradientStep(Learned(0.1)))`", ValueError,
         "ImplicitGradientDescent's inner solve cannot meta-learn",
         lambda p: metalearn.Learner(
             metalearn.models.mlp((1,), hidden=(), outputs=1),
             metalearn.adapters.ImplicitGradientDescent(update=metalearn.adapters.GradientStep(
                 metalearn.adapters.Learned(0.1))), loss="mse"),
         None, "the variables and what to do"),
    Case("two wrappers that run the inner steps",
         "`GradientDescent(wrappers=[WhileLoop(), WhileLoop()])`", ValueError,
         "at most one wrapper may run the inner steps, got ['WhileLoop', 'WhileLoop']",
         lambda p: metalearn.adapters.GradientDescent(2, 0.1, wrappers=[
             metalearn.adapters.WhileLoop(), metalearn.adapters.WhileLoop()]), None,
         "the wrappers"),
    Case("recomputed steps in a while loop",
         "`GradientDescent(wrappers=[Recompute(), WhileLoop()])`", ValueError,
         "WhileLoop cannot run steps that hold a tf.custom_gradient (Recompute)",
         lambda p: metalearn.adapters.GradientDescent(2, 0.1, wrappers=[
             metalearn.adapters.Recompute(), metalearn.adapters.WhileLoop()]), None,
         "the pieces and what to do"),
    # issue 31: neural processes
    Case("neural process decoder of the wrong size",
         "`Learner(mlp((8,), outputs=2), ConditionalNeuralProcess(mlp((2,), outputs=8)))`",
         ValueError, "the decoder must read x + r = 9 values",
         lambda p: metalearn.Learner(
             metalearn.models.mlp((8,), hidden=(), outputs=2, name="decoder"),
             metalearn.adapters.ConditionalNeuralProcess(
                 metalearn.models.mlp((2,), hidden=(), outputs=8, name="encoder")),
             loss=metalearn.functional.gaussian_nll), None,
         "the encoder's and decoder's sizes"),
    Case("inner steps for a neural process", "`learner.adapt(x, y, steps=1)` with a "
         "`ConditionalNeuralProcess` (or `evaluate.inner_steps = (1,)`)", ValueError,
         "takes no inner steps (it reads the support set in one forward pass), got steps=1",
         lambda p: _neural_process_steps(), None, "the value and evaluate.inner_steps = (0,)"),
    Case("non-positive predicted scale", "`gaussian_nll(y, Gaussian(mean, scale))` with a "
         "scale <= 0", tf.errors.InvalidArgumentError,
         "the predicted scale (standard deviation) must be positive",
         lambda p: metalearn.functional.gaussian_nll(tf.ones([2, 1]), metalearn.functional.
                                                     Gaussian(tf.ones([2, 1]), -tf.ones([2, 1]))),
         None, "the scale values (in the message's data)"),
    Case("Gaussian loss of a point prediction", "`Learner.loss = @gaussian_nll` for a "
         "model without a neural process (a point prediction)", TypeError,
         "gaussian_nll needs a Gaussian(mean, scale) prediction",
         lambda p: metalearn.functional.gaussian_nll(tf.ones([2, 1]), tf.ones([2, 1])),
         None, "what it got and what to use instead"),
    Case("in-context adapter without ways or targets", "`InContext()`", ValueError,
         "InContext needs ways= (classification) or targets= (regression), exactly one",
         lambda p: metalearn.adapters.InContext(), None, "both values"),
    Case("in-context adapter given more ways than it was built for", "padded episodes of "
         "up to 5 ways for `InContext(ways=3)`", ValueError,
         "InContext was built for 3 ways (its read-out's logits); these padded episodes "
         "have up to 5 ways", lambda p: _in_context_ways(), None,
         "both counts and the ways= to build it with"),
    Case("in-context adapter given an unpadded episode of more ways", "5-way episodes for "
         "`InContext(ways=3)`", tf.errors.InvalidArgumentError,
         "InContext (built for 3 ways): support labels must be in 0 .. 2",
         lambda p: _in_context_ways(padded=False), None, "the ways it was built for"),
    # issue 27: a user's module
    Case("module file that does not exist", "`--module=<tmp>/no_rule.py` "
         "(`parse_config(modules=...)`)", ModuleImportError, "does not exist",
         lambda p: parse_config(["experiments/sinusoid/maml.gin"],
                                modules=[str(p / "no_rule.py")]),
         lambda p: str(p / "no_rule.py"), "the file"),
    Case("module file that fails to import", "`--module=<tmp>/broken_rule.py`, a file "
         "that raises", ModuleImportError, "failed: NameError",
         broken_module, lambda p: str(p / "broken_rule.py"),
         "the file and its error (chained, with the file's traceback)"),
    Case("workdir naming modules not asked for", "`restore` (or `evaluate`, a resumed "
         "`train`, a sweep's run) of a workdir whose `modules.json` names "
         "`their_rule.py`, no `--module`", UntrustedModulesError,
         "A workdir is data: nothing it names is imported unless you ask for it",
         received_workdir, lambda p: str(p / "their_rule.py"),
         "each module, `--module=...` and `--trust_workdir`"),
    Case("module file that exits on import", "`--module=<tmp>/exiting_rule.py`, a file "
         "that calls `sys.exit(0)`", ModuleImportError, "it called sys.exit(0) on import",
         exiting_module, lambda p: str(p / "exiting_rule.py"),
         "the file (`train` exits non-zero)"),
    # issue 32: entry points and data
    Case("results file on a disk that fills", "`evaluate` whose `eval.json` cannot be "
         "written (`ENOSPC` when flushed), after the evaluation", OSError,
         "No space left on device; nothing is lost: the evaluation figures were logged "
         "before the write", evaluation_on_a_disk_that_fills,
         lambda p: f"cannot write '{p / 'run' / 'eval.json'}'",
         "the file, the reason and the log holding the figures"),
    Case("evaluation output on a full disk", "`evaluate --output` on a disk with 0 bytes "
         "free", OSError, "No space left on device (0 bytes free", evaluation_on_a_full_disk,
         lambda p: "nothing was run", "the path, before any work"),
    Case("report of runs none of which is finished", "`metalearn.report` of a folder "
         "whose run has `config.gin` and no `metrics.json`", IncompleteError,
         "no finished run under", report_of_no_finished_run,
         lambda p: f"unfinished: run ({p / 'run'}; at step 0)",
         "each run, its state and folder"),
    Case("evaluate --workdir that is a file", "`evaluate --workdir=<a file>`",
         NotADirectoryError, "is a file, not a run directory",
         evaluate_workdir_that_is_a_file, lambda p: f"workdir '{p / 'run'}'",
         "the workdir, before the output"),
    Case("non-UTF-8 byte in a gin file", "`# caf\\xe9` (Latin-1) in `bad.gin`",
         SyntaxError, "line 2, column 6: byte 0xe9 is not UTF-8", non_utf8_gin_file,
         lambda p: f'bad gin file "{p / "bad.gin"}"', "the file, line, column and byte"),
    Case("absurd image_size", "`load_image_folder.image_size = 100000`", ValueError,
         "image_size must be a whole number of pixels from 1 to 1024",
         lambda p: load_image_folder(str(p), image_size=100_000), None,
         "the loader and the bound, before any allocation"),
    Case("undecodable Meta-Dataset image", "a record whose image bytes start like a JPEG "
         "and are not one", tf.errors.InvalidArgumentError, "is not a decodable image",
         undecodable_meta_dataset_image,
         lambda p: f"the image of record 0 of Meta-Dataset class file "
                   f"'{p / 'aircraft' / '0.tfrecords'}'", "the file and record"),
    # issue 32: the library's cases of the third reliability round
    Case("inner Adam's beta out of range", "`InnerAdam(beta_1=-1)`",
         HyperparameterRangeError, "InnerAdam.beta_1 must be in [0, 1), got -1",
         lambda p: metalearn.adapters.InnerAdam(beta_1=-1), None,
         "the piece, hyperparameter, value and range"),
    gin_case("negative inner momentum", "InnerMomentum.momentum = -0.9",
             HyperparameterRangeError, "InnerMomentum.momentum must be in [0, 1), got -0.9",
             base=SINUSOID + ["GradientDescent.learning_rate = None",
                              "GradientDescent.update = @InnerMomentum()"]),
    Case("learned value outside its bounds", "`Learned(0.5, low=0, high=0.1)`",
         HyperparameterRangeError, "Learned.initial must be in [0, 0.1], got 0.5",
         lambda p: metalearn.adapters.Learned(0.5, low=0, high=0.1), None,
         "the value and the bounds"),
    Case("support label outside the task's classes", "label 7 in a 3-way task's support "
         "set, any head (`adapt`; in a `tf.function`: `InvalidArgumentError`)",
         LabelOutsideClassesError, "a support label is outside the 3 classes of the task",
         label_outside_the_classes, lambda p: "label 7 of support example 2",
         "the label, its example and the classes"),
    Case("resuming below the checkpoint's step", "`Loop.num_steps = 3`, the workdir's "
         "checkpoint at step 5", validation.RunLengthError,
         "Loop.num_steps = 3 is below step 5", resumed_below_its_step,
         lambda p: "Nothing was written", "the checkpoint, before any write"),
    Case("config.gin edited after training", "`mlp.activation` changed in a workdir's "
         "`config.gin`, then `restore` or `evaluate`", validation.ConfigChangeError,
         "mlp.activation: 'relu' in the checkpoint, 'tanh' in", restored_after_an_edit,
         lambda p: str(p / "run" / "config.gin"), "the binding, both values, the file"),
    Case("restore into other layer sizes", "`restore(run, gin_params=['mlp.hidden = (8,)'])` "
         "of a `(4,)` run", UnmatchedCheckpointError,
         "kernel of layer 'hidden0': (1, 4) in the checkpoint, (1, 8) in the config",
         restored_into_other_sizes, None, "the layers and shapes"),
    gin_case("policy outputs that do not fit the actions", "PolicyLearner.model = @mlp()",
             ValueError, "outputs 2 values (shape [1, 2]), but a Gaussian policy over "
             "PointNavigation's 2 continuous actions needs 4", base=POINT_NAV),
    gin_case("policy learner without rollouts", "GradientDescent.wrappers = []", ValueError,
             "holds no Rollouts wrapper", base=POINT_NAV),
    gin_case("exact rollouts of an environment that cannot list them",
             "PolicyLearner.rollouts = 'exact'", ValueError,
             "rollouts='exact' needs an environment that enumerates", base=POINT_NAV),
    gin_case("momentum of a learned optimizer outside [0, 1)",
             "LearnedRule.betas = (0.5, 1.0)", HyperparameterRangeError,
             "LearnedRule.betas must be in [0, 1), got 1", base=LEARNED_OPTIMIZER),
    Case("a learned optimizer applied to weights it was not built for",
         "`rule.update` of `mlp/hidden0/kernel` by a `LearnedRule` built behind "
         "`Mask((\"head\",))`", RuleMismatchError,
         "LearnedRule was built for the weights ['mlp/head/kernel', 'mlp/head/bias'], not "
         "'mlp/hidden0/kernel'", learned_rule_on_other_weights, None,
         "the weight and those it was built for"),
    Case("a learned optimizer's network of another shape",
         "`LearnedRule(hidden=(8,)).create('float32', values)`, the values of a "
         "`hidden=(16,)` rule", RuleMismatchError,
         "LearnedRule array 'hidden_0_kernel' has shape (8, 16), this rule (hidden=(8,), "
         "8 features) needs (8, 8)", learned_rule_of_another_shape, None,
         "the array, both shapes, the hidden sizes"),
    Case("TRPO on a learner without trajectories", "`Experiment.outer_rule = @TRPO()` with "
         "a supervised `Learner`", TypeError,
         "TRPO needs a learner whose trajectories can be collected",
         lambda p: run_gin(p, SINUSOID + ["Experiment.outer_rule = @TRPO()"]), None,
         "the learner's class and the PolicyLearner it needs, before the first step"),
    Case("unknown Gymnasium environment id", "`HalfCheetahVelocity(env_id='HalfCheetah-v99')`"
         " given to a `GymCollector`", ValueError, "Gymnasium cannot make 'HalfCheetah-v99'",
         unknown_gymnasium_id, None, "the environment class, the id and Gymnasium's reason"),
    Case("MuJoCo not installed", "a `GymCollector` of `HalfCheetahVelocity` without the "
         "`mujoco` package (or `HalfCheetahVelocity()` without `gymnasium`)", ImportError,
         "HalfCheetahVelocity (HalfCheetah-v5) needs MuJoCo: install the rl extra: pip "
         "install -e '.[rl]'", mujoco_not_installed, None, "the extra to install"),
    Case("simulator failing mid-rollout", "a policy whose actions make the simulator's "
         "reward NaN (or a simulator that raises)", metalearn.rl.SimulatorError,
         "the simulator gave non-finite observations or rewards mid-rollout "
         "(HalfCheetahVelocity task 1.5, seed [4, 2], step 0)", simulator_gives_nan, None,
         "the task, the seed and the step"),
    Case("task reward failing mid-rollout", "a `PythonEnvironment` whose `task_reward` "
         "raises (here reads a key the simulator's `info` lacks)",
         metalearn.rl.SimulatorError, "SpeedReward.task_reward failed mid-rollout "
         "(SpeedReward task 1.5, seed [4, 2], step 0): KeyError: 'x_speed'",
         task_reward_raises, None, "the call, the task, the seed, the step and the error"),
    Case("simulator step hung", "a simulator whose `step` does not return within "
         "`GymCollector.step_time_limit` (here 0.5 s; default 300)",
         metalearn.rl.SimulatorError, "the simulator's step did not return within 0.5 s "
         "(HalfCheetahVelocity task 1.5, seed [4, 2], step 2): raise "
         "GymCollector.step_time_limit if it is only slow", simulator_step_hangs, None,
         "the call, the task, the seed and the step; training saves a checkpoint of the "
         "step reached first"),
    Case("simulator time limit not positive", "`GymCollector.step_time_limit = -1.0`",
         HyperparameterRangeError, "GymCollector.step_time_limit must be > 0, got -1.0",
         simulator_time_limit_negative, None, "the value and the range (`None`: no limit)"),
    Case("a Python environment's episodes without collection", "episodes of "
         "`HalfCheetahVelocity` given to the learner as sampled (not through "
         "`collect_episodes`)", NotImplementedError,
         "HalfCheetahVelocity runs in Python: its trajectories come from a "
         "metalearn.rl.GymCollector", python_environment_in_the_step, None,
         "`GymCollector`, `collect_episodes`"),
    gin_case("TRPO without a trust region", "TRPO.max_kl = 0.0", HyperparameterRangeError,
             "TRPO.max_kl must be > 0, got 0.0",
             base=POINT_NAV + ["Experiment.outer_rule = @TRPO()"]),
    gin_case("truncation longer than the horizon", "TruncatedUnroll.truncation = 8",
             ValueError, "TruncatedUnroll: truncation (8 steps) is longer than the horizon "
             "(4 steps)", base=SINUSOID_TRUNCATED),
    gin_case("truncation not dividing the horizon", "PersistentES.truncation = 3",
             ValueError, "PersistentES: truncation (3 steps) must divide the horizon "
             "(4 steps) into whole segments", base=SINUSOID_PES),
    gin_case("zero noise scale of persistent ES", "PersistentES.sigma = 0.0",
             HyperparameterRangeError, "PersistentES.sigma (the noise scale) must be > 0, "
             "got 0.0", base=SINUSOID_PES),
    gin_case("noise reuse without persistence", "PersistentES.noise_reuse = True",
             ValueError, "PersistentES: noise_reuse=True keeps each pair's noise for the "
             "whole horizon and needs persistent=True; got persistent=False",
             base=SINUSOID_PES + ["PersistentES.persistent = False"]),
    gin_case("empty population of persistent ES", "PersistentES.population = 0",
             HyperparameterRangeError, "PersistentES.population (antithetic pairs) must be "
             "a whole number >= 1, got 0", base=SINUSOID_PES),
    Case("truncated unroll of a loop without steps", "`Experiment.outer_rule = "
         "@TruncatedUnroll()` with `Learner.adapter = @NoAdaptation()`", TypeError,
         "TruncatedUnroll carries a GradientDescent inner loop across outer steps; the "
         "learner's adapter is NoAdaptation",
         lambda p: run_gin(p, SINUSOID_TRUNCATED + ["Learner.adapter = @NoAdaptation()"]),
         None, "the rule and the adapter, before the first step"),
    Case("TRPO compiled with XLA", "`Experiment.outer_rule = @TRPO()` with "
         "`Runtime.jit_compile = True`", ValueError, "TRPO cannot be compiled with XLA",
         lambda p: run_gin(p, POINT_NAV + ["Experiment.outer_rule = @TRPO()",
                                           "Runtime.jit_compile = True"]), None,
         "the rule and the reason, before the first step"),
    Case("a setup after a learner", "`--gin_file=experiments/learners/reptile.gin "
         "--gin_file=experiments/setups/sinusoid.gin`", RoleOrderError,
         "comes after the learner file 'experiments/learners/reptile.gin': give setups "
         "before learners", lambda p: parse_config(["experiments/learners/reptile.gin",
                                                    "experiments/setups/sinusoid.gin"]),
         None, "both files and the key the setup re-binds"),
    Case("a learner re-binding an earlier learner", "`--gin_file=experiments/setups/"
         "sinusoid.gin --gin_file=experiments/learners/reptile.gin "
         "--gin_file=experiments/learners/maml.gin`", RoleOrderError,
         "learner file 'experiments/learners/maml.gin' re-binds",
         lambda p: parse_config(["experiments/setups/sinusoid.gin",
                                 "experiments/learners/reptile.gin",
                                 "experiments/learners/maml.gin"]),
         None, "both files, the key and its lines"),
    Case("a budget leaving part of another", "`... --gin_file=experiments/budgets/smoke.gin "
         "--gin_file=experiments/budgets/cpu.gin`", RoleOrderError,
         "the later does not re-bind Loop.log_every",
         lambda p: parse_config(["experiments/setups/sinusoid.gin",
                                 "experiments/learners/maml.gin",
                                 "experiments/budgets/smoke.gin",
                                 "experiments/budgets/cpu.gin"]),
         None, "both files and every key left over"),
    Case("learned-rule Keras optimizer of a negative learning rate",
         "`LearnedRuleOptimizer(rule, learning_rate=-0.5)`", HyperparameterRangeError,
         "LearnedRuleOptimizer.learning_rate must be > 0, got -0.5",
         learned_rule_optimizer_climbing, None, "the value and the range"),
    Case("a model-based task beyond its memory budget", "`AttentiveNeuralProcess("
         "memory_budget='1MiB')` predicting 2000 targets from 2000 context points (by "
         "default the budget is the machine's memory)", MemoryBudgetError,
         "AttentiveNeuralProcess: 2000 context points, 2000 targets need an estimated",
         attentive_np_beyond_its_budget, lambda p: "the limit of 1.0 MiB",
         "the sizes, the estimate and the limit, before the work"),
    Case("truncated learned-rule file", "`LearnedRule.load(path)` of the first half of a "
         "saved `.npz`", RuleFileError, "cannot be read (BadZipFile: ",
         truncated_rule_file, lambda p: f"learned-rule file {str(p / 'rule.npz')!r}",
         "the file and what it should hold"),
    Case("learned-rule file whose configuration is not JSON", "`LearnedRule.load(path)` "
         "of a `.npz` whose `__config__` is `{not json`", RuleFileError,
         "its '__config__' member is not JSON", rule_file_of_bad_json,
         lambda p: f"learned-rule file {str(p / 'rule.npz')!r}",
         "the file, the text and the keys expected"),
    Case("learned-rule file of NaN weights", "`LearnedRule.load(path)` of a `.npz` whose "
         "`output_bias` holds a NaN", RuleFileError,
         "LearnedRule array 'output_bias' holds 1 non-finite value(s)",
         rule_file_of_nan_weights, lambda p: f"learned-rule file {str(p / 'rule.npz')!r}",
         "the file and the array"),
    Case("padded batch of real targets and labels", "`pad_episodes` of a regression "
         "episode and a classification one", ValueError,
         "pad_episodes got real targets in episodes [0] and integer labels in [1]",
         mixed_padded_episodes, None, "the episodes of each kind"),
]


def table() -> str:
    """docs/errors.md's table, made from :data:`CASES`."""
    lines = ["| case | bad input | error | message (excerpt) | points to |",
             "| --- | --- | --- | --- | --- |"]
    for case in CASES:
        excerpt = case.excerpt.replace("|", "\\|")
        lines.append(f"| {case.name} | {case.bad_input} | `{case.error.__name__}` | "
                     f"`{excerpt}` | {case.points_to} |")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("case", CASES, ids=[c.name.replace(" ", "_") for c in CASES])
def test_bad_input_raises_the_documented_error(case, tmp_path):
    with pytest.raises(case.error) as info:
        case.run(tmp_path)
    message = str(info.value)
    assert case.excerpt in message
    if case.where is not None:
        assert case.where(tmp_path) in message, message


def test_docs_table_lists_every_case():
    with open(DOCS_TABLE) as f:
        text = f.read()
    assert table() in text, ("docs/errors.md's table differs from tests/validation_test.py's "
                             "cases; regenerate it with `python -m tests.validation_test`")


if __name__ == "__main__":
    print(table(), end="")
