"""The prepared accelerator check (benchmarks/accelerator_check.py): on a machine without
a GPU it runs nothing and says so; its configurations cover every formulation, both
precisions and, with several GPUs, all of them."""

import json
import os
import sys

import pytest
import tensorflow as tf
from tests import forked

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _configs(gpus):
    """benchmark_configs(gpus) from a fresh process: the benchmark modules define absl
    flags (--output) that would clash with metalearn.evaluate's in the test process."""
    code = ("import json; from benchmarks import accelerator_check as a; "
            f"print(json.dumps(a.benchmark_configs(gpus={gpus})))")
    out = forked.run([sys.executable, "-c", code], capture_output=True, text=True,
                     cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_configurations_cover_formulations_precisions_and_replicas():
    configs = _configs(4)
    assert {c["formulation"] for c in configs} == {"map_fn", "unrolled", "batched",
                                                   "accumulate", "auto"}
    assert {c["policy"] for c in configs} == {"float32", "mixed_float16"}
    assert {c["replicas"] for c in configs} == {1, "all"}
    assert {c["replicas"] for c in _configs(1)} == {1}


@pytest.mark.skipif(bool(tf.config.list_physical_devices("GPU")), reason="a GPU is visible: the "
                    "check would run for minutes")
def test_without_a_gpu_the_check_is_skipped_and_says_so(tmp_path):
    output = tmp_path / "check.json"
    out = forked.run([sys.executable, "-m", "benchmarks.accelerator_check",
                     f"--check_output={output}"], capture_output=True, text=True,
                     cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), check=True)
    assert "skipped: no GPU" in out.stdout
    report = json.loads(output.read_text())
    assert report["gpus"] == 0
    assert report["skipped"] == {"tests": "no GPU visible", "benchmark": "no GPU visible"}
