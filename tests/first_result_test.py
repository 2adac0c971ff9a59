"""benchmarks/first_result.py: the timer reads a command's output as it comes, and the
jobs it times are the shipped files (the timings themselves are a benchmark's)."""

import os
import re
import sys

import pytest

from benchmarks import first_result
from metalearn.repository import ROOT


def test_timed_finds_the_first_marked_line_and_the_exit(tmp_path):
    script = ("import time; print('warming up', flush=True); time.sleep(0.3); "
              "print('I0 loop.py:354] step 1/5  meta-loss 1.0', flush=True); time.sleep(0.3)")
    found = first_result.timed([sys.executable, "-c", script], str(tmp_path),
                               first_result.STEP_LINE)
    assert 0.25 < found["first_s"] < found["total_s"]
    assert found["total_s"] - found["first_s"] > 0.25
    none = first_result.timed([sys.executable, "-c", "print('nothing')"], str(tmp_path),
                              first_result.STEP_LINE)
    assert none["first_s"] is None
    stopped = first_result.timed([sys.executable, "-c", script + "; time.sleep(60)"],
                                 str(tmp_path), first_result.STEP_LINE, stop=True)
    assert 0.25 < stopped["first_s"] < 30 and stopped["total_s"] is None
    with pytest.raises(RuntimeError, match="exited with 3"):
        first_result.timed([sys.executable, "-c", "raise SystemExit(3)"], str(tmp_path),
                           first_result.STEP_LINE)


def test_the_figure_line_is_evaluate_s():
    assert first_result.FIGURE_LINE.search("10 inner steps: loss 0.0992 ± 0.0132")
    assert not first_result.FIGURE_LINE.search("evaluation 40% (10 inner steps: batch 1/24)")


def test_the_jobs_are_shipped_files_and_the_table_takes_medians():
    for path in first_result.JOBS.values():
        assert os.path.isfile(os.path.join(ROOT, path)), path
    rows = [{"job": "sinusoid", "tree": ".", "cache": "cold", "train_first_line_s": v,
             "train_s": 2 * v, "evaluate_first_figure_s": None, "evaluate_s": 1.0}
            for v in (1.0, 3.0, 2.0)]
    rows.append(dict(rows[0], cache="warm"))
    text = first_result.table(rows)
    assert re.search(r"\| sinusoid \| \. \| cold \| 3 \| 2\.0 \(1\.0-3\.0\) \| "
                     r"4\.0 \(2\.0-6\.0\) \| - \| 1\.0 \(1\.0-1\.0\) \|", text), text
    assert "| sinusoid | . | warm | 1 | 1.0 | 2.0 | - | 1.0 |" in text, text


def test_each_round_has_its_own_cache_folder_cold_then_warm(tmp_path, monkeypatch):
    """The runs get the loaders' cache folder through the environment: one temporary
    folder per round, job and tree, empty for the cold run, kept for the warm one."""
    seen = []

    def timed(command, cwd, marker, env=None, stop=False):
        folder = env[first_result.CACHE_DIR_ENV]
        seen.append((folder, sorted(os.listdir(folder))))
        with open(os.path.join(folder, f"file{len(seen)}"), "w"):
            pass  # what a loader would keep
        return {"first_s": 1.0, "total_s": 2.0}

    monkeypatch.setattr(first_result, "timed", timed)
    rows = first_result.run_round("omniglot", str(tmp_path), 5, ("cold", "warm"))
    assert [r["cache"] for r in rows] == ["cold", "warm"]
    folders = {folder for folder, _ in seen}
    assert len(folders) == 1 and not os.path.exists(folders.pop())  # removed after
    # cold: train finds it empty, evaluate what train kept; warm: both runs' files
    assert [files for _, files in seen] == [[], ["file1"], ["file1", "file2"],
                                            ["file1", "file2", "file3"]]
    seen.clear()
    rows = first_result.run_round("omniglot", str(tmp_path), 5, ("cold", "warm"),
                                  first_line_only=True)  # the trainings only
    assert [files for _, files in seen] == [[], ["file1"]]
    assert [r["evaluate_s"] for r in rows] == [None, None]
