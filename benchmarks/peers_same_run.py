r"""metalearn against PyTorch and JAX in the same run: per configuration, R rounds of
every runner, each in a fresh process, then a markdown summary.

    python -m benchmarks.peers_same_run --python=/work/peers_venv/bin/python \
        --meta_batch=8,32 --inner_steps=1,5 --order=second --rounds=3 --steps=10 \
        --warmup=2 --output=peers.jsonl --summary=peers.md
    python -m benchmarks.peers_same_run --summarize=peers.jsonl     # the tables again

Run it with the TensorFlow environment's interpreter: the metalearn rows are
``python -m benchmarks.meta_step --child`` of this interpreter (``--formulation``:
``accumulate`` and ``map_fn`` by default, ``xla`` false, TensorFlow's default threads),
the peers' rows ``python -m benchmarks.peers --child`` of ``--python``
(``--framework``: pytorch, jax, jax_vmap; benchmarks/peers.py says what each does).
A runner may end in ``:N`` for N threads: ``pytorch:1`` is ``torch.set_num_threads(1)``,
``accumulate:1`` TensorFlow's intra-op and inter-op pools of 1 (JAX's cannot be set).
On shared cores PyTorch's default OpenMP pool (one thread per core) can be many times
slower than one thread (its threads wait for each other at every op while other jobs hold
the cores); on idle cores the default is the one to compare.
Within a configuration a round runs every runner once, the order rotated by one each
round, so a slow spell of shared cores does not always hit the same runner. Every JSON
line (meta_step's or peers' fields plus ``runner``, ``round`` and ``loadavg``, the
1-minute load average before the run) is printed and appended to ``--output``.

The summary takes, per configuration and runner, the median over rounds of each field:
``ms_median``, ``cpu_ms_median``, ``compile_s``, and memory as ``peak`` = the larger of
``peak_rss_mib`` and ``first_call_peak_mib`` (``peak_rss_mib`` is ``ru_maxrss`` read after
the peak was reset past the first call, so on Linux it misses a first-call peak unless a
thread exited since), ``step adds`` = peak minus ``before_step_rss_mib``, and
``steady_peak_mib`` (the later steps' own). The ratios: ``best peer / metalearn`` of the
median step times (above 1: metalearn faster) and ``metalearn / pytorch`` of the peaks
and of the step's own memory (above 1: metalearn uses more).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time
from typing import Dict, List, Optional

from benchmarks import peers

METALEARN = "metalearn"


def runners(formulations: List[str], frameworks: List[str]) -> List[str]:
    return [f"{METALEARN} {f}" for f in formulations] + list(frameworks)


def split_threads(runner: str):
    """``"pytorch:1"`` -> ``("pytorch", 1)``; no suffix: 0 (the framework's default)."""
    name, _, threads = runner.partition(":")
    return name, int(threads or 0)


def metalearn_config(meta_batch: int, inner_steps: int, order: str,
                     formulation: str) -> dict:
    """A configuration as benchmarks.meta_step's ``_configs`` gives it."""
    return dict(meta_batch=meta_batch, inner_steps=inner_steps, order=order,
                formulation=formulation, xla=False, policy="float32", intra_op=0,
                inter_op=0, onednn="default", replicas=1, parallel_iterations=2,
                memory_budget="")


def run(runner: str, meta_batch: int, inner_steps: int, order: str, steps: int,
        warmup: int, timeout: float, python: str) -> dict:
    """One runner on one configuration, in a fresh process."""
    name, threads = split_threads(runner)
    if name.startswith(METALEARN + " "):
        from benchmarks import meta_step  # absl: the TensorFlow environment has it
        config = metalearn_config(meta_batch, inner_steps, order, name.split(" ", 1)[1])
        config.update(intra_op=threads, inter_op=threads)
        result = meta_step.measure(config, steps, warmup, timeout)
        result["framework"] = METALEARN
    else:
        config = dict(framework=name, meta_batch=meta_batch, inner_steps=inner_steps,
                      order=order, threads=threads)
        result = peers.measure(config, steps, warmup, timeout, python)
    result["runner"] = runner
    return result


# --- the summary -------------------------------------------------------------------

def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _peak(row: dict) -> float:
    return max(row["peak_rss_mib"], row.get("first_call_peak_mib") or 0)


def _fmt(value, digits: int = 1) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def summarize(rows: List[dict]) -> str:
    """The markdown tables of a run's JSON lines (see the module's docstring)."""
    keys, names = [], []
    for row in rows:
        key = (row["meta_batch"], row["inner_steps"], row["order"])
        if key not in keys:
            keys.append(key)
        if row["runner"] not in names:
            names.append(row["runner"])
    stats: Dict[tuple, dict] = {}
    lines = ["| B | S | order | runner | rounds ok | ms median | round medians min-max | "
             "CPU ms | compile s | peak MiB | step adds MiB | steady peak MiB |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for key in keys:
        for name in names:
            mine = [r for r in rows if (r["meta_batch"], r["inner_steps"], r["order"]) == key
                    and r["runner"] == name]
            if not mine:
                continue
            ok = [r for r in mine if "ms_median" in r]
            errors = sorted({r["error"] for r in mine if "error" in r})
            s = dict(ms=_median([r["ms_median"] for r in ok]),
                     cpu=_median([r["cpu_ms_median"] for r in ok]),
                     compile=_median([r["compile_s"] for r in ok]),
                     peak=_median([_peak(r) for r in ok]),
                     step=_median([_peak(r) - r["before_step_rss_mib"] for r in ok]),
                     steady=_median([r.get("steady_peak_mib") for r in ok]))
            stats[key + (name,)] = s
            spread = (f"{_fmt(min(r['ms_median'] for r in ok))} - "
                      f"{_fmt(max(r['ms_median'] for r in ok))}") if ok else "-"
            note = f" ({'; '.join(errors)})" if errors else ""
            lines.append(
                f"| {key[0]} | {key[1]} | {key[2]} | {name} | {len(ok)}/{len(mine)}{note} | "
                f"{_fmt(s['ms'])} | {spread} | {_fmt(s['cpu'])} | {_fmt(s['compile'], 2)} | "
                f"{_fmt(s['peak'], 0)} | {_fmt(s['step'], 0)} | {_fmt(s['steady'], 0)} |")
    lines += ["", "| B | S | order | metalearn | ms | best peer | its ms | best peer / "
              "metalearn (speed) | metalearn / pytorch peak | metalearn / pytorch step adds |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    ratio = lambda a, b: f"{a / b:.2f}" if a is not None and b else "-"
    for key in keys:
        found = [(name, stats[key + (name,)]) for name in names if key + (name,) in stats]
        peer_rows = [(n, s) for n, s in found if not n.startswith(METALEARN)
                     and s["ms"] is not None]
        best = min(peer_rows, key=lambda ns: ns[1]["ms"]) if peer_rows else (None, None)
        torch_names = [n for n, _ in found if split_threads(n)[0] == "pytorch"]
        torch_stats = stats[key + ("pytorch" if "pytorch" in torch_names else
                                   torch_names[0],)] if torch_names else {}
        for name, s in found:
            if not name.startswith(METALEARN):
                continue
            lines.append(
                f"| {key[0]} | {key[1]} | {key[2]} | {name.split(' ', 1)[1]} | "
                f"{_fmt(s['ms'])} | {best[0] or '-'} | "
                f"{_fmt(best[1]['ms']) if best[1] else '-'} | "
                f"{ratio(best[1]['ms'] if best[1] else None, s['ms'])} | "
                f"{ratio(s['peak'], torch_stats.get('peak'))} | "
                f"{ratio(s['step'], torch_stats.get('step'))} |")
    versions = {}
    for row in rows:
        for k, v in (row.get("versions") or {}).items():
            versions.setdefault(k, v)
    loads = [r["loadavg"] for r in rows if "loadavg" in r]
    footer = [""]
    if versions:
        footer.append("Peers: " + ", ".join(f"{k} {v}" for k, v in sorted(versions.items()))
                      + "; Adam: " + ", ".join(sorted({r["adam"] for r in rows
                                                       if "adam" in r})) + ".")
    if loads:
        footer.append(f"1-minute load average before each run: {min(loads):.2f} - "
                      f"{max(loads):.2f} (median {statistics.median(loads):.2f}).")
    return "\n".join(lines + footer) + "\n"


def _read(paths: List[str]) -> List[dict]:
    rows = []
    for path in paths:
        with open(path) as f:
            rows += [json.loads(line) for line in f if line.strip()]
    return rows


def _list(text: str) -> List[str]:
    return [t for t in text.split(",") if t]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.peers_same_run",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--meta_batch", type=_list, default=["8", "32"])
    p.add_argument("--inner_steps", type=_list, default=["1", "5"])
    p.add_argument("--order", type=_list, default=["second"])
    p.add_argument("--formulation", type=_list, default=["accumulate", "map_fn"],
                   help="metalearn's formulations (benchmarks.meta_step's names)")
    p.add_argument("--framework", type=_list, default=list(peers.FRAMEWORKS))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    p.add_argument("--python", default="/work/peers_venv/bin/python",
                   help="the peers' interpreter")
    p.add_argument("--output", default="", help="append the JSON lines here")
    p.add_argument("--summary", default="", help="write the markdown summary here")
    p.add_argument("--summarize", type=_list, default=[],
                   help="only summarize these JSONL files")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    args = parser().parse_args(argv)
    if args.summarize:
        text = summarize(_read(args.summarize))
    else:
        names, rows = runners(args.formulation, args.framework), []
        started = time.strftime("%Y-%m-%d %H:%M:%S")
        for batch, steps, order in itertools.product(args.meta_batch, args.inner_steps,
                                                     args.order):
            for round_ in range(args.rounds):
                shift = round_ % len(names)
                for name in names[shift:] + names[:shift]:
                    loadavg = round(os.getloadavg()[0], 2)
                    result = run(name, int(batch), int(steps), order, args.steps,
                                 args.warmup, args.timeout, args.python)
                    result.update(round=round_, loadavg=loadavg)
                    rows.append(result)
                    line = json.dumps(result)
                    print(line, flush=True)
                    if args.output:
                        with open(args.output, "a") as f:
                            f.write(line + "\n")
        text = (f"Same run, started {started}: `python -m benchmarks.peers_same_run "
                f"{' '.join(argv if argv is not None else sys.argv[1:])}`\n\n"
                + summarize(rows))
    print(text, end="")
    if args.summary:
        with open(args.summary, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
