"""What a case of docs/errors.md's "Every bad input tried" is, how it runs and what it
checks; the gin lines the cases of several subjects start from; the table a subject's
cases make.

A subject's cases are in the test folder of the subpackage that raises their errors
(``tests/tasks/bad_data_test.py``, ``tests/runs/bad_gin_test.py``, ...): each such module
holds a ``TITLE``, its ``CASES`` and the functions that build their bad data or workdir,
and runs each case once, with :func:`parametrize` and :func:`check`.
``tests/validation_test.py`` gathers every subject's cases into docs/errors.md's tables.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Callable, List, Optional, Sequence, Type

import gin
import numpy as np
import pytest

from metalearn.tasks.datasets import LabelledImages  # metalearn: the configurables
from metalearn.training import build_experiment, parse_config, train

SINUSOID = ["include 'experiments/sinusoid/maml.gin'", "Loop.num_steps = 2",
            "Loop.log_every = 1"]
POINT_NAV = ["include 'experiments/rl/point_nav_maml.gin'", "Loop.num_steps = 2",
             "Loop.log_every = 1", "PointNavigation.horizon = 5", "PolicyLearner.rollouts = 2",
             "Experiment.meta_batch_size = 2", "mlp.hidden = (8,)"]

CLASSES = [f"c{i}" for i in range(10)]
CLASSIFICATION = [
    "Experiment.learner = @Learner()",
    "Experiment.sampler = @FewShotClassification()",
    "Experiment.meta_batch_size = 2",
    "Loop.num_steps = 2",
    "Loop.log_every = 1",
    "FewShotClassification.dataset = @bad_input_images()",
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
    gin.configurable("bad_input_images")(tiny_images)


# --- a case, and how it runs -------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    bad_input: str                 # as the docs table shows it
    error: Type[BaseException]
    excerpt: str                   # in the message
    run: Callable[[object], None]  # raises, given a tmp_path
    where: Optional[Callable[[object], str]] = None  # in the message too
    points_to: str = "gin file and line"


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


def gin_case(name, bad_line, error, excerpt, base=SINUSOID) -> Case:
    """A bad binding, the last line of ``bad.gin`` after ``base``; the error points to
    that file and line."""
    lines = list(base) + [bad_line]
    return Case(name, f"`{bad_line}`", error, excerpt, lambda p: run_gin(p, lines),
                gin_line(lines))


def gin_only(name, bad_line, error, excerpt, base=SINUSOID, points_to="the binding"):
    """A bad binding whose error names the parameter (not gin's file and line)."""
    lines = list(base) + [bad_line]
    return Case(name, f"`{bad_line}`", error, excerpt, lambda p: run_gin(p, lines), None,
                points_to)


def parametrize(cases: Sequence[Case]):
    """The decorator that runs a subject's test once per case, named by the case."""
    return pytest.mark.parametrize("case", cases,
                                   ids=[c.name.replace(" ", "_") for c in cases])


def check(case: Case, tmp_path) -> None:
    """The case raises its error, whose message holds the excerpt and where it points."""
    with pytest.raises(case.error) as info:
        case.run(tmp_path)
    message = str(info.value)
    assert case.excerpt in message
    if case.where is not None:
        assert case.where(tmp_path) in message, message


def table(cases: Sequence[Case]) -> str:
    """A docs/errors.md table, made from ``cases``."""
    lines = ["| case | bad input | error | message (excerpt) | points to |",
             "| --- | --- | --- | --- | --- |"]
    for case in cases:
        excerpt = case.excerpt.replace("|", "\\|")
        lines.append(f"| {case.name} | {case.bad_input} | `{case.error.__name__}` | "
                     f"`{excerpt}` | {case.points_to} |")
    return "\n".join(lines) + "\n"
