"""Weights that start every task at a value computed from the task, not meta-learned.

One mechanism for every "per task" weight of the model: a :class:`TaskInit` piece says
which weights it sets (its task paths, left out of the learner's meta-variables) and
computes their value for one task from its support set. The zeroing trick, Proto-MAML's
head and CAVIA's context are all task initialisers. (A closed-form head's state, such
as class prototypes, is not a model weight: it travels in the task's state,
:attr:`metalearn.learners.Adapted.state`.)
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence

import gin
import keras
import tensorflow as tf

from metalearn import functional
from metalearn.pieces import Capabilities, Piece, check_patterns, select_paths
from metalearn.functional import Weights
from metalearn.heads.prototypes import class_prototypes, flat
from metalearn.tasks.episode import example_mask

EmbedFn = Callable[[keras.Model, Weights, Any], tf.Tensor]


class TaskInit(Piece):
    """Sets some model weights per task before the inner loop starts.

    Subclass it: :meth:`paths` (which weights), :meth:`initial` (their values for one
    task). Elementwise initialisers work on a task axis (the default); one that reads
    one task's support set says ``Capabilities(task_axis=False, step_prefix=True)``. An
    initialiser runs before the inner loop and never sees its number of steps, so every
    one allows the counts of one run (``step_prefix``, the default here).
    """

    def own_capabilities(self) -> Capabilities:
        return Capabilities(step_prefix=True)  # before step 0, whatever the count

    def build(self, model: keras.Model, weights: Weights) -> None:
        """Checks ``model`` and records what the initialiser needs (once, by Learner)."""

    def paths(self, weights: Weights) -> List[str]:
        raise NotImplementedError

    def own_task_paths(self, weights: Weights) -> Sequence[str]:
        return self.paths(weights)

    def initial(self, weights: Weights, support_x: Any, support_y: Any) -> Weights:
        """``weights`` with this initialiser's paths set for the task."""
        raise NotImplementedError


class _SelectedInit(TaskInit):
    """Weights chosen by ``patterns`` set to :meth:`value` of their current values."""

    owner = ""  # how pattern errors name the initialiser

    def __init__(self, patterns: Sequence[str], name: Optional[str] = None):
        super().__init__(name=name)
        self.patterns = check_patterns(patterns, self.owner)

    def paths(self, weights):
        return select_paths(list(weights), self.patterns, self.owner)

    def value(self, weight: tf.Tensor) -> tf.Tensor:
        raise NotImplementedError

    def initial(self, weights, support_x, support_y):
        weights = dict(weights)
        for path in self.paths(weights):
            weights[path] = self.value(weights[path])
        return weights


@gin.configurable
class ZeroInit(_SelectedInit):
    """The matching weights start every task at zero (the "zeroing trick" of Kao et al.,
    2022, "MAML is a noisy contrastive learner in classification", for the linear head):
    the initial predictions are then equal for every class, so the meta-learned model
    cannot depend on how a task's labels are numbered.

    Args:
      patterns: regular expressions over weight paths (``re.search``).
    """

    owner = "zero_init"

    def __init__(self, patterns: Sequence[str] = gin.REQUIRED, name: Optional[str] = None):
        super().__init__(patterns, name=name)

    def value(self, weight):
        return tf.zeros_like(weight)


@gin.configurable
class FixedInit(_SelectedInit):
    """The matching weights start every task at the model's current values, which are
    not meta-learned: what meta-trains is the rest (the inner loop's pieces). This is
    how a learned optimizer (:class:`~metalearn.adapters.LearnedRule`) is meta-trained
    from a fixed random initialisation instead of alongside a MAML one, and how a
    learned inner rule is compared with hand-tuned ones from the same start.

    Args:
      patterns: regular expressions over weight paths (``re.search``); the default
        ``(".*",)`` fixes every weight.
    """

    owner = "FixedInit"

    def __init__(self, patterns: Sequence[str] = (".*",), name: Optional[str] = None):
        super().__init__(patterns, name=name)

    def value(self, weight):
        return tf.stop_gradient(weight)


@gin.configurable
class PrototypeInit(TaskInit):
    """Proto-MAML's head (Triantafillou et al., 2020): the linear head ``head`` starts
    every task at the prototype classifier ``W_k = 2 c_k``, ``b_k = -||c_k||^2`` (the
    linear part of ``-||f(x) - c_k||^2``), ``c_k`` the mean support embedding of class
    ``k``. The meta-gradient reaches the body through the prototypes too.

    Args:
      ways: classes per task.
      head: name of the head layer, a ``Dense`` with bias and ``ways`` units applied to
        the body's (flat) embedding.
    """

    def __init__(self, ways: int = gin.REQUIRED, head: str = "head",
                 name: Optional[str] = None):
        super().__init__(name=name)
        if ways is gin.REQUIRED or ways is None or int(ways) < 2:
            raise ValueError(f"ways (classes per task) must be an int >= 2, got {ways!r}")
        self.ways = int(ways)
        self.head = head
        self._head_paths: List[str] = []
        self._body: Optional[keras.Model] = None

    def own_capabilities(self) -> Capabilities:
        return Capabilities(task_axis=False, step_prefix=True)  # one task's class means

    def build(self, model, weights):
        layer = functional.layer(model, self.head)
        if not isinstance(layer, keras.layers.Dense) or not layer.use_bias \
                or layer.units != self.ways:
            raise ValueError(f"ProtoMAML's head {self.head!r} must be a Dense layer with "
                             f"bias and {self.ways} units, got {layer!r}")
        self._body = keras.Model(model.inputs, layer.input)
        self._head_paths = [layer.kernel.path, layer.bias.path]

    def paths(self, weights):
        return list(self._head_paths)

    def initial(self, weights, support_x, support_y):
        body = {p: w for p, w in weights.items() if p not in self._head_paths}
        with functional.example_mask(example_mask(support_y)):
            embeddings = flat(functional.call(self._body, body, support_x, training=True))
        prototypes = class_prototypes(embeddings, support_y, self.ways)  # [ways, features]
        weights = dict(weights)
        kernel, bias = self._head_paths
        weights[kernel] = 2.0 * tf.transpose(prototypes)
        weights[bias] = -tf.reduce_sum(tf.square(prototypes), axis=-1)
        return weights
