"""What a run imports: a ``--module`` that calls ``sys.exit`` on import is an error naming it,
and a workdir is data: nothing it names (``modules.json``, gin ``import`` lines of its
``config.gin``) is imported by ``restore``, ``evaluate``, ``train`` or a sweep's run
unless the user asks on the command line (``--module=``, ``--trust_workdir``)."""

import json
import os
import subprocess
import sys

import pytest

import metalearn  # noqa: F401  (registers the configurables)
from metalearn.runs import modules
from metalearn.runs.workdir import Workdir
from metalearn.studies import sweeps
from metalearn.training import parse_config, restore
from metalearn.repository import ROOT
from tests.run_fixtures import imported_packages, saved_run
from tests import forked


TINY = ["Loop.num_steps = 2", "Loop.log_every = 1", "Loop.checkpoint_every = 2",
        "Experiment.meta_batch_size = 2", "mlp.hidden = (4,)", "evaluate.num_tasks = 4",
        "evaluate.batch_size = 2", "evaluate.inner_steps = (1,)"]


def _env():
    return dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3")


# --- a module that exits on import ------------------------------------------------


@pytest.mark.parametrize("code", ["0", "None", "'bye'"])
def test_a_module_that_exits_on_import_is_an_error_naming_it(tmp_path, code):
    quitter = tmp_path / f"quitter_{abs(hash(code))}.py"
    quitter.write_text(f"import sys\nsys.exit({code})\n")
    with pytest.raises(modules.ModuleImportError, match="sys.exit") as info:
        parse_config(["experiments/sinusoid/maml.gin"], modules=[str(quitter)])
    assert str(quitter) in str(info.value)
    assert isinstance(info.value.__cause__, SystemExit)


def test_train_with_a_module_that_exits_on_import_fails_naming_it(tmp_path):
    (tmp_path / "quitter.py").write_text("import sys\nsys.exit(0)\n")
    command = [sys.executable, "-m", "metalearn.train", "--module=quitter.py",
               "--gin_file=sinusoid/maml.gin", f"--workdir={tmp_path / 'run'}",
               *[f"--gin_param={p}" for p in TINY]]
    out = forked.run(command, cwd=tmp_path, env=_env(), capture_output=True, text=True)
    assert out.returncode != 0, out.stderr[-2000:]
    assert "ModuleImportError" in out.stderr and str(tmp_path / "quitter.py") in out.stderr, \
        out.stderr[-2000:]


# --- a received workdir is data ---------------------------------------------------


def _payload(folder, name: str) -> str:
    """A module that would write a marker file if it were ever imported."""
    path = folder / f"{name}.py"
    path.write_text(f"open({str(folder / (name + '.ran'))!r}, 'w').write('ran')\n")
    return str(path)


def _received(tmp_path, name: str, import_line: bool = False):
    """A saved run (config.gin and a checkpoint) whose modules.json names a payload (or
    whose config.gin imports one): a workdir as someone else could send it."""
    workdir = tmp_path / "received"
    saved_run(str(workdir))
    payload = _payload(tmp_path, name)
    if import_line:
        config = (workdir / "config.gin").read_text()
        (workdir / "config.gin").write_text(f"import {name}\n" + config)
    else:
        (workdir / Workdir.MODULES).write_text(json.dumps([payload]))
    return workdir, payload


def _assert_refused(message: str, payload: str):
    assert payload in message, message
    assert "--module=" in message and "--trust_workdir" in message, message


def test_restore_of_a_received_workdir_imports_nothing_it_names(tmp_path):
    workdir, payload = _received(tmp_path, "payload_restore")
    with pytest.raises(modules.UntrustedModulesError) as info:
        restore(str(workdir))
    _assert_refused(str(info.value), payload)
    assert not (tmp_path / "payload_restore.ran").exists()
    restore(str(workdir), modules=[payload])  # asked for by name: imported
    assert (tmp_path / "payload_restore.ran").exists()


def test_restore_with_trust_imports_what_the_workdir_names(tmp_path):
    workdir, _ = _received(tmp_path, "payload_trusted")
    restore(str(workdir), trust_workdir=True)
    assert (tmp_path / "payload_trusted.ran").exists()


def test_a_gin_import_line_in_a_workdir_s_config_follows_the_same_rule(tmp_path,
                                                                      monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))  # importable by name, as gin would
    workdir, _ = _received(tmp_path, "payload_import_line", import_line=True)
    with pytest.raises(modules.UntrustedModulesError) as info:
        restore(str(workdir))
    message = str(info.value)
    assert "payload_import_line" in message and "import" in message, message
    assert "--module=payload_import_line" in message and "--trust_workdir" in message
    assert not (tmp_path / "payload_import_line.ran").exists()
    restore(str(workdir), modules=["payload_import_line"])
    assert (tmp_path / "payload_import_line.ran").exists()


@pytest.mark.parametrize("entry_point, flags", [
    ("evaluate", ["--gin_param=evaluate.num_tasks = 4"]),  # evaluating a received run
    ("train", ["--gin_file=sinusoid/maml.gin", "--gin_param=mlp.hidden = (4,)"]),  # resuming
])
def test_an_entry_point_refuses_a_received_workdir_s_modules(tmp_path, entry_point, flags):
    """Refused before any work: TensorFlow is not even imported."""
    workdir, payload = _received(tmp_path, f"payload_{entry_point}")
    out = subprocess.run([sys.executable, "-X", "importtime", "-m",
                          f"metalearn.{entry_point}", f"--workdir={workdir}", *flags],
                         cwd=ROOT, env=_env(), capture_output=True, text=True)
    assert out.returncode != 0
    assert "UntrustedModulesError" in out.stderr, out.stderr[-3000:]
    _assert_refused(out.stderr, payload)
    assert not (tmp_path / f"payload_{entry_point}.ran").exists()
    assert "tensorflow" not in imported_packages(out.stderr)


def test_a_sweep_run_s_record_imports_nothing_unless_given(tmp_path):
    workdir = tmp_path / "sweep" / "run"
    workdir.mkdir(parents=True)
    payload = _payload(tmp_path, "payload_sweep")
    (workdir / Workdir.SWEEP_RUN).write_text(json.dumps({
        "name": "run", "bindings": {}, "num_steps": 2, "evaluate": False, "eval_params": [],
        "gin_files": ["experiments/sinusoid/maml.gin"], "gin_params": TINY,
        "modules": [payload]}))
    with pytest.raises(modules.UntrustedModulesError) as info:
        sweeps.train_and_evaluate(str(workdir))
    _assert_refused(str(info.value), payload)
    out = forked.run([sys.executable, "-m", "metalearn.sweep", f"--execute={workdir}"],
                     cwd=ROOT, env=_env(), capture_output=True, text=True)
    assert out.returncode != 0 and "UntrustedModulesError" in out.stderr, out.stderr[-3000:]
    assert not (tmp_path / "payload_sweep.ran").exists()
