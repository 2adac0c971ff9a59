"""``metalearn.runs.validation`` beyond its errors (those are cases of docs/errors.md, in
tests/runs/bad_workdir_test.py and tests/runs/bad_gin_test.py): a resumed run may change
its length, logging and evaluation, a macro compares by its value,
``--allow_config_change`` resumes anyway, and each binding's source follows includes."""

from typing import List

import pytest

from metalearn.runs import validation
from metalearn.training import build_experiment, parse_config


def _config(params: List[str]) -> str:
    parse_config(["experiments/sinusoid/maml.gin"], params)
    return build_experiment().config


def test_run_length_and_logging_may_change_on_resume(tmp_path):
    (tmp_path / "config.gin").write_text(_config([]))
    changed = _config(["Loop.num_steps = 90000", "Loop.log_every = 10",
                       "Loop.checkpoint_every = 7", "Loop.keep_checkpoints = 9",
                       "Loop.on_non_finite = 'skip'", "Runtime.deterministic = True",
                       "evaluate.num_tasks = 100"])
    validation.check_workdir_config(str(tmp_path), changed)  # no error


def test_a_macro_compares_by_its_value_on_resume(tmp_path):
    """A run saved with literal values (before experiments/ used NUM_STEPS, INNER_LR)
    resumes under the same values given through macros; a changed macro is named by
    the binding it changes."""
    (tmp_path / "config.gin").write_text(
        "GradientDescent.learning_rate = 0.01\nLoop.num_steps = 70000\n"
        "keras.optimizers.schedules.CosineDecay.decay_steps = 70000\n")
    same = ("INNER_LR = 0.01\nNUM_STEPS = 90000\nGradientDescent.learning_rate = %INNER_LR\n"
            "Loop.num_steps = %NUM_STEPS\n"
            "keras.optimizers.schedules.CosineDecay.decay_steps = 70000\n")
    validation.check_workdir_config(str(tmp_path), same)  # Loop.num_steps may change
    changed = same.replace("decay_steps = 70000", "decay_steps = %NUM_STEPS")
    with pytest.raises(validation.ConfigChangeError,
                       match=r"CosineDecay.decay_steps: 70000 in the workdir, 90000 now"):
        validation.check_workdir_config(str(tmp_path), changed)
    assert validation.substitute_macros({"A": "(%B, %B)", "B": "2", "x.y": "%A"}) == \
        {"x.y": "(2, 2)"}


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
    anil = found[("GradientStep", "learning_rate")]  # anil.gin -> learners/anil.gin
    assert anil.filename.endswith("experiments/learners/anil.gin")
    assert "GradientStep.learning_rate" in anil.text
    setup = found[("Sinusoid", "queries")]  # -> setups/sinusoid.gin
    assert setup.filename.endswith("experiments/setups/sinusoid.gin")
    assert found[("mlp", "outputs")].filename is None
