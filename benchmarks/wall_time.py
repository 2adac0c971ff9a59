"""What the equal-wall-time benchmarks (benchmarks/neural_processes.py,
benchmarks/in_context.py) share: training a gin file for a wall time, evaluating it,
a sampler's streaming rate, and their entry point. Defines no flags."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from typing import Callable, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


BUDGETS = ("wall", "cpu")


def train_and_evaluate(gin_file: str, workdir: str, seconds: int, log_every: int,
                       evaluations: Sequence[Sequence[str]], budget: str = "wall",
                       params: Sequence[str] = ()) -> None:
    """``python -m metalearn.train`` on ``gin_file`` (plus the gin bindings ``params``)
    for ``seconds``, then one ``python -m metalearn.evaluate`` per entry of
    ``evaluations`` (its extra flags).

    ``budget="wall"``: stopped with SIGTERM after ``seconds`` of wall time.
    ``budget="cpu"``: after ``seconds`` of the process's CPU time (a soft
    ``RLIMIT_CPU``: SIGXCPU), which other jobs on a shared machine do not shrink. Either
    way the step under way finishes and is checkpointed, and the process's own start-up
    (imports, tracing) counts."""
    if budget not in BUDGETS:
        raise ValueError(f"budget must be one of {BUDGETS}, got {budget!r}")
    env = dict(os.environ, PYTHONPATH=ROOT)
    command = [sys.executable, "-m", "metalearn.train", f"--gin_file={gin_file}",
               f"--workdir={workdir}", "--gin_param=Loop.num_steps=1000000",
               f"--gin_param=Loop.log_every={log_every}",
               "--gin_param=Loop.checkpoint_every=1000000",
               *[f"--gin_param={p}" for p in params]]
    if budget == "wall":
        subprocess.run(["timeout", "-s", "TERM", str(seconds), *command], cwd=ROOT, env=env)
    else:
        limit = (seconds, seconds + 600)  # the hard limit: room for the last step
        subprocess.run(command, cwd=ROOT, env=env, preexec_fn=lambda: resource.setrlimit(
            resource.RLIMIT_CPU, limit))
    for flags in evaluations:
        subprocess.run([sys.executable, "-m", "metalearn.evaluate", f"--workdir={workdir}",
                        *flags], cwd=ROOT, env=env, check=True)


def stream_rate(sampler, batches: int = 400, batch: int = 25) -> float:
    """Episodes per second that ``sampler.dataset(batch)`` streams, iterated as the
    training loop iterates it (after 20 warm-up batches)."""
    stream = iter(sampler.dataset(batch, seed=0))
    for _ in range(20):  # warm up the pipeline
        next(stream)
    start = time.perf_counter()
    for _ in range(batches):
        next(stream)
    return batches * batch / (time.perf_counter() - start)


def run_main(flags, run: Callable[[str, int, str], None], analyse: Callable[[str], str],
             sampler_rate: Callable[[], str]) -> None:
    """The benchmarks' ``main``: the sampler rate (``--sampler_rate``), or each of
    ``--methods`` trained (unless ``--analyse_only``) and the tables printed."""
    if flags.sampler_rate:
        print(sampler_rate())
        return
    if not flags.analyse_only:
        os.makedirs(flags.out, exist_ok=True)
        for name in flags.methods:
            run(name, flags.seconds, flags.out)
    print(analyse(flags.out))
