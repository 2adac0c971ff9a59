"""Gin files that moved: an old path fails naming the new one, wherever gin files are
looked up, and the package's table (metalearn.repository.MOVED_GIN_FILES) agrees with
CHANGELOG.md's "Experiments: where the gin files went"."""

import os
import re

import pytest

import metalearn  # noqa: F401  (registers the configurables)
from metalearn.flags import resolve_gin_files
from metalearn.repository import MOVED_GIN_FILES, ROOT, MovedGinFileError
from metalearn.training import parse_config

CHANGELOG = os.path.join(ROOT, "CHANGELOG.md")
NUMBERS = {"six": 6}


def changelog_moves():
    """CHANGELOG.md's table as old -> new pairs, its patterns expanded: ``{a,b}/base.gin``
    -> ``<data set>.gin`` per name; "the N ``<data set>/smoke.gin``" -> the data sets of
    the package's table (checked to be N). Rows that move no file one to one (bodies
    copied into learners, bindings) are returned apart."""
    with open(CHANGELOG, encoding="utf-8") as f:
        text = f.read()
    section = text.split("### Experiments: where the gin files went", 1)[1].split("\n#", 1)[0]
    pairs, other = {}, []
    for row in re.findall(r"^\| (.+) \| (.+) \|$", section, re.M)[2:]:  # no header
        old_cell, new_cell = row
        olds = re.findall(r"`(experiments/[^`]+\.gin)`", old_cell)
        news = re.findall(r"`(experiments/[^`]+\.gin)`", new_cell)
        if not olds or not news or "*" in old_cell or "<algorithm>" in new_cell:
            other.append(row)
            continue
        old, new = olds[0], news[0]
        braces = re.search(r"\{([\w,]+)\}", old)
        if braces:
            for name in braces.group(1).split(","):
                pairs[old.replace(braces.group(0), name)] = new.replace("<data set>", name)
        elif "<data set>" in old:
            count = NUMBERS[re.search(r"the (\w+) `", old_cell).group(1)]
            pattern = re.escape(old).replace(re.escape("<data set>"), r"(\w+)")
            found = [p for p in MOVED_GIN_FILES if re.fullmatch(pattern, p)]
            assert len(found) == count, (old_cell, found)
            pairs.update({p: new for p in found})
        else:
            pairs[old] = new
    return pairs, other


def test_the_package_s_table_is_changelog_s():
    pairs, other = changelog_moves()
    assert pairs == MOVED_GIN_FILES
    assert len(other) == 3, other  # bodies -> learners/, NUM_STEPS, learning_rate = None
    for old, new in MOVED_GIN_FILES.items():
        assert os.path.isfile(os.path.join(ROOT, new)), new
        assert not os.path.exists(os.path.join(ROOT, old)), old


@pytest.mark.parametrize("given, new", [
    ("experiments/omniglot/base.gin", "experiments/setups/omniglot_common.gin"),
    ("mini_imagenet/smoke.gin", "experiments/budgets/smoke.gin"),  # under experiments/
    (os.path.join(ROOT, "experiments", "resnet12.gin"), "experiments/setups/resnet12.gin")])
def test_gin_file_flag_of_an_old_path_names_the_new(given, new):
    with pytest.raises(MovedGinFileError) as info:
        resolve_gin_files(["experiments/sinusoid/maml.gin", given])
    assert f"gin file {given!r} not found" in str(info.value)
    assert f"moved to {new}" in str(info.value)
    assert isinstance(info.value, FileNotFoundError)  # what a missing file raised before


def test_include_of_an_old_path_names_the_new_and_the_line(tmp_path):
    top = tmp_path / "top.gin"
    top.write_text("include 'experiments/sinusoid/maml.gin'\n"
                   "include 'experiments/omniglot/base.gin'\n")
    with pytest.raises(MovedGinFileError) as info:
        parse_config([str(top)])
    message = str(info.value)
    assert "moved to experiments/setups/omniglot_common.gin" in message
    assert f'In file "{top}", line 2' in message
    with pytest.raises(MovedGinFileError, match="moved to experiments/budgets/smoke.gin"):
        parse_config(["experiments/sinusoid/maml.gin"],
                     ["include 'experiments/cub/smoke.gin'"])
    with pytest.raises(MovedGinFileError, match="moved to experiments/setups/resnet12.gin"):
        parse_config(["experiments/resnet12.gin"])  # a file given to parse_config itself


def test_a_missing_file_that_never_moved_is_still_plain_not_found(tmp_path):
    with pytest.raises(FileNotFoundError) as info:
        resolve_gin_files(["experiments/omniglot/nowhere.gin"])
    assert not isinstance(info.value, MovedGinFileError)
    assert "moved" not in str(info.value)
