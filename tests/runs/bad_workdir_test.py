"""Bad workdirs: a run of another config, a lost or edited config.gin, a workdir in use,
a run shorter than its checkpoint, a garbled run file, and the modules a run imports
(missing, failing, exiting, or named by the workdir and not asked for). Cases of
docs/errors.md (tests/bad_input.py)."""

import os

import metalearn
from metalearn.runs import validation
from metalearn.runs.lock import WorkdirLock, WorkdirLockedError
from metalearn.runs.modules import ModuleImportError, UntrustedModulesError
from metalearn.training import build_experiment, parse_config, restore, train
from tests.bad_input import Case, check, parametrize
from tests.run_fixtures import saved_run

TITLE = "Workdirs and modules"


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


def lost_config_changed(tmp_path) -> None:
    saved_run(tmp_path / "run")
    os.remove(tmp_path / "run" / "config.gin")
    parse_config(["experiments/sinusoid/maml.gin"], ["mlp.hidden = (4,)",
                                                     "GradientDescent.learning_rate = 0.5"])
    train(build_experiment(), str(tmp_path / "run"))


def workdir_in_use(tmp_path) -> None:
    with WorkdirLock(str(tmp_path / "run")):
        parse_config(["experiments/sinusoid/maml.gin"], ["Loop.num_steps = 1"])
        train(build_experiment(), str(tmp_path / "run"))


def finished_run_garbled_metrics(tmp_path) -> None:
    parse_config(["experiments/sinusoid/maml.gin"], ["mlp.hidden = (4,)",
                                                     "Loop.num_steps = 1"])
    train(build_experiment(), str(tmp_path / "run"))
    (tmp_path / "run" / "metrics.json").write_text('{"loss": 0.')
    parse_config(["experiments/sinusoid/maml.gin"], ["mlp.hidden = (4,)",
                                                     "Loop.num_steps = 1"])
    train(build_experiment(), str(tmp_path / "run"))


def garbled_workdir_config(tmp_path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.gin").write_text(
        "Sinusoid.shots = 5\nSinusoid.queries = = 3\n")
    metalearn.restore(str(tmp_path / "run"))


def broken_module(tmp_path):
    (tmp_path / "broken_rule.py").write_text("import gin\n\nrate = learning_rat\n")
    parse_config(["experiments/sinusoid/maml.gin"],
                 modules=[str(tmp_path / "broken_rule.py")])


def exiting_module(tmp_path):
    (tmp_path / "exiting_rule.py").write_text("import sys\n\nsys.exit(0)\n")
    parse_config(["experiments/sinusoid/maml.gin"],
                 modules=[str(tmp_path / "exiting_rule.py")])


def received_workdir(tmp_path):
    saved_run(str(tmp_path / "run"))
    (tmp_path / "run" / "modules.json").write_text(f'["{tmp_path / "their_rule.py"}"]')
    restore(str(tmp_path / "run"))


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


CASES = [
    Case("workdir of another config", "`train` into a workdir whose `config.gin` has "
         "another `GradientDescent.learning_rate`", validation.ConfigChangeError,
         "GradientDescent.learning_rate: 0.01 in the workdir, 0.1 now",
         workdir_of_another_config, lambda p: "--allow_config_change",
         "the differing bindings and the override flag"),
    Case("restore of a directory that is no run", "`metalearn.restore(<empty folder>)`",
         FileNotFoundError, "is not a run directory: it has neither config.gin",
         lambda p: metalearn.restore(str(p)),
         lambda p: str(p), "the folder"),
    Case("config.gin lost, config changed", "`train` into a workdir without `config.gin` "
         "whose checkpoint has another `GradientDescent.learning_rate`",
         validation.ConfigChangeError, "GradientDescent.learning_rate: 0.01 in the workdir, "
         "0.5 now", lost_config_changed,
         lambda p: "the config its checkpoint carries", "the checkpoint's config"),
    Case("workdir in use", "a second `train` on a workdir another process trains in",
         WorkdirLockedError, "is in use: process", workdir_in_use,
         lambda p: f"process {os.getpid()} on host", "the holder's pid and host"),
    Case("finished run's metrics.json garbled", "`train` again on a finished run whose "
         "`metrics.json` is cut off", ValueError, "is not valid JSON",
         finished_run_garbled_metrics, lambda p: str(p / "run" / "metrics.json"), "the file"),
    Case("garbled config.gin in a workdir", "`restore` of a workdir whose `config.gin` line 2 "
         "is `Sinusoid.queries = = 3`", SyntaxError, "bad gin syntax in gin file",
         garbled_workdir_config, lambda p: f'"{p / "run" / "config.gin"}", line 2',
         "the file and line"),
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
    Case("resuming below the checkpoint's step", "`Loop.num_steps = 3`, the workdir's "
         "checkpoint at step 5", validation.RunLengthError,
         "Loop.num_steps = 3 is below step 5", resumed_below_its_step,
         lambda p: "Nothing was written", "the checkpoint, before any write"),
    Case("config.gin edited after training", "`mlp.activation` changed in a workdir's "
         "`config.gin`, then `restore` or `evaluate`", validation.ConfigChangeError,
         "mlp.activation: 'relu' in the checkpoint, 'tanh' in", restored_after_an_edit,
         lambda p: str(p / "run" / "config.gin"), "the binding, both values, the file"),
]


@parametrize(CASES)
def test_bad_input_raises_the_documented_error(case, tmp_path):
    check(case, tmp_path)
