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
    with pytest.raises(RuntimeError, match="exited with 3"):
        first_result.timed([sys.executable, "-c", "raise SystemExit(3)"], str(tmp_path),
                           first_result.STEP_LINE)


def test_the_figure_line_is_evaluate_s():
    assert first_result.FIGURE_LINE.search("10 inner steps: loss 0.0992 ± 0.0132")
    assert not first_result.FIGURE_LINE.search("evaluation 40% (10 inner steps: batch 1/24)")


def test_the_jobs_are_shipped_files_and_the_table_takes_medians():
    for path in first_result.JOBS.values():
        assert os.path.isfile(os.path.join(ROOT, path)), path
    rows = [{"job": "sinusoid", "tree": ".", "train_first_line_s": v, "train_s": 2 * v,
             "evaluate_first_figure_s": None, "evaluate_s": 1.0} for v in (1.0, 3.0, 2.0)]
    text = first_result.table(rows)
    assert re.search(r"\| sinusoid \| \. \| 3 \| 2\.0 \| 4\.0 \| - \| 1\.0 \|", text), text
