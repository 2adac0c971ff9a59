"""Issue 43, the library's BAD cases of the fourth reliability round, each kept as a
test that failed before its fix:

* 4. ``LearnedRuleOptimizer``'s learning rate gets the range check every number gets;
* 5. the SVM head on identical support rows (a singular face system) is finite;
* 6. a dangling symlink in an image-folder class is an error naming it;
* 7. / 8. mini-ImageNet splits that share an image, or classes that share image
  indices, are refused by the loaders' one validation of splits;
* 9. a float64 model compiled with a trained ``LearnedRuleOptimizer`` comes back from
  its ``.keras`` file exactly (the rule's dtype is saved with it).
"""

from __future__ import annotations

import math
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from metalearn import heads, models
from metalearn.adapters import LearnedRule, LearnedRuleOptimizer
from metalearn.pieces import HyperparameterRangeError


# --- 4. the learned optimizer's learning rate ----------------------------------------


@pytest.mark.parametrize("rate, shown", [(-0.5, "-0.5"), (0.0, "0.0"),
                                         (float("nan"), "nan")])
def test_a_learned_rule_optimizer_s_learning_rate_is_range_checked(rate, shown):
    rule = LearnedRule(0.1, hidden=(4,))
    rule.create("float32")
    with pytest.raises(HyperparameterRangeError,
                       match=rf"LearnedRuleOptimizer.learning_rate must be > 0, got {shown}"):
        LearnedRuleOptimizer(rule, learning_rate=rate)
    LearnedRuleOptimizer(rule, learning_rate=0.5)  # a number in range, or a schedule
    LearnedRuleOptimizer(rule, learning_rate=keras.optimizers.schedules.ExponentialDecay(
        0.1, 10, 0.9))
