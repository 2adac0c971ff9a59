"""The layout of experiments/ by role (experiments/README.md): setups, learners, budgets
and the runnable files that combine them. Static checks on the gin text (fast); every
runnable file is also built in tests/training/train_test.py, and every natural-image and
Meta-Dataset file with budgets/smoke.gin in tests/benchmark_configs_test.py."""

import glob
import os
import re
from typing import Dict, List, Tuple

import gin
import pytest
from gin import config, config_parser

import metalearn  # noqa: F401  (registers the configurables the files name)
from metalearn.training import build_experiment, parse_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXPERIMENTS = os.path.join(ROOT, "experiments")
ROLES = ("setups", "learners", "budgets")
ALL = sorted(os.path.relpath(p, ROOT) for p in
             glob.glob(os.path.join(EXPERIMENTS, "**", "*.gin"), recursive=True))


def role(path: str) -> str:
    """'setups', 'learners', 'budgets', 'sweeps' or 'runnable'."""
    top = os.path.relpath(path, "experiments").split(os.sep)[0]
    return top if top in ROLES + ("sweeps",) else "runnable"


def body(path: str) -> str:
    """The file's text without comments and whitespace (quotes respected)."""
    out = []
    with open(os.path.join(ROOT, path)) as f:
        for line in f:
            quote, kept = None, ""
            for char in line:
                if quote:
                    quote = None if char == quote else quote
                elif char in "'\"":
                    quote = char
                elif char == "#":
                    break
                kept += char
            out.append(re.sub(r"\s+", "", kept))
    return "".join(out)


def statements(path: str) -> List[Tuple[str, str]]:
    """The file with its includes expanded, in gin's order: ``(file, key)`` per binding,
    the key ``scope/selector.param`` (the selector as registered) or a macro's name."""
    with open(os.path.join(ROOT, path)) as f:
        parser = config_parser.ConfigParser(f.read(), config.ParserDelegate(skip_unknown=True))
        parsed = list(parser)
    result = []
    for statement in parsed:
        if isinstance(statement, config_parser.IncludeStatement):
            result += statements(statement.filename)
        elif isinstance(statement, config_parser.BindingStatement):
            if not statement.arg_name:  # a macro
                result.append((path, statement.selector))
                continue
            match = config._REGISTRY.get_match(statement.selector)
            selector = match.selector if match else statement.selector
            scope = statement.scope + "/" if statement.scope else ""
            result.append((path, f"{scope}{selector}.{statement.arg_name}"))
    return result


def includes(path: str) -> List[str]:
    with open(os.path.join(ROOT, path)) as f:
        parser = config_parser.ConfigParser(f.read(), config.ParserDelegate(skip_unknown=True))
        return [s.filename for s in parser if isinstance(s, config_parser.IncludeStatement)]


def test_the_roles_are_there():
    roles = {role(p) for p in ALL}
    assert roles == {"setups", "learners", "budgets", "sweeps", "runnable"}
    assert {"smoke", "cpu", "paper"} <= {os.path.basename(p)[:-4] for p in ALL
                                         if role(p) == "budgets"}


def test_no_two_gin_files_have_the_same_body():
    seen: Dict[str, str] = {}
    for path in ALL:
        text = body(path)
        assert text, f"{path} binds nothing"
        assert text not in seen, f"{path} has the same body as {seen[text]}"
        seen[text] = path


def test_files_include_only_setups_learners_and_budgets():
    for path in ALL:
        for included in includes(path):
            assert role(included) in ROLES, \
                f"{path} includes {included}, which is not a setup, learner or budget"


def test_no_file_includes_a_learner_file_to_override_it():
    """A key (binding or macro) that a learners/ file binds is bound again by nothing
    parsed after it in the file that includes it: not by the including file, nor by a
    file included later (another learner, a budget). A learner file may include another
    one and add bindings (reptile.gin on maml.gin), never re-bind them."""
    for path in ALL:
        expanded = statements(path)
        for i, (origin, key) in enumerate(expanded):
            if role(origin) != "learners":
                continue
            later = [o for o, k in expanded[i + 1:] if k == key and o != origin]
            assert not later, f"{path}: {later[0]} re-binds {key}, bound by {origin}"


DATA_KEYS = re.compile(r"(^|/|\.)(FewShotClassification|Sinusoid|GaussianProcess|MetaDataset|"
                       r"load_\w+)\.")


def test_learners_never_name_a_data_set_and_setups_no_learner():
    for path in ALL:
        keys = [k for o, k in statements(path) if o == path]
        if role(path) == "learners":
            assert not [k for k in keys if DATA_KEYS.search(k)], path
        if role(path) == "setups":
            assert not [k for k in keys if k.endswith("Experiment.learner")], path


def test_runnable_files_keep_their_header_and_name_their_results_page():
    for path in ALL:
        if role(path) != "runnable":
            continue
        with open(os.path.join(ROOT, path)) as f:
            header = f.read().split("\ninclude", 1)[0]
        assert "python -m metalearn.train" in header or "python benchmarks/" in header, path
        assert 'README "' not in header, f"{path} names a README section: name docs/results/"


# A sweep over learners x setups is only command-line files (experiments/README.md): the
# learners below each build on both setups with the smoke budget, no file written.
GRID_SETUPS = ("omniglot_minimal", "mini_imagenet")
GRID_LEARNERS = ("maml", "anil", "protonets", "metaoptnet", "maml_plus_plus", "rfs")


@pytest.mark.parametrize("setup", GRID_SETUPS)
@pytest.mark.parametrize("learner", GRID_LEARNERS)
def test_a_learner_and_a_setup_build_without_a_new_file(setup, learner):
    parse_config([f"experiments/setups/{setup}.gin", f"experiments/learners/{learner}.gin",
                  "experiments/budgets/smoke.gin"], [])
    try:
        experiment = build_experiment()
        assert experiment.loop.num_steps == 2
    finally:
        gin.clear_config()
