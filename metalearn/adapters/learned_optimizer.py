"""Learned optimizers: an inner update whose rule is a small network applied to every
parameter element, and the same rule as a drop-in Keras optimizer.

:class:`LearnedRule` is an update transform (:class:`~metalearn.adapters.updates.Update`)
in the style of the small per-parameter learned optimizers of learned_optimization
(Metz et al. 2019, 2020): at inner step ``t`` (from 1), for every element of every
adapted weight, with gradient ``g`` and weight ``w``,

* accumulators: momenta ``m_b <- b m_b + (1 - b) g`` for each ``b`` in ``betas`` and a
  second moment ``v <- r v + (1 - r) g^2`` (``r = rms_decay``), bias-corrected
  (``m_b / (1 - b^t)``, ``v / (1 - r^t)``);
* features: ``g`` and each corrected momentum divided by ``sqrt(v_hat) + epsilon``, the
  weight ``w``, and ``tanh(t / s)`` for each ``s`` in ``timescales``;
* a small MLP (``hidden`` units, ``activation``) plus a linear skip from the features
  gives two outputs, a direction ``d`` and a log magnitude ``a``;
* the update is ``d * exp(magnitude_scale * a) * learning_rate``.

The network's weights are the piece's meta-variables (:meth:`own_meta_variables`), so a
learner meta-trains them with everything else. At construction the hidden path's output
is zero and the skip reads ``-1`` on the momentum whose beta is nearest 0.9: the rule
starts as Adam with that beta (``beta_2 = rms_decay``; ``epsilon`` added to
``sqrt(v_hat)``), and meta-training moves it from there. Everything is elementwise, so
it works on a task axis (the ``Batched`` formulation), and it composes with ``Mask``,
``WhileLoop``, ``LearnedRates``, ``FirstOrder`` like any transform::

    GradientDescent(20, update=[Mask(("head",)), LearnedRule(0.01)],
                    wrappers=[WhileLoop()])

:class:`LearnedRuleOptimizer` is a ``keras.optimizers.Optimizer`` whose update is a
rule's, its network frozen at the values it had (a meta-trained one):
``model.compile(optimizer=LearnedRuleOptimizer(rule))``. :meth:`LearnedRule.save` and
:meth:`LearnedRule.load` keep a rule in a ``.npz`` file; the optimizer saves with the
model (``model.save``) and loads with ``keras.saving.load_model``.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import zipfile
import zlib
from typing import Any, Dict, List, Optional, Sequence, Tuple

import gin
import keras
import numpy as np
import tensorflow as tf

from metalearn.adapters.optimizers import safe_sqrt
from metalearn.adapters.updates import StepInfo, Update
from metalearn.functional import Weights
from metalearn.pieces import COUNT, DECAY, POSITIVE, STEPS, Capabilities, check_range

ACTIVATIONS = ("tanh", "relu", "gelu")


class RuleMismatchError(ValueError):
    """A learned rule was given weights or state it was not built for: a path outside
    the adapted weights it was built on, or a saved network of another shape."""


class NonFiniteRuleError(ValueError):
    """A learned rule's network array holds NaN or infinite values (every update it
    gave would be NaN): refused wherever arrays are given to a rule."""


class RuleFileError(ValueError):
    """A learned-rule file that cannot be loaded as one (:meth:`LearnedRule.load`):
    damaged, not written by :meth:`LearnedRule.save`, of a configuration or arrays no
    rule has, or holding non-finite weights. The message names the file and what was
    expected."""


def _activation(name: str):
    return {"tanh": tf.tanh, "relu": tf.nn.relu, "gelu": tf.nn.gelu}[name]


@gin.configurable
class LearnedRule(Update):
    """A learned optimizer as an inner update: a small MLP applied to every parameter
    element (see the module docstring for the features and outputs).

    Args:
      learning_rate: the base step (``> 0``), multiplying every update.
      hidden: the MLP's hidden widths (each a whole number ``>= 1``; ``()``: only the
        linear skip).
      betas: the momenta's decays, each in ``[0, 1)`` (at least one).
      rms_decay: the second moment's decay, in ``[0, 1)``.
      timescales: the step features' scales ``s`` of ``tanh(t / s)`` (each ``> 0``).
      magnitude_scale: the factor of the log magnitude output (``> 0``).
      epsilon: added to ``sqrt(v_hat)`` before dividing (``> 0``).
      activation: ``"tanh"``, ``"relu"`` or ``"gelu"``.
      seed: the hidden layers' initial weights' seed (a whole number ``>= 0``).

    Raises:
      RuleMismatchError: :meth:`update` sees a weight path the rule was not built for.
    """

    def __init__(self, learning_rate: float = 0.01, hidden: Sequence[int] = (16,),
                 betas: Sequence[float] = (0.5, 0.9, 0.99), rms_decay: float = 0.999,
                 timescales: Sequence[float] = (1.0, 10.0, 100.0),
                 magnitude_scale: float = 0.1, epsilon: float = 1e-8,
                 activation: str = "tanh", seed: int = 0, name: Optional[str] = None):
        super().__init__(name=name)
        self.learning_rate = check_range("LearnedRule", "learning_rate", learning_rate,
                                         POSITIVE)
        self.hidden = tuple(int(check_range("LearnedRule", "hidden", h, COUNT)) for h in hidden)
        if not betas:
            raise ValueError("LearnedRule needs at least one momentum beta, got ()")
        self.betas = tuple(check_range("LearnedRule", "betas", b, DECAY) for b in betas)
        self.rms_decay = check_range("LearnedRule", "rms_decay", rms_decay, DECAY)
        self.timescales = tuple(check_range("LearnedRule", "timescales", s, POSITIVE)
                                for s in timescales)
        self.magnitude_scale = check_range("LearnedRule", "magnitude_scale",
                                           magnitude_scale, POSITIVE)
        self.epsilon = check_range("LearnedRule", "epsilon", epsilon, POSITIVE)
        if activation not in ACTIVATIONS:
            raise ValueError(f"LearnedRule activation must be one of {ACTIVATIONS}, got "
                             f"{activation!r}")
        self.activation = activation
        self.seed = int(check_range("LearnedRule", "seed", seed, STEPS))
        self._paths: List[str] = []
        self.network: Dict[str, keras.Variable] = {}

    # --- the network ----------------------------------------------------------------

    @property
    def features(self) -> int:
        """The number of input features per element."""
        return 1 + len(self.betas) + 1 + len(self.timescales)

    def config(self) -> Dict[str, Any]:
        """The constructor's arguments but ``name`` (what :meth:`save` records)."""
        return {"learning_rate": self.learning_rate, "hidden": list(self.hidden),
                "betas": list(self.betas), "rms_decay": self.rms_decay,
                "timescales": list(self.timescales),
                "magnitude_scale": self.magnitude_scale, "epsilon": self.epsilon,
                "activation": self.activation, "seed": self.seed}

    def shapes(self) -> Dict[str, Tuple[int, ...]]:
        """The network's arrays by name and shape."""
        shapes, width = {}, self.features
        for i, units in enumerate(self.hidden):
            shapes[f"hidden_{i}_kernel"], shapes[f"hidden_{i}_bias"] = (width, units), (units,)
            width = units
        shapes["output_kernel"], shapes["output_bias"] = (width, 2), (2,)
        shapes["skip_kernel"] = (self.features, 2)
        return shapes

    def initial_values(self) -> Dict[str, np.ndarray]:
        """The network's initial arrays: hidden layers Glorot-uniform from ``seed``, the
        output layer zero, the skip Adam's direction (``-1`` from the momentum whose
        beta is nearest 0.9 to the direction)."""
        rng = np.random.default_rng(self.seed)
        values = {}
        for key, shape in self.shapes().items():
            if key.startswith("hidden_") and key.endswith("kernel"):
                limit = math.sqrt(6.0 / sum(shape))
                values[key] = rng.uniform(-limit, limit, shape)
            else:
                values[key] = np.zeros(shape)
        adam = int(np.argmin([abs(b - 0.9) for b in self.betas]))
        values["skip_kernel"][1 + adam, 0] = -1.0
        return values

    def create(self, dtype: str = "float32",
               values: Optional[Dict[str, np.ndarray]] = None) -> None:
        """Creates the network's variables in ``dtype`` (at :meth:`initial_values`, or
        at ``values``); :meth:`build` calls it. Creating them again keeps existing
        variables, assigning ``values`` if given."""
        if values is not None:
            values = self.check_values(values)
        if self.network:
            for key, variable in self.network.items():
                if values is not None:
                    variable.assign(values[key])
            return
        values = self.initial_values() if values is None else values
        self.network = {key: keras.Variable(np.asarray(value), dtype=dtype, trainable=True,
                                            name=f"learned_rule_{key}")
                        for key, value in values.items()}

    def check_values(self, values: Dict[str, Any]) -> Dict[str, np.ndarray]:
        """``values`` as arrays, checked against :meth:`shapes` and for finite numbers.

        Raises:
          RuleMismatchError: a missing, extra or differently shaped array (named).
          NonFiniteRuleError: an array that is not numbers, or holds NaN or infinite
            values (the array and how many named).
        """
        values = {k: np.asarray(v) for k, v in values.items()}
        expected = self.shapes()
        if sorted(values) != sorted(expected):
            raise RuleMismatchError(f"LearnedRule network arrays {sorted(values)} do not "
                                    f"match this rule's {sorted(expected)} (hidden="
                                    f"{self.hidden})")
        for key, shape in expected.items():
            if values[key].shape != shape:
                raise RuleMismatchError(
                    f"LearnedRule array {key!r} has shape {values[key].shape}, this rule "
                    f"(hidden={self.hidden}, {self.features} features) needs {shape}")
        for key, array in values.items():
            if array.dtype.kind not in "fiu":
                raise NonFiniteRuleError(f"LearnedRule array {key!r} must hold real "
                                         f"numbers, got dtype {array.dtype}")
            bad = int(np.size(array) - np.count_nonzero(np.isfinite(array)))
            if bad:
                raise NonFiniteRuleError(
                    f"LearnedRule array {key!r} holds {bad} non-finite value(s) (NaN or "
                    f"infinite) of {array.size}: every update of the rule would be NaN "
                    "(saved from a diverged meta-training, or damaged)")
        return values

    def values(self) -> Dict[str, np.ndarray]:
        """The network's current arrays by name (after :meth:`create` or :meth:`build`)."""
        if not self.network:
            raise RuntimeError("LearnedRule is not built: build the adapter first (a "
                               "Learner does) or call create()")
        return {k: v.numpy() for k, v in self.network.items()}

    def save(self, path: str) -> None:
        """Writes the rule (its configuration and network) to ``path`` (``.npz``)."""
        np.savez(path, __config__=np.array(json.dumps(self.config())), **self.values())

    @classmethod
    def load(cls, path: str, dtype: str = "float32") -> "LearnedRule":
        """A rule from a file :meth:`save` wrote, its network created in ``dtype``.

        The file must be a ``.npz`` (zip) archive of a ``__config__`` member (the
        rule's configuration as JSON, :meth:`config`) and the network's arrays
        (:meth:`shapes`), every value finite; all of it is read and checked before a
        rule is made.

        Raises:
          FileNotFoundError: no file at ``path``.
          RuleFileError: naming the file and what was expected: not a readable
            ``.npz`` (a truncated or damaged archive or member), no ``__config__`` or
            one that is not a JSON object of :meth:`config`'s keys, a value out of range,
            missing, extra or misshapen arrays, or an array holding NaN or infinite
            values (named).
        """
        where = f"learned-rule file {os.fspath(path)!r}"
        expected = ("a .npz archive of '__config__' (the rule's configuration as JSON) and "
                    "the network's arrays, as LearnedRule.save writes")
        try:
            with np.load(path, allow_pickle=False) as data:
                members = list(data.files)
                if "__config__" not in members:
                    raise RuleFileError(f"{where} has no '__config__' member (members: "
                                        f"{members}); expected {expected}")
                text = str(data["__config__"])
                values = {k: data[k] for k in members if k != "__config__"}
        except FileNotFoundError:
            raise
        except RuleFileError:
            raise
        except (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError) as error:
            raise RuleFileError(f"{where} cannot be read ({type(error).__name__}: "
                                f"{error}); expected {expected}") from error
        try:
            config = json.loads(text)
        except json.JSONDecodeError as error:
            raise RuleFileError(f"{where}: its '__config__' member is not JSON ({error}): "
                                f"{text[:80]!r}; expected the rule's configuration, "
                                f"{sorted(cls().config())}") from error
        keys = sorted(cls().config())
        if not isinstance(config, dict) or sorted(config) != keys:
            shown = sorted(config) if isinstance(config, dict) else type(config).__name__
            raise RuleFileError(f"{where}: its '__config__' holds {shown}; expected a "
                                f"JSON object of the keys {keys}")
        try:
            rule = cls(**config)
            rule.create(dtype, values)
        except (TypeError, ValueError) as error:  # ranges, shapes, non-finite values
            raise RuleFileError(f"{where}: {error}") from error
        return rule

    @property
    def paths(self) -> List[str]:
        """The weight paths the rule was built for (what :meth:`update` accepts)."""
        return list(self._paths)

    def own_meta_variables(self):
        return list(self.network.values()) + super().own_meta_variables()

    def build(self, weights: Weights, steps: int) -> None:
        super().build(weights, steps)
        self._paths = list(weights)
        dtype = next(iter(weights.values())).dtype.name if weights else "float32"
        self.create(dtype)

    # --- one element's rule -------------------------------------------------------

    def init_one(self, weight: tf.Tensor) -> Tuple[Tuple[tf.Tensor, ...], tf.Tensor]:
        """One weight's state before the first step: ``(momenta, v)``, zeros."""
        return tuple(tf.zeros_like(weight) for _ in self.betas), tf.zeros_like(weight)

    def apply_one(self, grad: tf.Tensor, weight: tf.Tensor, state, step: Any,
                  network: Dict[str, Any]):
        """``(update, new state)`` of one weight at inner step ``step`` (from 0; an int
        or a scalar tensor), the network's arrays given (variables or constants)."""
        momenta, v = state
        dtype = grad.dtype
        t = tf.cast(step, dtype) + 1
        momenta = tuple(b * m + (1 - b) * grad for b, m in zip(self.betas, momenta))
        v = self.rms_decay * v + (1 - self.rms_decay) * tf.square(grad)
        scale = 1 / (safe_sqrt(v / (1 - tf.pow(tf.constant(self.rms_decay, dtype), t)))
                     + self.epsilon)
        columns = [grad * scale]
        columns += [m / (1 - tf.pow(tf.constant(b, dtype), t)) * scale
                    for b, m in zip(self.betas, momenta)]
        columns.append(weight)
        columns += [tf.ones_like(grad) * tf.tanh(t / s) for s in self.timescales]
        x = tf.stack(columns, axis=-1)
        act = _activation(self.activation)
        cast = lambda key: tf.cast(network[key], dtype)
        h = x
        for i in range(len(self.hidden)):
            h = act(tf.tensordot(h, cast(f"hidden_{i}_kernel"), 1) + cast(f"hidden_{i}_bias"))
        out = (tf.tensordot(h, cast("output_kernel"), 1) + cast("output_bias")
               + tf.tensordot(x, cast("skip_kernel"), 1))
        direction, magnitude = out[..., 0], out[..., 1]
        update = direction * tf.exp(self.magnitude_scale * magnitude) * self.learning_rate
        return update, (momenta, v)

    # --- the update transform -------------------------------------------------------

    def own_capabilities(self) -> Capabilities:
        # features of the gradient, the weight, the accumulators and t = step + 1 alone:
        # never the number of steps the run makes
        return Capabilities(step_prefix=True)

    def init(self, weights):
        return {p: self.init_one(w) for p, w in weights.items()}

    def update(self, grads, state, weights, info: StepInfo):
        if not self.network:
            raise RuntimeError("LearnedRule is not built: build the adapter first (a "
                               "Learner does)")
        updates, new_state = {}, {}
        for p, g in grads.items():
            if p not in self._paths:
                raise RuleMismatchError(f"LearnedRule was built for the weights "
                                        f"{list(self._paths)}, not {p!r}")
            updates[p], new_state[p] = self.apply_one(g, weights[p], state[p], info.step,
                                                      self.network)
        return updates, new_state


