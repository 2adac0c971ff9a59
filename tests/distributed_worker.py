"""One worker of a MultiWorkerMirroredStrategy cluster, for
tests/training/distribute_test.py.

    python -m tests.distributed_worker OUT.npz   (TF_CONFIG set by the test)

Runs two outer steps on a fixed meta-batch split across the workers, and the chief
writes the all-reduced meta-gradient of the first step and the updated weights.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from metalearn.training import distribute  # noqa: E402
from tests import distributed_case  # noqa: E402


def main(out: str) -> None:
    strategy = distribute.make_strategy("multi_worker")
    gradients, weights = distributed_case.run(strategy)
    if distribute.is_chief(strategy):
        np.savez(out, *gradients, *weights)


if __name__ == "__main__":
    main(sys.argv[1])
