"""Bad evaluation: tasks the model does not fit, arguments out of range, an output that
cannot be written (a folder, under a file, a disk that fills or is full), a workdir
that is a file. Cases of docs/errors.md (tests/bad_input.py).

``metalearn.evaluate`` is imported when a case runs, as the entry points' other tests do:
it defines the absl flags that ``metalearn.train`` and ``metalearn.sweep`` define too."""

import gin

from metalearn.tasks import FewShotClassification
from metalearn.training import build_experiment, parse_config
from metalearn.training.evaluation import evaluate
from tests.bad_input import (CLASSES, CLASSIFICATION, Case, check, parametrize,
                             tiny_images)
from tests.run_fixtures import EVALUATE_SMALL, full_disk, no_free_space, saved_run

TITLE = "Evaluation"


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


def sinusoid_evaluate(**kwargs):
    def run(tmp_path) -> None:
        parse_config(["experiments/sinusoid/maml.gin"], ["mlp.hidden = (4,)"])
        experiment = build_experiment()
        evaluate(experiment.learner, experiment.sampler, **dict(
            dict(num_tasks=4, batch_size=2), **kwargs))
    return run


def evaluate_output(output):
    def run(tmp_path) -> None:
        from metalearn import evaluate as entry_point
        (tmp_path / "config.gin").write_text("")
        entry_point.run(str(tmp_path), output)
    return run


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


def evaluate_workdir_that_is_a_file(tmp_path) -> None:
    from metalearn import evaluate as entry_point
    (tmp_path / "run").write_text("")
    entry_point.run(str(tmp_path / "run"))


CASES = [
    Case("evaluation tasks of more ways than the model's outputs",
         "`evaluate(learner, sampler)`, a 3-way model on 4-way tasks", ValueError,
         "outputs 3 classes (shape [4, 3]) but the tasks have 4 "
         "(FewShotClassification.ways=4)",
         evaluate_more_ways, None, "the sampler's binding"),
    Case("zero evaluation batch", "`evaluate(..., batch_size=0)`", ValueError,
         "batch_size must be >= 1, got 0", evaluate_zero_batch, None, "the argument"),
    Case("fractional evaluation inner steps", "`evaluate.inner_steps = (1.9, 2.5)`",
         TypeError, "evaluate.inner_steps must be whole numbers of inner steps, got "
         "(1.9, 2.5)", sinusoid_evaluate(inner_steps=(1.9, 2.5)), None, "the argument"),
    Case("negative evaluation inner steps", "`evaluate.inner_steps = (-1,)`", ValueError,
         "inner_steps must be >= 0, got [-1]", sinusoid_evaluate(inner_steps=(-1,)), None,
         "the argument"),
    Case("one evaluation task", "`evaluate.num_tasks = 1`", ValueError,
         "num_tasks must be >= 2, got 1", sinusoid_evaluate(num_tasks=1), None,
         "the argument"),
    Case("evaluation output that is a folder", "`evaluate --output=.`", ValueError,
         "is a folder: give a file name", evaluate_output("."), None, "the path"),
    Case("evaluation output under a file", "`evaluate --output=config.gin/eval.json`",
         FileExistsError, "cannot write the output", evaluate_output("config.gin/eval.json"),
         lambda p: "nothing was run", "the path, before any work"),
    Case("results file on a disk that fills", "`evaluate` whose `eval.json` cannot be "
         "written (`ENOSPC` when flushed), after the evaluation", OSError,
         "No space left on device; nothing is lost: the evaluation figures were logged "
         "before the write", evaluation_on_a_disk_that_fills,
         lambda p: f"cannot write '{p / 'run' / 'eval.json'}'",
         "the file, the reason and the log holding the figures"),
    Case("evaluation output on a full disk", "`evaluate --output` on a disk with 0 bytes "
         "free", OSError, "No space left on device (0 bytes free", evaluation_on_a_full_disk,
         lambda p: "nothing was run", "the path, before any work"),
    Case("evaluate --workdir that is a file", "`evaluate --workdir=<a file>`",
         NotADirectoryError, "is a file, not a run directory",
         evaluate_workdir_that_is_a_file, lambda p: f"workdir '{p / 'run'}'",
         "the workdir, before the output"),
]


@parametrize(CASES)
def test_bad_input_raises_the_documented_error(case, tmp_path):
    check(case, tmp_path)
