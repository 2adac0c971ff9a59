"""benchmarks/wall_time.py, what the equal-budget benchmarks share: the seeds' workdirs
and bindings that run_main hands each run, and the tables over seeds (means, the
intervals over episodes and across seeds, per-seed rows, paired rows) against numpy on
hand-made evaluation files."""

import json
import os
import types

import numpy as np
import pytest

from benchmarks import wall_time
from metalearn.statistics import paired_difference, t_quantile_975


def write_eval(out, name, seed, values, digest="d0", steps=100):
    folder = wall_time.seed_workdir(str(out), name, seed)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "eval.json"), "w") as f:
        json.dump({"episodes": digest, "checkpoint_step": steps,
                   "per_task": {"0": {"mse": list(values)}, "3": {"mse": list(values + 1)}}},
                  f)


def test_run_main_trains_every_method_at_every_seed(tmp_path):
    calls = []
    flags = types.SimpleNamespace(sampler_rate=False, methods=["a", "b"], seeds=["1", "0"],
                                  analyse_only=False, out=str(tmp_path), seconds=7,
                                  budget="cpu")
    wall_time.run_main(flags, ("a", "b", "c"), lambda *args: calls.append(args),
                       lambda out, seeds: f"seeds {seeds}", lambda: "")
    assert [c[0] for c in calls] == ["a", "b", "a", "b"]
    assert [c[4] for c in calls] == [["Runtime.seed = 1"]] * 2 + [["Runtime.seed = 0"]] * 2
    assert calls[0][1] == os.path.join(str(tmp_path), "a", "seed1")
    with pytest.raises(ValueError, match=r"unknown \['d'\]; the methods are"):
        wall_time.run_main(types.SimpleNamespace(**{**vars(flags), "methods": ["d"]}),
                           ("a", "b"), None, None, None)
    for seeds, message in ((["0", "x"], "integers, got 'x'"), (["1", "1"], "repeats 1"),
                           ([], "empty")):
        with pytest.raises(ValueError, match=message):
            wall_time.parse_seeds(seeds)


def test_tables_over_seeds_against_numpy(tmp_path):
    rng = np.random.default_rng(0)
    a = rng.normal(1.0, 0.3, size=(2, 50))  # [seeds, episodes]
    b = rng.normal(1.2, 0.3, size=(2, 50))
    for seed in (0, 1):
        write_eval(tmp_path, "a", seed, a[seed], steps=100 + seed)
        write_eval(tmp_path, "b", seed, b[seed])
    measured = wall_time.read_measured(str(tmp_path), "a", [0, 1, 2], "eval.json", ["mse"])
    assert measured.seeds == [0, 1] and measured.steps == [100, 101]  # seed 2: not run
    np.testing.assert_array_equal(measured.values["mse"], a + 1)  # the most inner steps
    episodes, seeds = wall_time.method_cells(measured, "mse")
    pooled = (a + 1).mean(0)
    assert episodes == f"{pooled.mean():.3f} ± {1.96 * pooled.std(ddof=1) / np.sqrt(50):.3f}"
    means = (a + 1).mean(1)
    half = t_quantile_975(1) * means.std(ddof=1) / np.sqrt(2)
    assert seeds == f"{means.mean():.3f} ± {half:.3f}"
    one = wall_time.read_measured(str(tmp_path), "a", [0], "eval.json", ["mse"], "0")
    assert wall_time.method_cells(one, "mse")[1] == "—"  # no spread from one seed

    entries = {(name, "5"): wall_time.read_measured(str(tmp_path), name, [0, 1], "eval.json",
                                                    ["mse"], "0") for name in "ab"}
    lines = wall_time.paired_table(entries, [("a", "b")], ["5"], lambda n: "mse", "MSE",
                                   "shots", lower_is_better=True)
    d = paired_difference(a.mean(0), b.mean(0))
    cells = [c.strip() for c in lines[2].split("|")[1:-1]]
    assert cells[:5] == ["a − b", "5", "2", f"{d['difference']:.3f}",
                         f"[{d['low']:.3f}, {d['high']:.3f}]"]
    assert cells[6] == f"{int((a.mean(0) < b.mean(0)).sum())} / " \
                       f"{int((a.mean(0) > b.mean(0)).sum())}"
    assert cells[7] == f"{int((a.mean(1) < b.mean(1)).sum())} / " \
                       f"{int((a.mean(1) > b.mean(1)).sum())}"
    rows = wall_time.per_seed_table([("a", "5", entries["a", "5"], ("mse", None))],
                                    ("MSE", "NLL"), "shots")
    assert len(rows) == 4 and rows[3].startswith("| a | 1 | 101 | 5 | ") and \
        rows[3].endswith(" | none |")

    write_eval(tmp_path, "c", 0, a[0], digest="other")
    entries["c", "5"] = wall_time.read_measured(str(tmp_path), "c", [0], "eval.json", ["mse"])
    with pytest.raises(ValueError, match="c and a were evaluated on other episodes"):
        wall_time.paired_table(entries, [("c", "a")], ["5"], lambda n: "mse", "MSE", "shots",
                               lower_is_better=True)
    write_eval(tmp_path, "a", 2, a[0], digest="other")
    with pytest.raises(ValueError, match="other test episodes than a's seed 0"):
        wall_time.read_measured(str(tmp_path), "a", [0, 1, 2], "eval.json", ["mse"])
