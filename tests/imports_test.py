"""The process baseline: starting training imports nothing heavy of its own.

TensorFlow itself (through its bundled Keras) already imports matplotlib, scipy, h5py
and PIL when they are installed (benchmarks/README.md, "The process baseline"); what
metalearn adds on top must be only gin and its own modules, and never TFDS or Ray,
which only some loaders and the sweep's Ray path need (imported where they are used).
"""

import json
import os
import subprocess
import sys

HEAVY = ("tensorflow_datasets", "matplotlib", "scipy", "h5py", "PIL", "pandas", "ray",
         "sklearn", "jax", "torch")

_SCRIPT = """
import json, sys
import tensorflow
after_tf = set(sys.modules)
import metalearn.train
added = {m.split('.')[0] for m in set(sys.modules) - after_tf}
print(json.dumps({"added": sorted(added),
                  "present": sorted(m for m in %r if m in sys.modules)}))
""" % (HEAVY,)


def _run(script: str) -> subprocess.CompletedProcess:
    """``script`` in a fresh Python process at the repository root."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
               PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, cwd=root, check=True)


def test_importing_metalearn_train_adds_only_gin_and_metalearn():
    out = _run(_SCRIPT)
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(found["added"]) <= {"gin", "metalearn"}, found
    assert "tensorflow_datasets" not in found["present"], found
    assert "ray" not in found["present"], found


_THREADS = """
import tensorflow as tf
from metalearn.training import build_experiment, parse_config
parse_config(["experiments/sinusoid/maml.gin"], ["Runtime.threads = (1, 1)"])
build_experiment()
print("THREADS", tf.config.threading.get_intra_op_parallelism_threads(),
      tf.config.threading.get_inter_op_parallelism_threads())
"""


def test_experiment_threads_sizes_the_pools_before_the_runtime_starts():
    out = _run(_THREADS)
    assert "THREADS 1 1" in out.stdout, out.stdout + out.stderr[-2000:]
