"""The learned optimizer's rule in files: a saved rule loads back exactly, a damaged rule
file is an error naming the file and what was expected, non-finite rule weights are
refused naming the file and the array, and a float64 model compiled with a trained
``LearnedRuleOptimizer`` comes back from its ``.keras`` file exactly."""

from __future__ import annotations

import os

import keras
import numpy as np
import pytest

from metalearn import models
from metalearn.adapters import LearnedRule, LearnedRuleOptimizer


# --- learned-rule files ---------------------------------------------------------------


def saved_rule(tmp_path, name="rule.npz"):
    from metalearn.adapters import LearnedRule
    rule = LearnedRule(0.05, hidden=(4,))
    rule.create("float32")
    path = tmp_path / name
    rule.save(str(path))
    return rule, path


def rewritten(tmp_path, change, name="bad.npz"):
    """A rule file whose members are a saved rule's, changed by ``change(members)``."""
    rule, path = saved_rule(tmp_path)
    with np.load(path, allow_pickle=False) as data:
        members = {k: data[k] for k in data.files}
    change(members)
    bad = tmp_path / name
    np.savez(bad, **members)
    return bad


def test_a_saved_rule_loads_back_exactly(tmp_path):
    from metalearn.adapters import LearnedRule
    rule, path = saved_rule(tmp_path)
    loaded = LearnedRule.load(str(path))
    assert loaded.config() == rule.config()
    for key, value in rule.values().items():
        np.testing.assert_array_equal(loaded.values()[key], value)


def _nan_weight(members):
    members["output_bias"] = members["output_bias"].copy()
    members["output_bias"][1] = np.nan


@pytest.mark.parametrize("damage, expected", [
    ("truncated", r"cannot be read \(BadZipFile: .*\); expected a .npz archive of "
                  r"'__config__'"),
    ("not a zip", r"cannot be read \(.*\); expected a .npz archive"),
    ("bad json", r"its '__config__' member is not JSON \(.*\): '\{not json'; expected the "
                 r"rule's configuration"),
    ("no config", r"has no '__config__' member \(members: \[.*'skip_kernel'.*\]\); "
                  r"expected a .npz archive"),
    ("config of other keys", r"its '__config__' holds \['hiden'\]; expected a JSON object "
                             r"of the keys \['activation', "),
    ("missing array", r"LearnedRule network arrays \[.*\] do not match this rule's "
                      r"\[.*'skip_kernel'\]"),
    ("nan weight", r"LearnedRule array 'output_bias' holds 1 non-finite value\(s\) \(NaN or "
                   r"infinite\) of 2"),
    ("out of range", r"LearnedRule.betas must be in \[0, 1\), got 1.5"),
])
def test_a_damaged_rule_file_is_named_with_what_was_expected(tmp_path, damage, expected):
    import json
    from metalearn.adapters import LearnedRule
    from metalearn.adapters.learned_optimizer import RuleFileError
    if damage == "truncated":
        _, path = saved_rule(tmp_path)
        whole = path.read_bytes()
        path = tmp_path / "bad.npz"
        path.write_bytes(whole[:len(whole) // 2])
    elif damage == "not a zip":
        path = tmp_path / "bad.npz"
        path.write_bytes(b"this is not a rule")
    else:
        def change(members):
            config = json.loads(str(members["__config__"]))
            if damage == "bad json":
                members["__config__"] = np.array("{not json")
            elif damage == "no config":
                del members["__config__"]
            elif damage == "config of other keys":
                members["__config__"] = np.array(json.dumps({"hiden": [4]}))
            elif damage == "missing array":
                del members["skip_kernel"]
            elif damage == "nan weight":
                _nan_weight(members)
            elif damage == "out of range":
                config["betas"] = [0.5, 1.5]
                members["__config__"] = np.array(json.dumps(config))
        path = rewritten(tmp_path, change)
    with pytest.raises(RuleFileError, match=expected) as info:
        LearnedRule.load(str(path))
    assert str(info.value).startswith(f"learned-rule file {str(path)!r}"), str(info.value)


def test_non_finite_rule_values_are_refused_wherever_they_are_given():
    from metalearn.adapters import LearnedRule, LearnedRuleOptimizer
    from metalearn.adapters.learned_optimizer import NonFiniteRuleError
    rule = LearnedRule(hidden=(4,))
    values = rule.initial_values()
    values["skip_kernel"][0, 0] = np.inf
    with pytest.raises(NonFiniteRuleError, match="'skip_kernel' holds 1 non-finite"):
        rule.create("float32", values)
    assert not rule.network  # nothing created
    good = LearnedRule(hidden=(4,))
    good.create("float32")
    config = LearnedRuleOptimizer(good).get_config()
    config["rule"]["values"]["output_bias"] = [0.0, float("nan")]
    with pytest.raises(NonFiniteRuleError, match="'output_bias' holds 1 non-finite"):
        LearnedRuleOptimizer.from_config(config)


# --- a float64 learned-rule optimizer saved in a .keras file -------------------


def test_a_float64_learned_rule_optimizer_comes_back_exactly_from_a_keras_file(tmp_path):
    rule = LearnedRule(0.02, hidden=(4,))
    rule.create("float64")
    rng = np.random.default_rng(1)
    for variable in rule.network.values():  # trained: values float32 cannot hold
        variable.assign(variable.numpy() + 0.05 * rng.standard_normal(variable.shape))
    keras.utils.set_random_seed(0)
    x = np.random.default_rng(0).normal(size=(32, 2))
    y = x @ np.array([[1.0], [-2.0]]) + 0.5
    model = models.mlp((2,), hidden=(8,), outputs=1, activation="tanh", dtype="float64")
    model.compile(optimizer=LearnedRuleOptimizer(rule), loss="mse")
    model.fit(x, y, epochs=2, batch_size=16, verbose=0, shuffle=False)
    path = os.path.join(tmp_path, "model.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    for key, value in rule.values().items():
        assert loaded.optimizer.frozen[key].dtype == np.float64
        np.testing.assert_array_equal(loaded.optimizer.frozen[key], value)
    model.fit(x, y, epochs=2, batch_size=16, verbose=0, shuffle=False)
    loaded.fit(x, y, epochs=2, batch_size=16, verbose=0, shuffle=False)
    for a, b in zip(model.get_weights(), loaded.get_weights()):
        np.testing.assert_array_equal(a, b)
