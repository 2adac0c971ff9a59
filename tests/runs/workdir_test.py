"""`Workdir`: the one table of a workdir's file names."""

import ast
import os

from metalearn.runs.workdir import Workdir
from metalearn.repository import ROOT

NAMES = {name: value for name, value in vars(Workdir).items() if name.isupper()}


def test_paths_are_the_names_in_the_directory(tmp_path):
    workdir = Workdir(tmp_path)
    assert workdir.config == os.path.join(str(tmp_path), "config.gin")
    assert workdir.checkpoints == os.path.join(str(tmp_path), "checkpoints")
    assert workdir.metrics == os.path.join(str(tmp_path), "metrics.json")
    assert workdir.train_lock == os.path.join(str(tmp_path), ".train.lock")
    assert workdir.evaluation() == os.path.join(str(tmp_path), "eval.json")
    assert workdir.evaluation("/elsewhere/e.json") == "/elsewhere/e.json"
    assert os.fspath(workdir) == str(tmp_path)
    for name in ("operative_config", "summaries", "sweep_run", "sweep_lock", "train_log",
                 "report", "sweep"):
        assert os.path.dirname(getattr(workdir, name)) == str(tmp_path), name


def test_a_run_has_a_config_or_metrics_and_its_evaluations_are_listed(tmp_path):
    workdir = Workdir(tmp_path)
    assert not workdir.is_run() and workdir.evaluations() == []
    (tmp_path / "metrics.json").write_text("{}")
    (tmp_path / "eval_b.json").write_text("{}")
    (tmp_path / "eval.json").write_text("{}")
    assert workdir.is_run()
    assert [os.path.basename(p) for p in workdir.evaluations()] == ["eval.json",
                                                                    "eval_b.json"]


def test_no_other_module_spells_a_workdir_file_name():
    # "train" (the summaries' folder) is also the name of a split: left out here.
    names = set(NAMES.values()) - {"train"}
    found = []
    for folder, _, files in os.walk(os.path.join(ROOT, "metalearn")):
        for name in files:
            path = os.path.join(folder, name)
            if not name.endswith(".py") or path.endswith(os.path.join("runs", "workdir.py")):
                continue
            for node in ast.walk(ast.parse(open(path).read(), path)):
                if isinstance(node, ast.Constant) and node.value in names:
                    found.append(f"{os.path.relpath(path, ROOT)}:{node.lineno}: "
                                 f"{node.value!r}")
    assert found == [], "ask metalearn.runs.workdir.Workdir instead:\n" + "\n".join(found)
