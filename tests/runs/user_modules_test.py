"""A user's module (``--module``, ``parse_config(modules=...)``): imported before gin
parses, recorded in the workdir, imported again by ``restore``, evaluation and a sweep's
run processes when asked for (given again, or the workdir trusted: a workdir is data,
tests/runs/modules_test.py); its records resolve whatever the working directory."""

import json
import os
import sys

import gin
import pytest

import metalearn  # noqa: F401  (registers the configurables)
from metalearn import repository as paths
from metalearn.runs import modules
from metalearn.runs.workdir import Workdir
from metalearn.studies import sweeps
from metalearn.training import build_experiment, parse_config, restore
from metalearn.repository import ROOT
from tests.run_fixtures import imported_packages
from tests import forked

TINY = ["Loop.num_steps = 4", "Loop.log_every = 2",
        "Loop.checkpoint_every = 2", "Experiment.meta_batch_size = 2",
        "mlp.hidden = (4,)", "evaluate.num_tasks = 4", "evaluate.batch_size = 2",
        "evaluate.inner_steps = (1,)"]


def write_rule(folder, name: str) -> str:
    """A user's file: a configurable ``<name>_rate`` (an inner learning rate) and a
    helper imported from a sibling file, as a research script would."""
    (folder / f"{name}_helper.py").write_text("RATE = 0.05\n")
    path = folder / f"{name}.py"
    path.write_text(f"import gin\nfrom {name}_helper import RATE\n\n\n"
                    f"@gin.configurable\ndef {name}_rate(scale=1.0):\n"
                    f"    return RATE * scale\n")
    return str(path)


def test_parse_config_imports_the_module_before_gin_parses(tmp_path):
    path = write_rule(tmp_path, "rule_parse")
    parse_config(["experiments/sinusoid/maml.gin"],
                 TINY + ["GradientDescent.learning_rate = @rule_parse_rate()",
                         "rule_parse_rate.scale = 2.0"], modules=[path])
    assert build_experiment().learner.adapter.learning_rate == pytest.approx(0.1)
    assert modules.current() == [path]


def test_a_missing_or_broken_module_is_named(tmp_path):
    missing = str(tmp_path / "no_such_rule.py")
    with pytest.raises(modules.ModuleImportError, match="does not exist") as info:
        parse_config(["experiments/sinusoid/maml.gin"], modules=[missing])
    assert missing in str(info.value)
    broken = tmp_path / "broken_rule.py"
    broken.write_text("import gin\nraise RuntimeError('a typo in the rule')\n")
    with pytest.raises(modules.ModuleImportError) as info:
        parse_config(["experiments/sinusoid/maml.gin"], modules=[str(broken)])
    assert str(broken) in str(info.value) and "a typo in the rule" in str(info.value)
    assert isinstance(info.value.__cause__, RuntimeError)
    with pytest.raises(modules.ModuleImportError, match="no_such_package_xyz"):
        parse_config(["experiments/sinusoid/maml.gin"], modules=["no_such_package_xyz"])


def _env():
    return dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3")


