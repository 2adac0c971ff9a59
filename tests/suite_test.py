"""The suite's own rules, which keep its time down under ``-n 2``."""

import glob
import os
import re

HERE = os.path.dirname(os.path.abspath(__file__))
SCOPED = re.compile(r"@pytest\.fixture\(scope=[\"'](module|package|session)[\"']")
MARK = "pytestmark = pytest.mark.xdist_group(__name__)"


def test_a_module_with_a_scoped_fixture_runs_on_one_worker():
    # Dealt out one test at a time (xdist's "load"), the tests of such a module would
    # build its fixture on each worker; tests/conftest.py schedules marked ones together.
    sources = {os.path.relpath(p, HERE): open(p).read()
               for p in glob.glob(os.path.join(HERE, "**", "*_test.py"), recursive=True)}
    scoped = sorted(name for name, text in sources.items() if SCOPED.search(text))
    assert len(scoped) >= 7  # resume, sweep, reliability, pretraining, ...
    unmarked = [name for name in scoped if MARK not in sources[name]]
    assert unmarked == [], f"add `{MARK}` to {unmarked}"
