"""A sweep whose runs are not all finished: each run's state (finished, unfinished, running,
failed, never started) and the report that says what is incomplete, names each run's
folder and exits non-zero unless ``--allow_incomplete``."""

import csv
import json
import os
import socket
import subprocess
import sys

import pytest

from metalearn import report as report_module
from metalearn.runs.workdir import Workdir
from metalearn.studies import results
from metalearn.repository import ROOT
from tests.run_fixtures import sweep_run
from tests import forked


@pytest.fixture
def half_written_sweep(tmp_path):
    """A sweep of 2 rates x 2 seeds whose runs are: one finished, one unfinished
    (killed at step 40), one failed, one never started (no folder)."""
    root = str(tmp_path / "sweep")
    os.makedirs(root)
    names = ["lr=0.1,seed=0", "lr=0.1,seed=1", "lr=0.01,seed=0", "lr=0.01,seed=1"]
    with open(os.path.join(root, "sweep.json"), "w") as f:
        json.dump({"spec": {}, "runs": names, "evaluate": False}, f)
    sweep_run(root, names[0], "0.1", "0")
    sweep_run(root, names[1], "0.1", "1", "unfinished")
    sweep_run(root, names[2], "0.01", "0", "failed")
    return root, names


def test_report_of_a_half_written_sweep_states_what_is_incomplete(half_written_sweep,
                                                                   tmp_path):
    root, names = half_written_sweep
    out = report_module.report([root], str(tmp_path / "out"), plots=False)
    states = {s.name: (s.status, s.detail) for s in out["incomplete"]}
    assert states == {names[1]: ("unfinished", "at step 40 of 100"),
                      names[2]: ("failed", "at step 40 of 100; exit code 1, see "
                                 f"{os.path.join(root, names[2], 'train.log')}"),
                      names[3]: ("never started", "no folder")}
    assert [(r["GradientDescent.learning_rate"], r["seeds"]) for r in out["rows"]] == [
        ("0.1", 1)]  # one seed's figures are one seed's
    table = (tmp_path / "out" / "table.md").read_text()
    assert "**INCOMPLETE: 3 of 4 runs are not finished (1 unfinished, 1 failed, 1 never " \
           "started)" in table
    for name in names[1:]:
        assert os.path.join(root, name) in table
    with open(tmp_path / "out" / "runs.csv") as f:
        rows = list(csv.reader(f))
    assert [r[2].split(":")[0] for r in rows[1:]] == ["finished", "unfinished", "failed",
                                                      "never started"]


def test_report_entry_point_exits_non_zero_on_an_incomplete_sweep(half_written_sweep,
                                                                  tmp_path):
    root, names = half_written_sweep
    command = [sys.executable, "-m", "metalearn.report", root, "--noplots",
               f"--output_dir={tmp_path / 'out'}"]
    env = dict(os.environ, PYTHONPATH=ROOT)
    done = forked.run(command, env=env, cwd=ROOT, capture_output=True, text=True,
                      timeout=120)
    assert done.returncode == report_module.INCOMPLETE_EXIT, done.stderr[-2000:]
    assert "INCOMPLETE: 3 run(s) not finished" in done.stderr
    for name in names[1:]:
        assert os.path.join(root, name) in done.stderr
    assert (tmp_path / "out" / "table.md").is_file()  # written all the same


def test_allow_incomplete_exits_zero_and_still_lists_them(half_written_sweep, tmp_path,
                                                         capsys):
    root, names = half_written_sweep
    out = report_module.report([root], str(tmp_path / "out"), plots=False)
    assert report_module.console(out, allow_incomplete=True) == 0  # --allow_incomplete
    assert report_module.console(out) == report_module.INCOMPLETE_EXIT
    stderr = capsys.readouterr().err
    assert "INCOMPLETE: 3 run(s) not finished" in stderr
    assert os.path.join(root, names[3]) in stderr


def test_a_column_some_seeds_lack_is_marked(tmp_path):
    root = str(tmp_path)
    sweep_run(root, "a", "0.1", "0", evaluate=False)
    sweep_run(root, "b", "0.1", "1", evaluate=False)
    with open(os.path.join(root, "a", "eval.json"), "w") as f:
        json.dump({"results": {"1": {"loss": {"mean": 0.5, "ci95": 0.1, "std": 1}}}}, f)
    out = report_module.report([root], str(tmp_path / "out"), plots=False)
    assert "| 0.1 | 2 | 1.5 ± 6.35 | 0.5 (n=1) |" in out["table"]


def test_a_run_trained_but_not_evaluated_is_unfinished(tmp_path):
    workdir = sweep_run(str(tmp_path), "a", "0.1", "0", evaluate=True)
    os.remove(os.path.join(workdir, "eval.json"))
    state = results.run_state(workdir)
    assert (state.status, state.detail) == ("unfinished", "trained, not evaluated")


def test_a_run_training_now_is_running_and_a_dead_holder_is_not(tmp_path):
    from metalearn.runs.lock import WorkdirLock
    workdir = sweep_run(str(tmp_path), "a", "0.1", "0", "unfinished")
    with WorkdirLock(workdir):
        state = results.run_state(workdir)
        assert state.status == "running" and f"process {os.getpid()}" in state.detail
    assert results.run_state(workdir).status == "unfinished"  # released
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    with open(Workdir(workdir).train_lock, "w") as f:  # a killed trainer's record
        json.dump({"pid": int(dead), "host": socket.gethostname()}, f)
    assert results.run_state(workdir).status == "unfinished"


def test_no_finished_run_is_an_error_listing_them(tmp_path):
    sweep_run(str(tmp_path), "a", "0.1", "0", "unfinished")
    with pytest.raises(report_module.IncompleteError, match="no finished run .*unfinished: "
                       "a .*at step 40 of 100"):
        report_module.report([str(tmp_path)], plots=False)
