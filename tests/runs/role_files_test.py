"""The role files of experiments/ (setups/, learners/, budgets/) are checked wherever they
come from (the command line, includes, a sweep, evaluate's extra files), at parse time:
a second learner re-binding the first, a setup after a learner or two budgets that
leave a hybrid are refused naming both files and the key; the repository's own
combinations parse."""

import os

import gin
import pytest

import metalearn  # noqa: F401  (registers the configurables)
from metalearn.runs.validation import RoleOrderError
from metalearn.studies import sweeps
from metalearn.training import parse_config
from metalearn.repository import ROOT
from tests.run_fixtures import saved_run


SETUP = "experiments/setups/sinusoid.gin"
REPTILE = "experiments/learners/reptile.gin"
MAML = "experiments/learners/maml.gin"
TINY = ["Loop.num_steps = 2", "Loop.log_every = 1", "Loop.checkpoint_every = 2",
        "Experiment.meta_batch_size = 2", "mlp.hidden = (4,)", "evaluate.num_tasks = 4",
        "evaluate.batch_size = 2", "evaluate.inner_steps = (1,)"]


# --- the order of role files ------------------------------------------------------


def test_a_second_learner_re_binding_the_first_is_refused_naming_both_and_the_key():
    """setup, reptile, maml built first-order Reptile silently."""
    with pytest.raises(RoleOrderError) as info:
        parse_config([SETUP, REPTILE, MAML])
    message = str(info.value)
    assert "learners/maml.gin" in message and "learners/reptile.gin" in message, message
    assert "re-binds Experiment.learner" in message, message


def test_a_setup_after_a_learner_is_refused_naming_both_and_the_key():
    """reptile before the setup built first-order MAML silently."""
    with pytest.raises(RoleOrderError, match="give setups before learners") as info:
        parse_config([REPTILE, SETUP])
    message = str(info.value)
    assert "setups/sinusoid.gin" in message and "learners/reptile.gin" in message, message
    assert "Experiment.outer_rule" in message, message


def test_a_budget_that_leaves_part_of_another_is_refused():
    with pytest.raises(RoleOrderError, match="two budget files") as info:
        parse_config([SETUP, MAML, "experiments/budgets/smoke.gin",
                      "experiments/budgets/cpu.gin"])
    assert "smoke.gin" in str(info.value) and "Loop.log_every" in str(info.value)


BUDGETS = sorted(os.path.relpath(p, ROOT) for p in __import__("glob").glob(
    os.path.join(ROOT, "experiments", "budgets", "*.gin")))


def _budget_keys(budget):
    from metalearn.runs.gin_text import keyed_statements
    return {s.key for s in keyed_statements([budget])}


@pytest.mark.parametrize("earlier, later", [(a, b) for a in BUDGETS for b in BUDGETS
                                            if a != b])
@pytest.mark.parametrize("base", [[SETUP, MAML], ["experiments/sinusoid/maml.gin"]])
def test_two_budgets_give_no_hybrid(base, earlier, later):
    """Every pair of the repository's budget files, after a setup and a learner or a
    runnable file: refused naming both files and every key the later leaves over, or
    the later re-binds all of the earlier and the config is the later's alone."""
    left = sorted(_budget_keys(earlier) - _budget_keys(later))
    if left:
        with pytest.raises(RoleOrderError, match="two budget files") as info:
            parse_config(base + [earlier, later])
        message = str(info.value)
        assert repr(earlier) in message and repr(later) in message, message
        for key in left:
            assert key in message, (key, message)
    else:
        parse_config(base + [earlier, later])
        both = gin.config_str()
        parse_config(base + [later])
        assert both == gin.config_str()
    gin.clear_config()


def test_the_repository_s_combinations_still_parse():
    """The README's: a setup, a learner, a budget; smoke after a runnable file; a
    learner adding to another (maml + es); --gin_param and the user's files override."""
    parse_config([SETUP, MAML, "experiments/budgets/smoke.gin"])
    parse_config(["experiments/sinusoid/maml_es.gin", "experiments/budgets/smoke.gin"])
    parse_config([SETUP, REPTILE], ["Experiment.outer_rule = @MetaGradient()", "NUM_STEPS = 2"])


def test_role_files_are_checked_in_includes_and_in_a_sweep(tmp_path):
    mine = tmp_path / "mine.gin"
    mine.write_text(f"include '{REPTILE}'\ninclude '{SETUP}'\n")
    with pytest.raises(RoleOrderError, match="give setups before learners"):
        parse_config([str(mine)])
    with pytest.raises(RoleOrderError, match="give setups before learners"):
        parse_config([], [f"include '{REPTILE}'", f"include '{SETUP}'"])
    spec = sweeps.SweepSpec([REPTILE, SETUP], list(TINY), {"Runtime.seed": ["0"]})
    with pytest.raises(sweeps.SweepError, match="give setups before learners"):
        sweeps.validate(spec, spec.runs(str(tmp_path / "sweep")))


def test_evaluate_s_extra_files_are_checked_against_each_other(tmp_path):
    from metalearn.evaluate import run
    saved_run(str(tmp_path / "run"))
    with pytest.raises(RoleOrderError, match="give setups before learners"):
        run(str(tmp_path / "run"), gin_files=[REPTILE, SETUP])