def test_train_entry_point_records_the_module_and_restore_imports_it(tmp_path,
                                                                     monkeypatch):
    """``python -m metalearn.train --module=rule.py`` from the module's folder (a
    relative path); then, in this process, which has never imported it, ``restore``
    from another working directory."""
    write_rule(tmp_path, "rule_train")
    workdir = tmp_path / "run"
    command = [sys.executable, "-m", "metalearn.train", "--module=rule_train.py",
               "--gin_file=sinusoid/maml.gin", f"--workdir={workdir}",
               "--gin_param=GradientDescent.learning_rate = @rule_train_rate()",
               *[f"--gin_param={p}" for p in TINY]]
    out = forked.run(command, cwd=tmp_path, env=_env(), capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    with open(workdir / Workdir.MODULES) as f:
        assert json.load(f) == [str(tmp_path / "rule_train.py")]
    # the same command without --module, from elsewhere: a workdir is data, so the
    # recorded module is refused, named; with --trust_workdir it resumes, the module
    # imported before gin parses the config that binds it
    longer = [c for c in command if not c.startswith("--module")] + [
        "--gin_param=Loop.num_steps = 6", "--gin_file=experiments/sinusoid/maml.gin"]
    longer.remove("--gin_file=sinusoid/maml.gin")
    out = forked.run(longer, cwd=ROOT, env=_env(), capture_output=True, text=True)
    assert out.returncode != 0 and "UntrustedModulesError" in out.stderr
    assert str(tmp_path / "rule_train.py") in out.stderr, out.stderr[-3000:]
    out = forked.run(longer + ["--trust_workdir"], cwd=ROOT, env=_env(),
                     capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "rule_train" not in sys.modules
    monkeypatch.chdir(ROOT)
    with pytest.raises(modules.UntrustedModulesError, match="rule_train.py"):
        restore(str(workdir))
    experiment = restore(str(workdir), modules=[str(tmp_path / "rule_train.py")])
    assert experiment.restored_step == 6
    assert experiment.learner.adapter.learning_rate == pytest.approx(0.05)


def test_a_module_missing_from_the_train_command_is_named(tmp_path):
    """Told before any work: TensorFlow is not even imported."""
    command = [sys.executable, "-X", "importtime", "-m", "metalearn.train",
               "--module=nowhere_rule.py", "--gin_file=sinusoid/maml.gin",
               f"--workdir={tmp_path / 'run'}"]
    out = forked.run(command, cwd=tmp_path, env=_env(), capture_output=True, text=True)
    assert out.returncode != 0
    assert "ModuleImportError" in out.stderr and \
        str(tmp_path / "nowhere_rule.py") in out.stderr, out.stderr[-2000:]
    assert "tensorflow" not in imported_packages(out.stderr)


def test_sweep_runs_import_the_module_and_their_records_resolve_anywhere(tmp_path,
                                                                        monkeypatch):
    """A sweep started from the user's folder (a relative module and gin file): each
    run's process imports the module (train and evaluate), and the run's record holds
    paths that resolve from any other working directory."""
    here, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    here.mkdir()
    elsewhere.mkdir()
    write_rule(here, "rule_sweep")
    (here / "mine.gin").write_text("GradientDescent.learning_rate = @rule_sweep_rate()\n")
    monkeypatch.chdir(here)
    spec = sweeps.SweepSpec(["sinusoid/maml.gin", "mine.gin"], list(TINY),
                            {"rule_sweep_rate.scale": ["1.0"]}, modules=["rule_sweep.py"])
    results = sweeps.run_sweep(spec, "root", parallel=1, evaluate=True, log=lambda _: None)
    workdir = here / "root" / "rule_sweep_rate.scale=1.0"
    assert [r["status"] for r in results] == ["ran"], open(workdir / "train.log").read()[-3000:]
    with open(workdir / Workdir.SWEEP_RUN) as f:
        record = json.load(f)
    assert record["gin_files"] == [os.path.join("experiments", "sinusoid", "maml.gin"),
                                   str(here / "mine.gin")]
    assert record["modules"] == [str(here / "rule_sweep.py")]
    with open(here / "root" / Workdir.SWEEP) as f:
        assert json.load(f)["spec"]["gin_files"] == record["gin_files"]
    assert os.path.isfile(workdir / "eval.json")  # the run's process restored the run
    monkeypatch.chdir(elsewhere)  # the run again from another directory: it resolves
    for name in ("metrics.json", "eval.json"):
        os.remove(workdir / name)
    sweeps.train_and_evaluate(str(workdir), modules=[str(here / "rule_sweep.py")])
    with open(workdir / "metrics.json") as f:
        assert json.load(f)["step"] == 4
    assert gin.query_parameter("rule_sweep_rate.scale") == 1.0
    assert [paths.from_repository(f) for f in record["gin_files"]] == [
        os.path.join(ROOT, "experiments", "sinusoid", "maml.gin"), str(here / "mine.gin")]


def test_a_module_the_script_imported_already_is_not_imported_twice(tmp_path,
                                                                    monkeypatch):
    path = write_rule(tmp_path, "rule_twice")
    monkeypatch.syspath_prepend(str(tmp_path))
    import rule_twice  # noqa: F401  (as the user's own script would)
    parse_config(["experiments/sinusoid/maml.gin"],
                 ["GradientDescent.learning_rate = @rule_twice_rate()"], modules=[path])
    assert build_experiment().learner.adapter.learning_rate == pytest.approx(0.05)
