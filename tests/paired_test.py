"""Paired comparison of two runs on the same test episodes: the t-test by hand and
against SciPy, per-episode values kept by evaluate(), mismatched episodes refused."""

import json
import math
import os

import numpy as np
import pytest

from metalearn import report
from metalearn import statistics
from metalearn.studies import results
from metalearn.runs.files import write_json
from metalearn.training import build_experiment, evaluate, parse_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("t, dof", [(2.0, 10), (0.3, 3), (-4.5, 1), (1.96, 599),
                                    (12.0, 50), (0.0, 7)])
def test_t_p_values(t, dof):
    import scipy.stats as scipy_stats  # the independent reference (test extra)
    assert statistics.t_two_sided_p(t, dof) == pytest.approx(
        2 * scipy_stats.t.sf(abs(t), dof), rel=1e-9, abs=1e-15)


def test_paired_difference_by_hand():
    a = [0.8, 0.6, 1.0, 0.4, 0.6]
    b = [0.6, 0.6, 0.8, 0.2, 0.4]
    out = statistics.paired_difference(a, b)
    d = np.array(a) - np.array(b)  # 0.2, 0, 0.2, 0.2, 0.2
    sd = d.std(ddof=1)
    assert out["difference"] == pytest.approx(0.16)
    assert out["ci95"] == pytest.approx(2.776445105 * sd / math.sqrt(5))
    assert out["low"] == pytest.approx(0.16 - out["ci95"])
    t = 0.16 / (sd / math.sqrt(5))
    assert out["p_value"] == pytest.approx(statistics.t_two_sided_p(t, 4))
    assert (out["wins_a"], out["wins_b"], out["ties"], out["n"]) == (4, 0, 1, 5)
    import scipy.stats as scipy_stats  # the independent reference (test extra)
    assert out["p_value"] == pytest.approx(scipy_stats.ttest_rel(a, b).pvalue, rel=1e-9)
    same = statistics.paired_difference([0.5, 0.7], [0.5, 0.7])
    assert same["difference"] == 0.0 and same["p_value"] == 1.0
    with pytest.raises(ValueError, match="two equally long lists"):
        statistics.paired_difference([1, 2, 3], [1, 2])


def test_pairing_resolves_what_separate_intervals_cannot():
    rng = np.random.default_rng(0)
    difficulty = rng.uniform(0.2, 1.0, 600)          # shared by both methods
    a = np.clip(difficulty + rng.normal(0.02, 0.02, 600), 0, 1)
    b = np.clip(difficulty, 0, 1)
    separate = [statistics.seed_interval(v) for v in (a, b)]
    assert abs(separate[0]["mean"] - separate[1]["mean"]) < \
        separate[0]["ci95"] + separate[1]["ci95"]    # intervals overlap
    paired = statistics.paired_difference(a, b)
    assert paired["p_value"] < 1e-10 and paired["low"] > 0


def test_two_evaluations_on_the_same_episodes_compare_pair_by_pair(tmp_path):
    parse_config([os.path.join(ROOT, "experiments", "sinusoid", "maml.gin")])
    experiment = build_experiment()
    runs = {}
    for name, steps in (("zero_steps", 0), ("one_step", 1)):
        workdir = tmp_path / name
        workdir.mkdir()
        out = evaluate(experiment.learner, experiment.sampler, num_tasks=12, batch_size=4,
                       inner_steps=(steps,), seed=3)
        assert len(out["per_task"][str(steps)]["loss"]) == 12
        assert np.mean(out["per_task"][str(steps)]["loss"]) == pytest.approx(
            out["results"][str(steps)]["loss"]["mean"])
        write_json(str(workdir / "eval.json"), out)
        runs[name] = (str(workdir), out)
    compared = results.compare_runs(runs["zero_steps"][0], runs["one_step"][0], "loss")
    expected = statistics.paired_difference(runs["zero_steps"][1]["per_task"]["0"]["loss"],
                                         runs["one_step"][1]["per_task"]["1"]["loss"])
    for key, value in expected.items():
        assert compared[key] == pytest.approx(value)
    assert (compared["steps_a"], compared["steps_b"], compared["seed"]) == ("0", "1", 3)
    written = report.paired_report(runs["zero_steps"][0], runs["one_step"][0],
                                   str(tmp_path / "report"), metric="loss")
    assert "| loss |" in written["table"]
    with open(tmp_path / "report" / "paired.json") as f:
        assert json.load(f)["n"] == 12
    # another evaluation seed: other episodes, so no paired comparison
    other = tmp_path / "other_seed"
    other.mkdir()
    write_json(str(other / "eval.json"), evaluate(experiment.learner, experiment.sampler,
                                                  num_tasks=12, batch_size=4,
                                                  inner_steps=(1,), seed=4))
    with pytest.raises(ValueError, match="not the same test episodes: seed is 3 in"):
        results.compare_runs(runs["zero_steps"][0], str(other), "loss")
    # the same seed with another batch size draws other episodes: the digest says so
    write_json(str(other / "eval.json"), evaluate(experiment.learner, experiment.sampler,
                                                  num_tasks=12, batch_size=6,
                                                  inner_steps=(1,), seed=3))
    with pytest.raises(ValueError, match="not the same test episodes: episodes is"):
        results.compare_runs(runs["zero_steps"][0], str(other), "loss")
    with pytest.raises(ValueError, match="no per-episode 'accuracy' after 0 inner steps"):
        results.compare_runs(runs["zero_steps"][0], runs["one_step"][0], "accuracy")
    old = tmp_path / "old"
    old.mkdir()
    write_json(str(old / "eval.json"), {"results": {}})
    with pytest.raises(ValueError, match="has no per-episode values"):
        results.compare_runs(str(old), runs["one_step"][0])
