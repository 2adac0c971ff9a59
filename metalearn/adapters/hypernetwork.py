"""Hypernetworks in the inner loop: weights generated from the task or from each input.

Instead of (or before) gradient steps, a generator network maps a conditioning vector
to some of the base model's weights:

* ``condition="support"``: the vector is an embedding of the task's support set. An
  encoder (any Keras model) maps each support example to features, which are pooled
  in a way that does not depend on the order of the examples: per-class means
  concatenated in label order (``pooling="class_means"``, classification; the
  generated head's unit ``c`` then sees class ``c``'s mean) or the mean over examples
  of the features of ``[x, y]`` pairs (``pooling="mean"``, regression, where a task is
  only visible through its targets). One set of weights per task, used for every
  query: ``adapt`` returns them.
* ``condition="input"``: the vector is (the encoder's features of) each input itself,
  as in the hypernetwork of the tf.keras crash course for researchers: every example,
  support or query, is classified by the model with weights generated from that
  example. ``adapt`` then has nothing to generate (the support set does not enter);
  generation happens in :meth:`Hypernetwork.forward`, which the learner calls for
  every forward pass, with one model call per example vectorised by
  ``tf.vectorized_map`` (a while loop where an op has no vectorised form).

The generator's output is flattened per example and split, in the order of the
model's trainable variables, into the shapes of the generated weights. Generated
weights replace the model's (``mode="replace"``: those variables are never used, get
no meta-gradient, and ``task_paths`` removes them from the learner's
meta-variables), or are added to them (``mode="residual"``, as in HyperMAML: the
model's weights stay meta-learned and the generator predicts a task-specific change).

``then=GradientDescent(...)`` composes with gradient steps: the generated weights are
the starting point of that inner loop (and ``steps`` overrides are passed to it).

The encoder and generator are meta-learned: their trainable variables are listed in
``meta_variables`` and, being attributes of this module, saved in checkpoints. They
run through :func:`metalearn.functional.call`, so adaptation assigns no variable
(BatchNorm in them normalises with batch statistics, never updating moving ones).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import gin
import keras
import numpy as np
import tensorflow as tf

from metalearn import functional
from metalearn.adapters.base import Adapter
from metalearn.functional import Weights
from metalearn.pieces import COUNT, CallFn, LossFn, check_range, select_paths

CONDITIONS = ("support", "input")
POOLINGS = ("class_means", "mean")
MODES = ("replace", "residual")


def _run(model: keras.Model, x: tf.Tensor) -> tf.Tensor:
    """A meta-learned network's output, statelessly (no variable is assigned)."""
    if model.trainable_variables:
        return functional.call(model, {}, x, training=True)
    return model(x, training=False)  # no weights to differentiate: a fixed transform


def flatten_examples(t: tf.Tensor) -> tf.Tensor:
    """``[examples, ...]`` -> ``[examples, features]`` keeping static sizes."""
    t = tf.convert_to_tensor(t)
    size = t.shape[1:].num_elements()
    return tf.reshape(t, [-1, size if size is not None else tf.reduce_prod(tf.shape(t)[1:])])


