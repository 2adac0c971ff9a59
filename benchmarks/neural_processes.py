r"""CNP, attentive NP, NP (latent path), the in-context learner and MAML on sinusoid or
Gaussian-process regression at the same budget of CPU seconds.

    PYTHONPATH=. python benchmarks/neural_processes.py --setup=sinusoid --seconds=150 \
        --seeds=0,1,2 --out=runs/np_sinusoid
    PYTHONPATH=. python benchmarks/neural_processes.py --setup=gp --seconds=150 \
        --seeds=0,1,2 --out=runs/np_gp
    PYTHONPATH=. python benchmarks/neural_processes.py --out=runs/np_gp --seeds=0,1,2 --analyse_only
    PYTHONPATH=. python benchmarks/neural_processes.py --sampler_rate

Each of experiments/<setup>/{cnp,anp,np,in_context,maml}.gin (``--setup=sinusoid``:
experiments/sinusoid/, ``gp``: experiments/gaussian_process/; 10-shot training tasks)
is meta-trained by ``python -m metalearn.train`` at each of ``--seeds``
(``Runtime.seed``; workdir ``<out>/<method>/seed<seed>``) until it has used
``--seconds`` of CPU time (``--budget=cpu``, the default: a soft RLIMIT_CPU, which other
jobs on a shared machine do not shrink; ``--budget=wall``: SIGTERM after ``--seconds``
of wall time). Either way the step under way finishes and is checkpointed. Then
``python -m metalearn.evaluate`` evaluates it on the same 600 test tasks at 5 and 10
shots (the evaluation files' ``episodes`` digests agree). Prints markdown tables of the
query MSE (of the predictive mean for the neural processes and the in-context learner,
from the prior's mean z for the NP; after the most inner steps evaluated, 10, for MAML)
and NLL: the mean over the seeds with the 95% interval over the episodes and across
seeds (benchmarks/wall_time.py says which), the steps each run reached, per-seed rows
for several seeds, and paired differences on the same episodes against MAML and against
the CNP (``metalearn.statistics.paired_difference``).

With ``--bands`` (the default) it then draws the predictive band of one test task for
each method with a Gaussian prediction, from its first seed's run, into
``<out>/bands/<method>.png`` (``metalearn.report.plot_regression_adaptation``).

``--sampler_rate`` measures instead the episodes per second that the Gaussian-process
task prior (``metalearn.tasks.GaussianProcess``) streams through ``tf.data`` in batches
of 25, as the training loop iterates it, at 5 and 10 shots (against the meta-step's
consumption, the tasks/s the training logs print).
"""

from __future__ import annotations

from typing import List, Sequence

from absl import app, flags

from benchmarks.wall_time import (INTERVALS_NOTE, define_flags, method_cells, paired_table,
                                  parse_seeds, per_seed_table, read_measured, run_main,
                                  seed_workdir, steps_text, stream_rate, train_and_evaluate)

METHODS = ("cnp", "anp", "np", "in_context", "maml")
SETUPS = {"sinusoid": ("experiments/sinusoid", "Sinusoid"),
          "gp": ("experiments/gaussian_process", "GaussianProcess")}
"""``--setup``: the folder of its runnable files and its sampler's gin name."""
SHOTS = (5, 10)
PAIRS = (("cnp", "maml"), ("anp", "maml"), ("np", "maml"), ("in_context", "maml"),
         ("anp", "cnp"), ("np", "cnp"), ("in_context", "cnp"))
LABELS = {"cnp": "CNP", "anp": "ANP (deterministic)", "np": "NP (latent path)",
          "in_context": "in-context transformer", "maml": "MAML (most inner steps)"}

define_flags(150, "runs/np_wall", METHODS, "Measure the GP task prior's episodes/s.")
flags.DEFINE_enum("setup", "sinusoid", list(SETUPS), "The task prior: sinusoid or gp "
                  "(Gaussian-process curves).")
