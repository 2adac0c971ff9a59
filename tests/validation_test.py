"""Bad input is found before training and named: docs/errors.md's "Every bad input tried",
one table per subject and one row per case.

A subject's cases are in the test folder of the subpackage that raises their errors, and
run there once each (tests/bad_input.py says what a case is and checks);
this suite gathers every subject's cases in the docs' order.
``test_docs_table_lists_every_case`` keeps docs/errors.md's tables and the cases in step;
``python -m tests.validation_test`` prints the tables from the cases.
"""

import glob
import os
import re

from tests import bad_input
from tests.adapters import bad_adapter_test
from tests.execution import bad_execution_test
from tests.heads import bad_head_test
from tests.learners import bad_learner_test
from tests.outer import bad_outer_rule_test
from tests.rl import bad_rl_test
from tests.runs import bad_gin_test, bad_workdir_test
from tests.serving import bad_conversion_test, bad_export_test
from tests.studies import bad_results_test
from tests.tasks import bad_data_test, bad_tasks_test, bad_tfds_test
from tests.training import (bad_checkpoint_test, bad_config_test, bad_distribution_test,
                            bad_evaluation_test)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS_TABLE = os.path.join(ROOT, "docs", "errors.md")

# In docs/errors.md's order: the configuration, the data, the pieces, then the runs.
SUBJECTS = [bad_gin_test, bad_config_test, bad_execution_test, bad_distribution_test,
            bad_data_test, bad_tfds_test, bad_tasks_test,
            bad_learner_test, bad_head_test, bad_adapter_test, bad_outer_rule_test,
            bad_rl_test,
            bad_workdir_test, bad_checkpoint_test, bad_evaluation_test, bad_export_test,
            bad_conversion_test, bad_results_test]
CASES = [case for subject in SUBJECTS for case in subject.CASES]


def tables() -> str:
    """docs/errors.md's tables, one a subject under its heading, made from the cases."""
    sections = []
    for subject in SUBJECTS:
        path = os.path.relpath(subject.__file__, ROOT)
        sections.append(f"### {subject.TITLE}\n\nThe cases of `{path}`.\n\n"
                        + bad_input.table(subject.CASES))
    return "\n".join(sections)


def test_docs_table_lists_every_case():
    with open(DOCS_TABLE) as f:
        text = f.read()
    assert tables() in text, ("docs/errors.md's tables differ from the cases; regenerate "
                              "them with `python -m tests.validation_test`")


def _makes_cases(path: str) -> bool:
    # a module of cases: its own CASES list, made of tests/bad_input.py's Case (other
    # modules may borrow bad_input's small data sets)
    with open(path) as f:
        text = f.read()
    return (re.search(r"^from tests\.bad_input import", text, re.M) is not None
            and re.search(r"^CASES\b", text, re.M) is not None)


def test_every_subject_is_gathered():
    """A test module that makes cases of tests/bad_input.py is one of the subjects, and
    no case name is given twice."""
    making = sorted(os.path.relpath(path, ROOT) for path in glob.glob(
        os.path.join(ROOT, "tests", "**", "*_test.py"), recursive=True) if _makes_cases(path))
    assert making == sorted(os.path.relpath(s.__file__, ROOT) for s in SUBJECTS)
    names = [case.name for case in CASES]
    assert len(set(names)) == len(names) > 150


if __name__ == "__main__":
    print(tables(), end="")
