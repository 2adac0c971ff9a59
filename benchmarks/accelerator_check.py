r"""The prepared accelerator check: one run on a machine with GPUs, one JSON file.

    python -m benchmarks.accelerator_check --check_output=accelerator_check.json  # <= 10 min

On a machine with GPUs it runs, each part with its own time limit inside ``--budget_s``:

1. ``tests/training/distribute_test.py`` and ``tests/training/mixed_precision_test.py``
   under pytest, with the GPUs visible (ops without an explicit device are placed on
   ``/gpu:0``), and records pytest's summary line and exit status;
2. the meta-step benchmark (:mod:`benchmarks.meta_step`: the Omniglot conv step, B = 32,
   one inner step, second order, no XLA) for every formulation (``map_fn``,
   ``unrolled``, ``batched``, ``accumulate``, ``auto``), in float32 and
   ``mixed_float16``, on one GPU and on all GPUs (``MirroredStrategy``): time
   (min / median / max), peak host memory, and what ``auto`` chose.

Without a GPU it runs neither part and says so in the JSON (``"skipped"``) and on
stdout: that is how it is tested on CPU (``tests/accelerator_check_test.py``). Each
configuration whose turn comes after the budget is spent is recorded as not run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Dict, List

from absl import app, flags

from benchmarks.meta_step import measure

flags.DEFINE_string("check_output", "accelerator_check.json", "Where the JSON file goes.")
flags.DEFINE_integer("budget_s", 570, "Seconds for the whole check (the last part is "
                     "cut short, its configurations recorded as not run).")
FLAGS = flags.FLAGS  # --steps (timed meta-steps per configuration) is meta_step's flag

FORMULATIONS = ("map_fn", "unrolled", "batched", "accumulate", "auto")
POLICIES = ("float32", "mixed_float16")
TESTS = ("tests/training/distribute_test.py", "tests/training/mixed_precision_test.py")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def gpu_count() -> int:
    """GPUs TensorFlow sees, asked in a fresh process (so this one never starts TF)."""
    out = subprocess.run(
        [sys.executable, "-c", "import tensorflow as tf; "
         "print('GPUS', len(tf.config.list_physical_devices('GPU')))"],
        capture_output=True, text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    lines = [l for l in out.stdout.splitlines() if l.startswith("GPUS ")]
    return int(lines[-1].split()[1]) if lines else 0


def run_tests(timeout: float) -> Dict:
    """The distribution and mixed-precision tests, with the GPUs visible."""
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *TESTS]
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                             cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))
    except subprocess.TimeoutExpired:
        return {"files": list(TESTS), "error": f"timed out after {timeout:.0f} s"}
    lines = out.stdout.strip().splitlines()
    return {"files": list(TESTS), "returncode": out.returncode,
            "summary": lines[-1] if lines else out.stderr.strip()[-500:]}


def benchmark_configs(gpus: int) -> List[Dict]:
    replicas = [1, "all"] if gpus > 1 else [1]
    return [dict(meta_batch=32, inner_steps=1, order="second", formulation=f, xla=False,
                 policy=p, intra_op=0, inter_op=0, onednn="default", replicas=r,
                 parallel_iterations=2, memory_budget="")
            for r in replicas for p in POLICIES for f in FORMULATIONS]


def check(budget_s: float, steps: int) -> Dict:
    """The whole check; returns what is written to the JSON file."""
    start = time.monotonic()
    gpus = gpu_count()
    report: Dict = {"gpus": gpus, "python": sys.version.split()[0]}
    if gpus == 0:
        report["skipped"] = {"tests": "no GPU visible", "benchmark": "no GPU visible"}
        return report
    report["tests"] = run_tests(timeout=budget_s * 0.4)
    results = []
    for config in benchmark_configs(gpus):
        left = budget_s - (time.monotonic() - start)
        if left < 20:
            results.append(dict(config, error="not run: the check's time budget was spent"))
            continue
        results.append(measure(config, steps=steps, warmup=2, timeout=left))
    report["benchmark"] = results
    report["seconds"] = round(time.monotonic() - start, 1)
    return report


def main(argv) -> None:
    del argv
    from metalearn.runs.files import write_json_results  # here: the children measure imports
    report = check(FLAGS.budget_s, FLAGS.steps)
    # results first, then the file: a failed write names it, and nothing is lost
    write_json_results(FLAGS.check_output, report, json.dumps(report), "accelerator check")
    if "skipped" in report:
        print(f"accelerator check skipped: no GPU visible (wrote {FLAGS.check_output})")
    else:
        print(f"accelerator check: {report['gpus']} GPUs, tests: "
              f"{report['tests'].get('summary', report['tests'].get('error'))}; "
              f"{len(report['benchmark'])} benchmark rows in {FLAGS.check_output}")


if __name__ == "__main__":
    app.run(main)
