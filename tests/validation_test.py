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
import re
import subprocess
import sys
import zipfile
from typing import Callable, List, Optional, Tuple, Type

import gin
import numpy as np
import pytest
import tensorflow as tf

import metalearn  # noqa: F401  (registers the configurables)
from metalearn.tasks import FewShotClassification
from metalearn.tasks.datasets import (LabelledImages, load_cub, load_image_folder,
                                      load_mini_imagenet, load_mnist, load_omniglot,
                                      load_tiered_imagenet)
from metalearn.runs import validation
from metalearn.training import build_experiment, parse_config, train
from metalearn.training.evaluation import evaluate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS_TABLE = os.path.join(ROOT, "docs", "errors.md")

SINUSOID = ["include 'experiments/sinusoid/maml.gin'", "Experiment.num_steps = 2",
            "Experiment.log_every = 1"]

CLASSES = [f"c{i}" for i in range(10)]
CLASSIFICATION = [
    "Experiment.learner = @Learner()",
    "Experiment.sampler = @FewShotClassification()",
    "Experiment.meta_batch_size = 2",
    "Experiment.num_steps = 2",
    "Experiment.log_every = 1",
    "FewShotClassification.dataset = @validation_test_images()",
    "FewShotClassification.ways = 3",
    "FewShotClassification.shots = 1",
    "FewShotClassification.queries = 1",
    f"FewShotClassification.train = {CLASSES[:6]}",
    f"FewShotClassification.test = {CLASSES[6:]}",
    "Learner.model = @conv_net()",
    "Learner.loss = @keras.losses.SparseCategoricalCrossentropy()",
    "Learner.task_batching = 'unrolled'",
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
    load_omniglot(str(folder), archives=("images_background_small1",))


def undecodable_png(tmp_path) -> None:
    _omniglot_zip(tmp_path / "omniglot", [("Greek/character01/0101_01.png",
                                           b"\x89PNG\r\n\x1a\n garbage")])
    load_omniglot(str(tmp_path / "omniglot"), archives=("images_background_small1",))


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
    load_omniglot(str(path.parent), archives=("images_background_small1",))


def swapped_mnist_files(tmp_path) -> None:
    folder = tmp_path / "mnist"
    folder.mkdir()
    labels = gzip.compress(b"\x00\x00\x08\x01" + (3).to_bytes(4, "big") + bytes(3))
    (folder / "t10k-images-idx3-ubyte.gz").write_bytes(labels)  # a labels file
    (folder / "t10k-labels-idx1-ubyte.gz").write_bytes(labels)
    load_mnist(str(folder))


def truncated_mnist(tmp_path) -> None:
    folder = tmp_path / "mnist"
    folder.mkdir()
    whole = gzip.compress(b"\x00\x00\x08\x03" + b"\x00" * 400)
    (folder / "t10k-images-idx3-ubyte.gz").write_bytes(whole[:len(whole) // 2])
    (folder / "t10k-labels-idx1-ubyte.gz").write_bytes(gzip.compress(b"\x00\x00\x08\x01"))
    load_mnist(str(folder))


def workdir_of_another_config(tmp_path) -> None:
    workdir = tmp_path / "workdir"
    workdir.mkdir()
    parse_config(["experiments/sinusoid/maml.gin"], ["GradientDescent.learning_rate = 0.01"])
    saved = build_experiment().config
    (workdir / "config.gin").write_text(saved)
    parse_config(["experiments/sinusoid/maml.gin"], ["GradientDescent.learning_rate = 0.1",
                                                     "Experiment.num_steps = 2"])
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


def malformed_cub_index(tmp_path) -> None:
    (tmp_path / "CUB_200_2011").mkdir()
    (tmp_path / "CUB_200_2011" / "images.txt").write_text("001.Bird/a.jpg\n")
    load_cub(str(tmp_path / "CUB_200_2011"))


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
    gin_case("mistyped value", "Experiment.num_steps = '1000'", TypeError,
             "Experiment.num_steps must be an integer, got '1000' (str)"),
    gin_case("mistyped value, no type check of its own", "GradientDescent.steps = 'two'",
             ValueError, "invalid literal for int() with base 10: 'two'"),
    gin_case("fractional steps", "Experiment.num_steps = 2.5", TypeError,
             "Experiment.num_steps must be an integer, got 2.5 (float)"),
    gin_case("zero meta-steps", "Experiment.num_steps = 0", ValueError,
             "Experiment.num_steps must be >= 1, got 0"),
    gin_case("zero meta-batch", "Experiment.meta_batch_size = 0", ValueError,
             "Experiment.meta_batch_size must be >= 1, got 0"),
    gin_case("zero log interval", "Experiment.log_every = 0", ValueError,
             "Experiment.log_every must be >= 1, got 0"),
    gin_case("negative checkpoint interval", "Experiment.checkpoint_every = -5", ValueError,
             "Experiment.checkpoint_every must be >= 1, got -5"),
    gin_case("zero checkpoints kept", "Experiment.keep_checkpoints = 0", ValueError,
             "Experiment.keep_checkpoints must be >= 1, got 0"),
    gin_case("negative inner steps", "GradientDescent.steps = -1", ValueError,
             "steps must be >= 0, got -1"),
    gin_case("zero inner learning rate", "GradientDescent.learning_rate = 0.0", ValueError,
             "learning_rate must be > 0, got 0.0"),
    gin_case("negative outer learning rate", "keras.optimizers.Adam.learning_rate = -0.001",
             ValueError, "the optimizer's learning_rate must be > 0, got -0.001 (Adam)"),
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
    Case("damaged zip", "`images_background_small1.zip` that is not a zip", ValueError,
         "is not a readable zip file", damaged_zip,
         lambda p: str(p / "omniglot" / "images_background_small1.zip"), "the zip file"),
    Case("undecodable PNG", "a zip entry `.png` holding no PNG", ValueError,
         "is not a decodable PNG image", undecodable_png,
         lambda p: "images_background_small1/Greek/character01/0101_01.png", "entry and zip"),
    Case("corrupted zip entry", "a zip whose PNG entry fails its CRC check", ValueError,
         "is damaged: entry 'images_background_small1/Greek/character01/0101_01.png' cannot "
         "be read", corrupted_zip_entry,
         lambda p: str(p / "omniglot" / "images_background_small1.zip"), "entry and zip"),
    Case("missing MNIST files", "`load_mnist(path=<empty folder>)`", FileNotFoundError,
         "MNIST 'test' split: none of",
         lambda p: (p / "mnist").mkdir() or load_mnist(str(p / "mnist")),
         lambda p: str(p / "mnist" / "t10k-images-idx3-ubyte.gz"), "the files looked for"),
    Case("truncated MNIST file", "a cut-off `t10k-images-idx3-ubyte.gz`", ValueError,
         "cannot be read as gzip-compressed IDX data", truncated_mnist,
         lambda p: str(p / "mnist" / "t10k-images-idx3-ubyte.gz"), "the file"),
    Case("MNIST file of the wrong kind", "a labels file named `t10k-images-idx3-ubyte.gz`",
         ValueError, "is not an IDX file of the expected kind: magic number 2049, expected "
         "2051", swapped_mnist_files,
         lambda p: str(p / "mnist" / "t10k-images-idx3-ubyte.gz"), "the file"),
    Case("empty class folder", "`load_image_folder` on a folder whose `cat/` has no images",
         ValueError, "holds no image files", empty_class_folder,
         lambda p: str(p / "images" / "cat"), "the class folder"),
    Case("undecodable image in an image folder", "`cat/001.jpg` holding no JPEG", ValueError,
         "is not a decodable image", undecodable_folder_image,
         lambda p: str(p / "images" / "cat" / "001.jpg"), "the file"),
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
    Case("malformed CUB index line", "an `images.txt` line without its id", ValueError,
         "line 1: expected '<id> <value>'", malformed_cub_index,
         lambda p: str(p / "CUB_200_2011" / "images.txt"), "the file and line"),
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


# --- the workdir: resuming stays possible ------------------------------------------


def _config(params: List[str]) -> str:
    parse_config(["experiments/sinusoid/maml.gin"], params)
    return build_experiment().config


def test_run_length_and_logging_may_change_on_resume(tmp_path):
    (tmp_path / "config.gin").write_text(_config([]))
    changed = _config(["Experiment.num_steps = 90000", "Experiment.log_every = 10",
                       "Experiment.checkpoint_every = 7", "Experiment.keep_checkpoints = 9",
                       "Experiment.on_non_finite = 'skip'", "Experiment.deterministic = True",
                       "evaluate.num_tasks = 100"])
    validation.check_workdir_config(str(tmp_path), changed)  # no error


def test_allow_config_change_resumes_anyway(tmp_path):
    (tmp_path / "config.gin").write_text(_config([]))
    changed = _config(["GradientDescent.learning_rate = 0.5", "Sinusoid.queries = 3"])
    with pytest.raises(validation.ConfigChangeError) as info:
        validation.check_workdir_config(str(tmp_path), changed)
    assert "GradientDescent.learning_rate: 0.01 in the workdir, 0.5 now" in str(info.value)
    assert "Sinusoid.queries: 10 in the workdir, 3 now" in str(info.value)
    validation.check_workdir_config(str(tmp_path), changed, allow_config_change=True)


def test_binding_sources_follow_includes(tmp_path):
    path = tmp_path / "top.gin"
    path.write_text("include 'experiments/sinusoid/anil.gin'\nSinusoid.shots = 5\n")
    found = {(b.selector, b.param): b.source
             for b in validation.binding_sources([str(path)], ["mlp.outputs = 3"])}
    assert found[("Sinusoid", "shots")].line == 2
    maml = found[("GradientDescent", "first_order")]
    assert maml.filename.endswith("experiments/sinusoid/maml.gin")
    assert "GradientDescent.first_order" in maml.text
    assert found[("mlp", "outputs")].filename is None


def test_a_sweep_checks_every_run_s_outputs_before_any_run_starts(tmp_path):
    from metalearn.runs import sweeps
    spec = sweeps.SweepSpec(gin_files=["sinusoid/maml.gin"],
                            gin_params=["Experiment.num_steps = 2"],
                            axes={"mlp.outputs": ["1", "3"]})
    root = tmp_path / "root"
    with pytest.raises(sweeps.SweepError) as info:
        sweeps.run_sweep(spec, str(root))
    assert "binding 'mlp.outputs = 3'" in str(info.value)
    assert "predicts shape [10, 3]" in str(info.value)
    assert not root.exists()


# --- the entry point shows gin's file and line --------------------------------------


def _train_cli(tmp_path, *args) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run([sys.executable, "-m", "metalearn.train", *args],
                          cwd=str(tmp_path), env=env, capture_output=True, text=True,
                          timeout=300)


def test_train_entry_point_names_the_gin_file_and_line(tmp_path):
    bad = tmp_path / "typo.gin"
    bad.write_text("include 'experiments/sinusoid/maml.gin'\n\nExperiment.num_stepz = 10\n")
    result = _train_cli(tmp_path, f"--gin_file={bad}", f"--workdir={tmp_path / 'run'}")
    assert result.returncode != 0
    assert "doesn't have a parameter named 'num_stepz'" in result.stderr
    assert f'In file "{bad}", line 3' in result.stderr
    assert not (tmp_path / "run").exists()

    workdir = tmp_path / "old"
    workdir.mkdir()
    (workdir / "config.gin").write_text(_config(["Sinusoid.shots = 5"]))
    result = _train_cli(tmp_path, "--gin_file=sinusoid/maml.gin", f"--workdir={workdir}")
    assert result.returncode != 0
    assert "ConfigChangeError" in result.stderr
    assert "Sinusoid.shots: 5 in the workdir, 10 now" in result.stderr
    assert "--allow_config_change" in result.stderr


if __name__ == "__main__":
    print(table(), end="")