@keras.saving.register_keras_serializable(package="metalearn")
class LearnedRuleOptimizer(keras.optimizers.Optimizer):
    """A Keras optimizer whose update is a :class:`LearnedRule`'s, the rule's network
    frozen at its values when the optimizer is made (a meta-trained rule, or one
    :meth:`LearnedRule.load` read): a drop-in for ``model.compile(optimizer=...)``.

    Each variable's state (momenta, second moment) is an optimizer variable; step ``t``
    is ``iterations``, so ``apply_gradients`` ``n`` times gives what ``n`` inner steps of
    the rule give. The rule's ``learning_rate`` is the base step unless
    ``learning_rate`` is given (a number or a Keras schedule, as for any optimizer).
    Saved with the model (``model.save``: the rule's configuration, arrays and their
    dtype are in the optimizer's config) and loaded with ``keras.saving.load_model``,
    exactly: a float64 rule comes back in float64.

    Args:
      rule: a built :class:`LearnedRule` (or one created with ``create``).
      learning_rate: the base step (> 0, or a Keras schedule); ``None``: the rule's.
      name: the optimizer's name; other keyword arguments go to
        ``keras.optimizers.Optimizer`` (``clipnorm``, ``weight_decay``, ...).

    Raises:
      TypeError: ``rule`` is not a :class:`LearnedRule`; ``learning_rate`` a value that
        is no number (a string, a bool).
      HyperparameterRangeError: a ``learning_rate`` number that is not > 0 (it would
        climb the loss).
    """

    def __init__(self, rule: LearnedRule, learning_rate: Any = None,
                 name: str = "learned_rule", **kwargs):
        if isinstance(rule, dict):  # from get_config: in the dtype it was saved in
            dtype = rule.get("dtype", "float32")  # files saved before the dtype was
            values = {k: np.asarray(v, dtype) for k, v in rule["values"].items()}
            rule = LearnedRule(**rule["config"])
            rule.create(dtype, values)
        if not isinstance(rule, LearnedRule):
            raise TypeError(f"LearnedRuleOptimizer takes a metalearn LearnedRule, got "
                            f"{rule!r}")
        frozen = rule.values()
        if learning_rate is None:
            learning_rate = rule.learning_rate
        elif isinstance(learning_rate, (numbers.Real, str)):  # a schedule passes as it is
            learning_rate = check_range("LearnedRuleOptimizer", "learning_rate",
                                        learning_rate, POSITIVE)
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        self.rule = LearnedRule(**{**rule.config(), "learning_rate": 1.0})
        self.frozen = frozen

    def build(self, var_list):
        if self.built:
            return
        super().build(var_list)
        names = [f"momentum_{i}" for i in range(len(self.rule.betas))] + ["velocity"]
        self.slots = [self.add_optimizer_variables(var_list, n) for n in names]

    def update_step(self, gradient, variable, learning_rate):
        index = self._get_variable_index(variable)
        dtype = variable.dtype
        gradient = tf.cast(gradient, dtype)
        state = (tuple(tf.convert_to_tensor(s[index]) for s in self.slots[:-1]),
                 tf.convert_to_tensor(self.slots[-1][index]))
        update, (momenta, v) = self.rule.apply_one(
            gradient, tf.convert_to_tensor(variable), state, self.iterations,
            {k: tf.constant(a, dtype) for k, a in self.frozen.items()})
        for slot, value in zip(self.slots, [*momenta, v]):
            self.assign(slot[index], value)
        self.assign_add(variable, update * tf.cast(learning_rate, dtype))

    def get_config(self):
        config = super().get_config()
        dtypes = {a.dtype.name for a in self.frozen.values()}
        config["rule"] = {"config": self.rule.config(),
                          # a float64 rule's values are exact in JSON; its dtype too
                          "dtype": dtypes.pop() if len(dtypes) == 1 else "float32",
                          "values": {k: a.tolist() for k, a in self.frozen.items()}}
        config["rule"]["config"]["learning_rate"] = 1.0
        return config