flags.DEFINE_bool("bands", True, "Draw the predictive band of each method with a Gaussian "
                  "prediction (its first seed's run) into <out>/bands/<method>.png "
                  "(needs matplotlib).")
FLAGS = flags.FLAGS

GAUSSIAN = ("cnp", "anp", "np", "in_context")
"""The methods whose prediction is a Gaussian (MAML's is a point)."""


def run(name: str, workdir: str, seconds: int, budget: str, params: Sequence[str]) -> None:
    folder, sampler = SETUPS[FLAGS.setup]
    train_and_evaluate(f"{folder}/{name}.gin", workdir, seconds, log_every=1000,
                       evaluations=[[f"--gin_param={sampler}.shots={shots}",
                                     f"--output=eval_{shots}shot.json"] for shots in SHOTS],
                       budget=budget, params=params)


def metrics(name: str):
    """``(MSE metric, NLL metric or None)`` of a method's evaluation."""
    if name == "maml":
        return "loss", None  # a point prediction: its loss is the MSE
    return "mse", "nll" if name == "np" else "loss"  # the NP's loss is the negative ELBO


def analyse(out: str, seeds: Sequence[int]) -> str:
    lines = ["| method | seeds | steps reached | shots | query MSE | MSE across seeds | "
             "query NLL | NLL across seeds |", "| --- " * 8 + "|"]
    entries, rows = {}, []
    for name in METHODS:
        mse, nll = metrics(name)
        for shots in SHOTS:
            measured = read_measured(out, name, seeds, f"eval_{shots}shot.json",
                                     [m for m in (mse, nll) if m])
            if measured is None:  # a method not run into this folder
                continue
            entries[name, str(shots)] = measured
            rows.append((LABELS[name], str(shots), measured, (mse, nll)))
            nll_cells = method_cells(measured, nll) if nll else \
                ("none (a point prediction)", "none")
            lines.append(f"| {LABELS[name]} | {len(measured.seeds)} | {steps_text(measured)} "
                         f"| {shots} | {' | '.join(method_cells(measured, mse))} | "
                         f"{' | '.join(nll_cells)} |")
    if any(len(m.seeds) > 1 for m in entries.values()):
        lines += [""] + per_seed_table(rows, ("query MSE", "query NLL"), "shots")
    lines += [""] + paired_table(entries, PAIRS, [str(s) for s in SHOTS],
                                 lambda name: metrics(name)[0], "MSE", "shots",
                                 lower_is_better=True)
    return "\n".join(lines + ["", INTERVALS_NOTE])


def bands(out: str, seeds: Sequence[int]) -> List[str]:
    """The predictive band of one test task (``report.plot_regression_adaptation``) of
    each Gaussian method's first seed run under ``out``: the files written."""
    import os

    from metalearn import report
    plt, written = report.pyplot(), []
    os.makedirs(os.path.join(out, "bands"), exist_ok=True)
    for name in GAUSSIAN:
        workdir = next((seed_workdir(out, name, s) for s in seeds
                        if os.path.isdir(os.path.join(seed_workdir(out, name, s),
                                                      "checkpoints"))), None)
        if workdir is None:
            continue
        path = os.path.join(out, "bands", f"{name}.png")
        if report.plot_regression_adaptation(plt, workdir, path):
            written.append(path)
    return written


def sampler_rate(batches: int = 400, batch: int = 25) -> str:
    from metalearn.tasks import GaussianProcess
    return "\n".join(f"GaussianProcess, {shots} shots + {shots} queries: "
                     f"{stream_rate(GaussianProcess(shots=shots), batches, batch):,.0f} "
                     "episodes/s" for shots in SHOTS)


def main(argv) -> None:
    del argv
    run_main(FLAGS, METHODS, run, analyse, sampler_rate)
    if FLAGS.bands and not FLAGS.sampler_rate:
        for path in bands(FLAGS.out, parse_seeds(FLAGS.seeds)):
            print(f"wrote {path}")


if __name__ == "__main__":
    app.run(main)
