"""The suite's own rules: it keeps its time down under ``-n 2``, and it is laid out like
the package (a folder of ``tests/`` per subpackage of ``metalearn``, the cross-cutting
suites at the top)."""

import glob
import os
import re

from metalearn.repository import ROOT

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = os.path.join(ROOT, "metalearn")
SCOPED = re.compile(r"@pytest\.fixture\(scope=[\"'](module|package|session)[\"']")
MARK = "pytestmark = pytest.mark.xdist_group(__name__)"
# Top-level suites named like a subpackage's module that cover more than that module.
CROSS_CUTTING = {
    "validation_test.py": "docs/errors.md's tables, from every subpackage's bad-input cases",
}


def _test_files():
    """Every test module under tests/, by its path from tests/."""
    return sorted(os.path.relpath(p, HERE)
                  for p in glob.glob(os.path.join(HERE, "**", "*_test.py"), recursive=True))


def _subpackages():
    """Each subpackage of metalearn, with the names of its modules (and of its own
    subpackages' modules: ``tasks`` holds ``tasks/datasets/mnist.py``)."""
    found = {}
    for name in sorted(os.listdir(PACKAGE)):
        folder = os.path.join(PACKAGE, name)
        if os.path.isfile(os.path.join(folder, "__init__.py")):
            found[name] = {os.path.basename(p)[:-3] for p in
                           glob.glob(os.path.join(folder, "**", "*.py"), recursive=True)
                           if not p.endswith("__init__.py")}
    return found


def test_a_module_with_a_scoped_fixture_runs_on_one_worker():
    # Dealt out one test at a time (xdist's "load"), the tests of such a module would
    # build its fixture on each worker; tests/conftest.py schedules marked ones together.
    sources = {name: open(os.path.join(HERE, name)).read() for name in _test_files()}
    scoped = sorted(name for name, text in sources.items() if SCOPED.search(text))
    assert len(scoped) >= 7  # resume, sweep, reliability, pretraining, ...
    unmarked = [name for name in scoped if MARK not in sources[name]]
    assert unmarked == [], f"add `{MARK}` to {unmarked}"


def test_the_test_folders_are_the_subpackages():
    """A folder of tests/ is named after a subpackage of metalearn and is a package
    (pytest then names its modules ``tests.<subpackage>.<file>``, so two folders may
    hold files of one name)."""
    subpackages = _subpackages()
    folders = sorted({os.path.dirname(name) for name in _test_files()} - {""})
    assert len(folders) >= 10  # the test sees the folders
    assert [f for f in folders if f.split(os.sep)[0] not in subpackages] == []
    assert [f for f in folders
            if not os.path.isfile(os.path.join(HERE, f, "__init__.py"))] == []


def test_a_subpackages_module_has_its_tests_in_the_subpackages_folder():
    """The tests of ``metalearn/<subpackage>/<module>.py`` are in
    ``tests/<subpackage>/`` (``tests/rl/trpo_test.py``, never ``tests/trpo_test.py``);
    a file at the top is a cross-cutting suite, or tests a top-level module."""
    subpackages = _subpackages()
    owners = {}  # a name -> the subpackages with a module (or are) of that name
    for subpackage, modules in subpackages.items():
        for name in modules | {subpackage}:
            owners.setdefault(name, set()).add(subpackage)
    misplaced = []
    for path in _test_files():
        folder, name = os.path.split(path)
        subject = name[:-len("_test.py")]
        if subject not in owners:
            continue
        if folder == "" and name in CROSS_CUTTING:
            continue
        if folder.split(os.sep)[0] not in owners[subject]:
            owner = " or ".join(sorted(owners[subject]))
            misplaced.append(f"tests/{path} (metalearn/{owner})")
    assert misplaced == [], f"move each into the folder of its subpackage: {misplaced}"
    assert "trpo" in owners and "mnist" in owners  # the test sees the modules
