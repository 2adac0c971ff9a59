r"""The in-context learner (with its Dense read-out and with a prototype head) against
Prototypical Networks and MAML on Omniglot, 5-way or 20-way 1-shot, at the same budget
of CPU seconds.

    PYTHONPATH=. python benchmarks/in_context.py --ways=5 --seconds=360 --seeds=0,1,2 --out=runs/icl_5way
    PYTHONPATH=. python benchmarks/in_context.py --ways=20 --seconds=600 --seeds=0,1,2 --out=runs/icl_20way
    PYTHONPATH=. python benchmarks/in_context.py --ways=5 --seeds=0,1,2 --out=runs/icl_5way --analyse_only
    PYTHONPATH=. python benchmarks/in_context.py --sampler_rate

Each of experiments/omniglot/minimal/<method>_<ways>way_1shot.gin (``in_context``,
``in_context_prototypes``: ``InContext.head = @PrototypeHead()``, ``protonets``,
``maml``; the minimal split, 1 query per class, Adam 1e-3; meta-batch 32 at 5 ways, 16
at 20 as MAML's 20-way file) is meta-trained by ``python -m metalearn.train`` at each
of ``--seeds`` (``Runtime.seed``; workdir ``<out>/<method>/seed<seed>``) until it has
used ``--seconds`` of CPU time (``--budget=cpu``, the default: a soft RLIMIT_CPU, which
other jobs on a shared machine do not shrink; ``--budget=wall``: SIGTERM after
``--seconds`` of wall time). Either way the step under way finishes and is
checkpointed. Then ``python -m metalearn.evaluate`` evaluates it on the same 600 test
episodes (the evaluation files' ``episodes`` digests must agree; MAML after the most
inner steps its file evaluates: 3 at 5 ways, 10 at 20). Prints the accuracies (the mean
over the seeds with the 95% interval over the episodes and across seeds;
benchmarks/wall_time.py says which), the steps each run reached, per-seed rows for
several seeds, and the paired difference on the same episodes of every pair of methods
(``metalearn.statistics.paired_difference``).

``--sampler_rate`` measures instead the episodes per second that the random task priors
(``metalearn.tasks.RandomMLPFunctions``, ``RandomLinearClassification``) stream through
``tf.data`` in batches of 25, as the training loop iterates them.
"""

from __future__ import annotations

import itertools
from typing import Sequence

from absl import app, flags

from benchmarks.wall_time import (INTERVALS_NOTE, define_flags, method_cells, paired_table,
                                  per_seed_table, read_measured, run_main, steps_text,
                                  stream_rate, train_and_evaluate)

METHODS = ("in_context", "in_context_prototypes", "protonets", "maml")
LABELS = {"in_context": "in-context transformer",
          "in_context_prototypes": "in-context, prototype head",
          "protonets": "Prototypical Networks", "maml": "MAML (most inner steps)"}
WAYS = (5, 20)

define_flags(360, "runs/icl_wall", METHODS, "Measure the random task priors' episodes/s.")
flags.DEFINE_enum("ways", "5", [str(w) for w in WAYS], "5-way or 20-way 1-shot.")
FLAGS = flags.FLAGS


def run(name: str, workdir: str, seconds: int, budget: str, params: Sequence[str]) -> None:
    ways = FLAGS.ways
    train_and_evaluate(f"experiments/omniglot/minimal/{name}_{ways}way_1shot.gin", workdir,
                       seconds, log_every=100, evaluations=[[f"--output=eval_{ways}way.json"]],
                       budget=budget, params=params)


def analyse(out: str, seeds: Sequence[int]) -> str:
    ways = FLAGS.ways
    lines = [f"| method | seeds | steps reached | ways | test accuracy (600 episodes) | "
             "across seeds |", "| --- " * 6 + "|"]
    entries, rows = {}, []
    for name in METHODS:
        measured = read_measured(out, name, seeds, f"eval_{ways}way.json", ["accuracy"])
        if measured is None:  # a method not run into this folder
            continue
        entries[name, ways] = measured
        rows.append((LABELS[name], ways, measured, ("accuracy",)))
        cells = method_cells(measured, "accuracy", scale=100, digits=1, unit="%")
        lines.append(f"| {LABELS[name]} | {len(measured.seeds)} | {steps_text(measured)} | "
                     f"{ways} | {' | '.join(cells)} |")
    if any(len(m.seeds) > 1 for m in entries.values()):
        lines += [""] + per_seed_table(rows, ("test accuracy",), "ways", scale=100,
                                       digits=1, unit="%")
    lines += [""] + paired_table(entries, list(itertools.combinations(METHODS, 2)), [ways],
                                 lambda name: "accuracy", "accuracy (points)", "ways",
                                 lower_is_better=False, scale=100, digits=1)
    return "\n".join(lines + ["", INTERVALS_NOTE])


def sampler_rate() -> str:
    from metalearn.tasks import RandomLinearClassification, RandomMLPFunctions
    samplers = {"RandomMLPFunctions(shots=10), 10 + 10 points, 1-32-32-1 tanh":
                RandomMLPFunctions(shots=10),
                "RandomLinearClassification(), 5-way 1-shot, 5 queries per class, dim 16":
                RandomLinearClassification()}
    return "\n".join(f"{name}: {stream_rate(sampler):,.0f} episodes/s"
                     for name, sampler in samplers.items())


def main(argv) -> None:
    del argv
    run_main(FLAGS, METHODS, run, analyse, sampler_rate)


if __name__ == "__main__":
    app.run(main)
