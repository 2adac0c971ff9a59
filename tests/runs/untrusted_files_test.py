"""Checkpoints, results, metrics and caches are data: loading them never runs code.

A crafted pickle payload writes a marker file when unpickled (checked first, so the
payload is live); every loader is then given it and must reject or ignore it without
the marker appearing. The benchmark caches that are pickles (mini-ImageNet,
tiered-ImageNet) are read by ``plain_pickle``, which builds plain data only: the payload
is given to it at every protocol, as a value, a key, an object array and the whole
file. A scan of the source checks that nothing in ``metalearn/`` deserialises with
pickle, ``eval``/``exec`` or ``np.load`` without ``allow_pickle=False``. See
docs/errors.md, "Untrusted files".
"""

from __future__ import annotations

import ast
import hashlib
import io
import os
import pickle
from typing import List

import numpy as np
import pytest
import tensorflow as tf

import metalearn
from metalearn.tasks.datasets import (clear_caches, load_mini_imagenet, load_omniglot,
                                      load_tiered_imagenet, plain_pickle)
from metalearn.runs.workdir import Workdir
from metalearn.studies import results, sweeps
from metalearn.training import build_experiment, parse_config
from metalearn.repository import ROOT

FORBIDDEN_MODULES = {"pickle", "cPickle", "_pickle", "marshal", "shelve", "dill",
                     "cloudpickle", "joblib", "yaml"}
FORBIDDEN_CALLS = {"eval", "exec", "__import__"}


def _write_marker(path: str) -> None:
    with open(path, "w") as f:
        f.write("the payload ran")


class _Payload:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return _write_marker, (self.marker,)


@pytest.fixture
def payload(tmp_path):
    """``(pickle bytes, marker path)``; the bytes are shown to run when unpickled."""
    marker = str(tmp_path / "marker")
    data = pickle.dumps(_Payload(marker))
    pickle.loads(data)  # the control: unpickling runs it
    assert os.path.exists(marker)
    os.remove(marker)
    return data, marker


# --- the source --------------------------------------------------------------------


