"""How the process runs: seed, XLA, dtype policy, op determinism and thread pools,
applied before anything is built (:class:`Runtime`). Needs no learner."""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import gin
import keras
import numpy as np
import tensorflow as tf

def check_threads(threads: Optional[Sequence[int]]) -> Optional[Tuple[int, int]]:
    """``(intra_op, inter_op)`` thread-pool sizes as a tuple (``None`` stays ``None``).

    Raises:
      ValueError: not two whole numbers >= 0.
    """
    if threads is None:
        return None
    values = tuple(threads) if isinstance(threads, (list, tuple)) else (threads,)
    if len(values) != 2 or not all(isinstance(v, int) and not isinstance(v, bool)
                                   and v >= 0 for v in values):
        raise ValueError(f"Runtime.threads must be (intra_op, inter_op), two whole "
                         f"numbers >= 0 (0: one per core), got {threads!r}")
    return values


def set_threads(threads: Optional[Sequence[int]]) -> None:
    """Sizes TensorFlow's CPU thread pools: ``(intra_op, inter_op)`` threads (0: one per
    core, TensorFlow's default), or nothing for ``None``. Must run before TensorFlow's
    runtime starts (before any tensor, model or strategy is made).

    Raises:
      ValueError: not two whole numbers >= 0.
      RuntimeError: the runtime already started with other pool sizes.
    """
    values = check_threads(threads)
    if values is None:
        return
    current = (tf.config.threading.get_intra_op_parallelism_threads(),
               tf.config.threading.get_inter_op_parallelism_threads())
    if current == values:
        return
    try:
        tf.config.threading.set_intra_op_parallelism_threads(values[0])
        tf.config.threading.set_inter_op_parallelism_threads(values[1])
    except RuntimeError as error:
        raise RuntimeError(f"Runtime.threads={values}: TensorFlow's runtime already "
                           f"started with {current}; set the thread pools before any "
                           f"tensor, model or strategy is made ({error})") from error


def enable_determinism(seed: Optional[int] = None) -> None:
    """Turns on TensorFlow's op determinism (``tf.config.experimental.
    enable_op_determinism``: every op gives the same result for the same inputs, and
    ops without a deterministic kernel raise) and, if ``seed`` is given, seeds Python,
    NumPy, TensorFlow and Keras (``keras.utils.set_random_seed``). Process-wide, and
    cannot be turned off again in the same process."""
    if seed is not None:
        keras.utils.set_random_seed(int(seed))
    tf.config.experimental.enable_op_determinism()


@gin.configurable
class Runtime:
    """How the process runs a meta-training: applied (:meth:`apply`) before anything is
    built, so the same config gives the same weights.

    Args:
      seed: the run's seed: weight initialisation (Python, NumPy, TensorFlow and Keras
        generators are seeded from it) and the task streams.
      jit_compile: compile the meta-step with XLA.
      dtype_policy: the Keras dtype policy the model is built under, e.g.
        ``"mixed_bfloat16"`` (bfloat16 compute, float32 weights) or ``"mixed_float16"``
        (GPUs). Weights, losses, metrics and meta-gradients stay float32.
      deterministic: turn on TensorFlow's op determinism (:func:`enable_determinism`).
      threads: ``(intra_op, inter_op)`` sizes of TensorFlow's CPU thread pools
        (:func:`set_threads`; 0 is one per core); ``None`` leaves TensorFlow's defaults.
        ``(1, 1)`` took 20% less CPU time and ~30 MiB less memory per step on 2 shared
        cores (benchmarks/README.md, "Thread pools").
    """

    def __init__(self, seed: int = 0, jit_compile: bool = False,
                 dtype_policy: str = "float32", deterministic: bool = False,
                 threads: Optional[Sequence[int]] = None):
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"Runtime.seed must be an integer, got {seed!r} "
                            f"({type(seed).__name__})")
        self.seed = int(seed)
        self.jit_compile = bool(jit_compile)
        try:
            self.dtype_policy = keras.dtype_policies.get(dtype_policy).name
        except ValueError as error:
            raise ValueError(f"Runtime.dtype_policy: {error}") from error
        self.deterministic = bool(deterministic)
        self.threads = check_threads(threads)

    def apply_threads(self) -> None:
        """Sizes the thread pools (before anything starts TensorFlow's runtime)."""
        set_threads(self.threads)

    def apply(self) -> None:
        """Applies the runtime to the process: thread pools, seeds (and op determinism),
        the global dtype policy. Call it before the model is built."""
        self.apply_threads()
        if self.deterministic:
            enable_determinism(self.seed)
        else:
            keras.utils.set_random_seed(self.seed)
        keras.mixed_precision.set_global_policy(self.dtype_policy)

    def __repr__(self) -> str:
        return (f"Runtime(seed={self.seed}, jit_compile={self.jit_compile}, "
                f"dtype_policy={self.dtype_policy!r}, deterministic={self.deterministic}, "
                f"threads={self.threads})")

