"""Atomic writes: a write cut short leaves the previous file whole."""

import json
import os
import stat

import pytest

from metalearn.runs import files


def test_write_replaces_the_whole_file(tmp_path):
    path = str(tmp_path / "metrics.json")
    files.write_json(path, {"loss": 1.5, "step": 3})
    files.write_json(path, {"loss": 0.25, "step": 4})
    with open(path) as f:
        assert json.load(f) == {"loss": 0.25, "step": 4}
    assert os.listdir(tmp_path) == ["metrics.json"]  # no temporary file left
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o666 & ~umask  # as open() makes it


@pytest.mark.parametrize("fail_in", ["write", "replace"])
def test_a_write_cut_short_keeps_the_previous_file(tmp_path, monkeypatch, fail_in):
    path = str(tmp_path / "config.gin")
    files.write_text(path, "Loop.num_steps = 10\n")

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt  # stands for the process dying at this point

    if fail_in == "write":
        monkeypatch.setattr(os, "fsync", interrupted)  # after part of the text is written
    else:
        monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        files.write_text(path, "Loop.num_steps = 20\n" * 1000)
    monkeypatch.undo()
    with open(path) as f:
        assert f.read() == "Loop.num_steps = 10\n"
    assert os.listdir(tmp_path) == ["config.gin"]