def violations(source: str, filename: str = "<source>") -> List[str]:
    """Deserialisation that can run code: pickle-like imports, eval/exec, np.load
    without ``allow_pickle=False``, ``allow_pickle=True`` anywhere."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        where = f"{filename}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Import):
            found += [f"{where} import {a.name}" for a in node.names
                      if a.name.split(".")[0] in FORBIDDEN_MODULES]
        elif isinstance(node, ast.ImportFrom) and node.module and \
                node.module.split(".")[0] in FORBIDDEN_MODULES:
            found.append(f"{where} from {node.module} import")
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else \
                func.attr if isinstance(func, ast.Attribute) else ""
            if isinstance(func, ast.Name) and name in FORBIDDEN_CALLS:
                found.append(f"{where} {name}()")
            keywords = {k.arg: k.value for k in node.keywords}
            pickle_flag = keywords.get("allow_pickle")
            if pickle_flag is not None and not (isinstance(pickle_flag, ast.Constant)
                                                and pickle_flag.value is False):
                found.append(f"{where} allow_pickle not False")
            if name == "load" and isinstance(func, ast.Attribute) and \
                    isinstance(func.value, ast.Name) and func.value.id in ("np", "numpy") \
                    and pickle_flag is None:
                found.append(f"{where} np.load without allow_pickle=False")
            if name in ("read_pickle", "load_model"):
                found.append(f"{where} {name}()")
    return found


def test_the_checker_finds_what_it_looks_for():
    bad = ("import pickle\nfrom yaml import load\nnp.load(f)\nnp.load(f, allow_pickle=True)\n"
           "eval('1')\nnp.load(f, allow_pickle=False)\n")
    assert len(violations(bad)) == 5


def test_nothing_in_metalearn_deserialises_code():
    found = []
    package = os.path.dirname(metalearn.__file__)
    for folder, _, files in os.walk(package):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path) as f:
                    found += violations(f.read(), os.path.relpath(path, ROOT))
    assert not found, found


# --- crafted files -------------------------------------------------------------------


def test_checkpoint_with_a_pickle_payload_is_rejected(tmp_path, payload):
    data, marker = payload
    parse_config(["experiments/sinusoid/maml.gin"])
    (tmp_path / "config.gin").write_text(build_experiment().config)
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    (checkpoints / "checkpoint").write_text('model_checkpoint_path: "ckpt-1"\n'
                                            'all_model_checkpoint_paths: "ckpt-1"\n')
    (checkpoints / "ckpt-1.index").write_bytes(data)
    (checkpoints / "ckpt-1.data-00000-of-00001").write_bytes(data)
    with pytest.raises((tf.errors.OpError, ValueError)):
        metalearn.restore(str(tmp_path))
    assert not os.path.exists(marker)


def test_results_and_metrics_with_a_pickle_payload_are_rejected(tmp_path, payload):
    data, marker = payload
    for name in ("metrics.json", "eval.json"):
        run = tmp_path / name.split(".")[0]
        run.mkdir()
        (run / name).write_bytes(data)
        with pytest.raises(ValueError):
            results.load_run(str(run))
    # the sweep's own records: an unreadable file means "not done", never code
    run = tmp_path / "sweep_run"
    run.mkdir()
    for name in (Workdir.METRICS, Workdir.EVALUATION, Workdir.SWEEP_RUN):
        (run / name).write_bytes(data)
    assert not sweeps.is_trained(str(run), 1)
    assert not sweeps.is_evaluated(str(run), 1)
    with pytest.raises(ValueError, match="is not valid JSON"):
        sweeps.train_and_evaluate(str(run))
    assert not os.path.exists(marker)


def test_omniglot_cache_with_a_pickle_payload_is_rejected(tmp_path, payload):
    _, marker = payload
    path, cache_dir = str(tmp_path / "omniglot"), tmp_path / "cache"
    cache_dir.mkdir()
    # the cache file load_omniglot(path, cache_dir=...) looks for (its key's digest)
    archives = ("images_background_small1", "images_background_small2")
    key = ("zip", os.path.abspath(path), archives, 28, True)
    digest = hashlib.sha256(repr(key).encode()).hexdigest()[:16]
    buffer = io.BytesIO()
    np.savez(buffer, images=np.zeros([1, 28, 28, 1], np.float32), labels=np.zeros([1], int),
             class_names=np.array([_Payload(marker)], dtype=object),
             groups=np.array(["a"]))
    cache_file = cache_dir / f"omniglot_{digest}_all.npz"
    cache_file.write_bytes(buffer.getvalue())
    with pytest.raises(ValueError, match="not a cache of plain arrays") as info:
        load_omniglot(path, cache_dir=str(cache_dir))
    assert str(cache_file) in str(info.value)
    assert not os.path.exists(marker)


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_plain_pickle_reader_never_runs_a_payload(tmp_path, payload, protocol):
    _, marker = payload
    crafted = {
        "whole file": _Payload(marker),
        "a value": {"image_data": np.zeros([1, 2, 2, 3], np.uint8),
                    "class_dict": {"n01": [0]}, "extra": _Payload(marker)},
        "a key": {(_Payload(marker),): 1},
        "in a list": [np.zeros(2), [1, "a", _Payload(marker)]],
        "an object array": np.array([_Payload(marker), 1], dtype=object),
    }
    for where, value in crafted.items():
        with pytest.raises(plain_pickle.UnsafePickleError, match="not plain data") as info:
            plain_pickle.loads(pickle.dumps(value, protocol=protocol))
        assert "_write_marker" in str(info.value) or "builtins.object" in str(info.value) \
            or "object arrays" in str(info.value), (where, str(info.value))
    # plain data at the same protocol is read back as written
    plain = {"image_data": np.arange(24, dtype=np.uint8).reshape(1, 2, 4, 3),
             "class_dict": {"n01": [0], "n02": []}, "name": "x", "raw": b"\x00\xff"}
    back = plain_pickle.loads(pickle.dumps(plain, protocol=protocol))
    np.testing.assert_array_equal(back["image_data"], plain["image_data"])
    assert back["class_dict"] == plain["class_dict"] and back["raw"] == plain["raw"]
    assert not os.path.exists(marker)


def test_benchmark_caches_with_a_pickle_payload_are_rejected(tmp_path, payload):
    _, marker = payload
    mini = tmp_path / "mini"
    mini.mkdir()
    for split in ("train", "val", "test"):
        cache = {"image_data": np.zeros([1, 84, 84, 3], np.uint8),
                 "class_dict": {"n01": _Payload(marker)}}
        (mini / f"mini-imagenet-cache-{split}.pkl").write_bytes(pickle.dumps(cache))
    clear_caches()
    with pytest.raises(ValueError, match="mini-ImageNet cache file .* is not a pickle of "
                                         "plain data: it refers to") as info:
        load_mini_imagenet(str(mini), source="pickle")
    assert str(mini / "mini-imagenet-cache-train.pkl") in str(info.value)
    tiered = tmp_path / "tiered"
    tiered.mkdir()
    for split in ("train", "val", "test"):
        (tiered / f"{split}_labels.pkl").write_bytes(pickle.dumps(
            {"label_specific": np.zeros(1, np.int64), "label_general": _Payload(marker),
             "label_specific_str": ["n01"], "label_general_str": ["c"]}, protocol=2))
        (tiered / f"{split}_images_png.pkl").write_bytes(pickle.dumps([_Payload(marker)]))
    clear_caches()
    with pytest.raises(ValueError, match="tiered-ImageNet labels file .* is not a pickle of "
                                         "plain data") as info:
        load_tiered_imagenet(str(tiered))
    assert str(tiered / "train_labels.pkl") in str(info.value)
    (tiered / "train_labels.pkl").write_bytes(pickle.dumps(
        {"label_specific": np.zeros(1, np.int64), "label_general": np.zeros(1, np.int64),
         "label_specific_str": ["n01"], "label_general_str": ["c"]}, protocol=2))
    with pytest.raises(ValueError, match="tiered-ImageNet images file .* is not a pickle of "
                                         "plain data") as info:
        load_tiered_imagenet(str(tiered))
    assert str(tiered / "train_images_png.pkl") in str(info.value)
    assert not os.path.exists(marker)


def test_benchmark_array_cache_with_a_pickle_payload_is_rejected(tmp_path, payload):
    from metalearn.tasks.datasets import base
    _, marker = payload
    key = ("some", "key")

    def build():
        data = base.LabelledImages(np.zeros([2, 4, 4, 3], np.uint8), np.array([0, 1]),
                                   ("a", "b"))
        return {s: data for s in base.SPLIT_NAMES}

    base.cached_splits(str(tmp_path), "mini_imagenet", key, build)
    file = sorted(tmp_path.glob("mini_imagenet_*_train.npz"))[0]
    buffer = io.BytesIO()
    np.savez(buffer, images=np.zeros([2, 4, 4, 3], np.uint8), labels=np.array([0, 1]),
             class_names=np.array([_Payload(marker), "b"], dtype=object),
             groups=np.array(["", ""]), has_groups=np.array(False),
             preprocessing=np.array("{}"))
    file.write_bytes(buffer.getvalue())
    with pytest.raises(ValueError, match="not a cache of plain arrays") as info:
        base.cached_splits(str(tmp_path), "mini_imagenet", key, build)
    assert str(file) in str(info.value)
    assert not os.path.exists(marker)