@gin.configurable
class Hypernetwork(Adapter):
    """Generates (some of) the base model's weights with a meta-learned generator.

    Example (the crash course's hypernetwork: ``Linear(784 * 10 + 10)`` predicts, from
    each image, the kernel and bias of the ``Linear(10)`` that classifies it)::

        model = metalearn.models.linear((784,), 10)                 # the target
        generator = metalearn.models.linear((784,), 784 * 10 + 10, name="generator")
        learner = metalearn.Learner(model, Hypernetwork(generator, condition="input"),
                                    loss=keras.losses.SparseCategoricalCrossentropy(
                                        from_logits=True))
        learner.meta_variables      # the generator's kernel and bias only

    Args:
      generator: a Keras model from the conditioning vector (``[batch, features]``) to
        the generated weights, flattened (``[batch, sum of their sizes]``, or any shape
        with that many values per example). An unbuilt model is built in :meth:`build`.
      encoder: a Keras model from examples to features (flattened per example);
        ``None`` uses the flattened inputs themselves. An unbuilt model is built in
        :meth:`build`.
      generate: regular expressions over variable paths (``re.search``) selecting the
        generated weights, e.g. ``("head",)`` for the classifier head; ``None``
        generates every trainable weight of the model.
      condition: ``"support"`` (one set of weights per task, from its support set) or
        ``"input"`` (weights per example, from the example itself).
      pooling: with ``condition="support"``: ``"class_means"`` (integer labels; the
        encoder sees ``x``; per-class mean features, concatenated in label order,
        ``num_classes * features`` values) or ``"mean"`` (the encoder sees each
        ``[x, y]`` pair flattened and concatenated; mean over examples).
      num_classes: classes for ``"class_means"``; defaults to the model's number of
        outputs (the last axis of its output).
      mode: ``"replace"`` the model's weights with the generated ones, or add the
        generated ones to them (``"residual"``).
      then: an adapter run after generation, starting from the generated weights, e.g.
        ``GradientDescent(steps=5)``.
    """

    def __init__(self, generator: keras.Model = gin.REQUIRED,
                 encoder: Optional[keras.Model] = None,
                 generate: Optional[Sequence[str]] = None, condition: str = "support",
                 pooling: str = "class_means", num_classes: Optional[int] = None,
                 mode: str = "replace", then: Optional[Adapter] = None,
                 name: Optional[str] = None):
        super().__init__(name=name)
        for arg, value, allowed in (("condition", condition, CONDITIONS),
                                    ("pooling", pooling, POOLINGS), ("mode", mode, MODES)):
            if value not in allowed:
                raise ValueError(f"Hypernetwork {arg} must be one of {allowed}, "
                                 f"got {value!r}")
        for arg, value in (("generator", generator), ("encoder", encoder)):
            if value is not None and not isinstance(value, keras.Model):
                raise TypeError(f"Hypernetwork {arg} must be a keras.Model, got {value!r}")
        if generator is None:
            raise TypeError("Hypernetwork needs a generator (a keras.Model)")
        if then is not None and not isinstance(then, Adapter):
            raise TypeError(f"Hypernetwork then= must be a metalearn Adapter, got {then!r}")
        if num_classes is not None:
            num_classes = check_range("Hypernetwork", "num_classes", num_classes, COUNT)
        self.generator = generator  # attributes of a tf.Module: tracked by checkpoints
        self.encoder = encoder
        self.then = then
        self.generate_patterns = None if generate is None else tuple(generate)
        self.condition = condition
        self.pooling = pooling
        self.num_classes = None if num_classes is None else int(num_classes)
        self.mode = mode
        self._shapes: Dict[str, Tuple[int, ...]] = {}

    # --- what is generated ---------------------------------------------------------

    def target_paths(self, weights: Weights) -> List[str]:
        """Paths of the weights the generator produces, in the model's variable order."""
        if self.generate_patterns is None:
            return list(weights)
        return select_paths(weights, self.generate_patterns, "Hypernetwork generate")

    def own_task_paths(self, weights: Weights) -> Sequence[str]:
        """Replaced weights are never meta-trained; residual ones stay meta-learned."""
        return self.target_paths(weights) if self.mode == "replace" else ()

    @property
    def output_size(self) -> int:
        """Values the generator must output per example (after :meth:`build`)."""
        return sum(int(np.prod(s)) for s in self._shapes.values())

    @property
    def steps(self) -> int:
        """Gradient steps of ``then`` (0 without it)."""
        return self.then.inner_steps if self.then is not None else 0

    def _layout(self) -> str:
        return ", ".join(f"{p!r} shape {s} = {int(np.prod(s))}"
                         for p, s in self._shapes.items())

    def split(self, flat: tf.Tensor) -> Dict[str, tf.Tensor]:
        """Splits generator output ``[batch, ...]`` into ``{path: [batch, *shape]}``.

        Raises:
          ValueError: the output's size per example is not the generated weights'
            total size; the message lists every generated weight's shape and size.
        """
        flat = flatten_examples(flat)
        size = flat.shape[-1]
        if size != self.output_size:
            raise ValueError(
                f"generator {self.generator.name!r} outputs {size} values per example, "
                f"but the weights it generates need {self.output_size}: {self._layout()}. "
                f"Give the generator {self.output_size} outputs (split in that order), or "
                "change Hypernetwork.generate")
        sizes = [int(np.prod(s)) for s in self._shapes.values()]
        parts = tf.split(flat, sizes, axis=-1)
        return {path: tf.reshape(part, [-1, *shape])
                for (path, shape), part in zip(self._shapes.items(), parts)}

    # --- conditioning --------------------------------------------------------------

    def features(self, x: Any) -> tf.Tensor:
        """The encoder's features of a batch of examples, ``[examples, features]``."""
        x = tf.convert_to_tensor(x)
        return flatten_examples(x if self.encoder is None else _run(self.encoder, x))

    def task_embedding(self, support_x: Any, support_y: Any) -> tf.Tensor:
        """The support set's embedding, ``[1, embedding]``; invariant to the order of the
        support examples."""
        if self.pooling == "class_means":
            features = self.features(support_x)                     # [support, d]
            labels = tf.reshape(tf.cast(support_y, tf.int32), [-1])  # [support]
            means = tf.math.unsorted_segment_mean(features, labels, self.num_classes)
            return tf.reshape(means, [1, -1])                        # [1, classes * d]
        x = flatten_examples(support_x)
        pairs = tf.concat([x, tf.cast(flatten_examples(support_y), x.dtype)], axis=-1)
        return tf.reduce_mean(self.features(pairs), axis=0, keepdims=True)  # [1, d]

    def generate(self, conditioning: tf.Tensor) -> Dict[str, tf.Tensor]:
        """Generated weights ``{path: [batch, *shape]}`` from ``[batch, features]``."""
        return self.split(_run(self.generator, conditioning))

    def combine(self, weights: Weights, generated: Dict[str, tf.Tensor]) -> Weights:
        """``weights`` with the generated ones (one example's, no batch axis) in place."""
        combined = dict(weights)
        for path, value in generated.items():
            value = tf.cast(value, weights[path].dtype)
            combined[path] = value if self.mode == "replace" else weights[path] + value
        return combined

    # --- the adapter interface -----------------------------------------------------

    def build(self, model: keras.Model, weights: Weights) -> None:
        """Records the generated weights' shapes, builds an unbuilt encoder or generator
        on a dummy batch shaped like the model's input (creating their variables under
        whatever scope is active) and checks the generator's output size."""
        self._shapes = {p: tuple(int(d) for d in weights[p].shape)
                        for p in self.target_paths(weights)}
        if self.pooling == "class_means" and self.condition == "support" and \
                self.num_classes is None:
            try:
                self.num_classes = int(model.outputs[0].shape[-1])
            except (AttributeError, IndexError, TypeError, ValueError):
                raise ValueError("Hypernetwork(pooling='class_means') needs num_classes: "
                                 f"the model {model.name!r} has no static output shape")
        if self.then is not None and not self.then.built:
            self.then.build(model, weights)
        dummy_x = self._dummy(model, "inputs")
        if dummy_x is None:
            unbuilt = [m.name for m in (self.encoder, self.generator)
                       if m is not None and not m.built]
            if unbuilt:
                raise ValueError(f"cannot build {unbuilt} for model {model.name!r}, whose "
                                 "input shape is unknown: build them first")
        else:  # dummy forward: builds, and checks the generator's output size now
            if self.condition == "input":
                self.generate(self.features(dummy_x))
            else:
                count = self.num_classes or 1
                x = tf.repeat(dummy_x, count, axis=0)
                if self.pooling == "class_means":
                    y = tf.range(count)
                else:
                    y = tf.repeat(self._dummy(model, "outputs"), count, axis=0)
                self.generate(self.task_embedding(x, y))
        super().build(model, weights)

    @staticmethod
    def _dummy(model: keras.Model, which: str) -> Optional[tf.Tensor]:
        try:
            spec = getattr(model, which)[0]
            shape = [1] + [int(d) for d in spec.shape[1:]]
        except (AttributeError, IndexError, TypeError, ValueError):
            return None
        return tf.zeros(shape, spec.dtype)

    def own_meta_variables(self) -> List[keras.Variable]:
        """The encoder's and generator's trainable variables (``then``'s come with it,
        as a part)."""
        found = []
        for model in (self.encoder, self.generator):
            found += list(model.trainable_variables) if model is not None else []
        return found

    def adapt(self, weights: Weights, support_x: Any, support_y: Any, loss_fn: LossFn,
              steps: Optional[int] = None) -> Weights:
        """Generated weights for the task (``condition="support"``), then ``then``'s
        steps from them. With ``condition="input"`` the weights are generated in
        :meth:`forward`, per example, and only ``then`` (if any) changes ``weights``."""
        if self.condition == "support":
            generated = self.generate(self.task_embedding(support_x, support_y))
            weights = self.combine(weights, {p: g[0] for p, g in generated.items()})
        if self.then is not None:
            return self.then.adapt(weights, support_x, support_y, loss_fn, steps=steps)
        if steps:
            raise ValueError(f"Hypernetwork without then= takes no inner steps, got "
                             f"steps={steps}; give then=GradientDescent(...) for steps")
        return dict(weights)

    def task_state(self, weights: Weights, support_x: Any, support_y: Any,
                   loss_fn: LossFn) -> Dict[str, Any]:
        """``then``'s task state (none without it)."""
        return self.then.task_state(weights, support_x, support_y, loss_fn) \
            if self.then is not None else {}

    def forward(self, call: CallFn, weights: Weights, x: Any,
                state: Optional[Dict[str, Any]] = None) -> Any:
        """Per-example generated weights with ``condition="input"``: example ``i`` is run
        with the weights generated from ``x[i]`` (vectorised over the batch); otherwise
        the ordinary forward (of ``then``, if any, with the task's ``state``)."""
        if self.condition != "input":
            if self.then is None:
                return call(weights, x)
            return self.then.forward(call, weights, x) if state is None \
                else self.then.forward(call, weights, x, state=state)
        x = tf.convert_to_tensor(x)
        generated = self.generate(self.features(x))                # {path: [batch, ...]}

        def one_example(args):
            x_i, generated_i = args
            outputs = call(self.combine(weights, generated_i), x_i[None])
            return tf.nest.map_structure(lambda t: t[0], outputs)

        return tf.vectorized_map(one_example, (x, generated))
