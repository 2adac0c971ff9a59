"""Neural processes: model-based learners that read the support set in one forward pass.

A neural process (Garnelo et al., 2018; Kim et al., 2019) has no inner loop: an encoder
reads the support set (the *context*) and a decoder predicts each query from the query
input and a representation of the context. Here it is an :class:`Adapter` of an
ordinary :class:`~metalearn.Learner`:

* the learner's **model is the decoder**, any unmodified Keras model from
  ``[x, r]`` (the flattened query input concatenated with its representation) to the
  prediction: ``2 * outputs`` values for a Gaussian (mean and raw scale), or the raw
  output (logits, for classification);
* :meth:`NeuralProcess.task_state` **encodes the support set**: the learner's
  :class:`~metalearn.learners.Adapted` holds the model's weights unchanged and, in its
  ``state`` under :data:`CONTEXT`, the encoded context (a pooled representation for the
  CNP, keys and values for the attentive NP). No weight is changed, no gradient step
  taken (:meth:`NeuralProcess.adapt` gives the weights as they are);
* :meth:`NeuralProcess.forward` (which ``Learner.forward``, so ``predict``, goes
  through) **conditions the decoder** on that context: it computes each query's
  representation and runs the decoder on ``[x, r]``, and with ``output="gaussian"``
  returns a :class:`~metalearn.functional.Gaussian` (mean, and scale
  ``min_scale + (1 - min_scale) * softplus(raw)``).

So the query loss is the negative log-likelihood
(:func:`~metalearn.functional.gaussian_nll`, ``Learner.loss``) and evaluation reports
it with the squared error of the mean (:func:`~metalearn.functional.predictive_mse`, a
metric), each with intervals, like any learner; MAML and a neural process run on the
same episodes under one sweep. The encoder (and the attention) are the adapter's
meta-variables; the decoder's are the learner's model weights. There is no inner loop,
so the meta-gradient is the plain gradient of the query loss (second order is trivially
exact).

The support set may have any size, none included: an empty context (or one of padding
alone) is the representation of no evidence (zeros for the CNP's mean, the attention
over no pair for the attentive NP), so the prediction is the decoder's prior, finite.
Padded episodes (:class:`~metalearn.tasks.MaskedLabels` support labels, from a
variable-way variable-shot sampler, or real targets padded by
:func:`~metalearn.tasks.pad_episodes`) leave their padding out of the pooling and the
attention. Integer labels (classification) are one-hot encoded for the encoder, with
``num_classes`` classes (by default the decoder's outputs).

Before the work, each task's memory estimate (:meth:`NeuralProcess.memory_estimate`; the
attentive NP's ``[targets, context]`` matrices per head are its largest term) is held
to ``memory_budget`` (by default this machine's memory): a task that would not fit is
refused with :class:`~metalearn.functional.memory.MemoryBudgetError` naming the sizes,
the estimate and the limit, instead of the process being killed.

:class:`LatentNeuralProcess` adds the NP's global latent ``z`` (Garnelo et al., 2018b):
its prediction reads the prior's mean ``z``; its loss, the negative ELBO with the
posterior given the query targets, is :class:`~metalearn.learners.LatentNeuralProcessLearner`'s.
"""

from __future__ import annotations

import abc
from typing import Any, Dict, List, Optional, Tuple

import gin
import keras
import tensorflow as tf

from metalearn import functional
from metalearn.adapters.base import Adapter
from metalearn.adapters.hypernetwork import flatten_examples as flat
from metalearn.functional import Gaussian, Weights, memory
from metalearn.pieces import COUNT, DECAY, CallFn, Capabilities, LossFn, check_range
from metalearn.tasks.episode import unmask

CONTEXT = "context"
"""The key of :attr:`metalearn.learners.Adapted.state` under which a model-based
adapter (a neural process, :class:`~metalearn.adapters.InContext`) keeps a task's
encoded support set: tensors by name."""

OUTPUTS = ("gaussian", "raw")
ATTENTION_COPIES = 3
"""``[targets, context]`` matrices per attention head that a task's memory estimate
counts: the scores, the masked scores and the weights (the backward pass keeps them)."""


def last_size(tensors: Any, what: str) -> int:
    """The static last dimension of a built Keras model's (single) input or output."""
    shapes = [t.shape for t in tf.nest.flatten(tensors)]
    if len(shapes) != 1 or shapes[0][-1] is None:
        raise ValueError(f"{what} must be one tensor with a known last dimension, got "
                         f"shapes {[tuple(s) for s in shapes]}")
    return int(shapes[0][-1])


def context_of(state: Optional[Dict[str, Any]]) -> Dict[str, tf.Tensor]:
    """The encoded context in a task's state (:data:`CONTEXT`), ``{}`` where there is
    none (the support forward pass, or a state without one)."""
    return dict((state or {}).get(CONTEXT) or {})


def pooled(features: tf.Tensor, mask: tf.Tensor) -> tf.Tensor:
    """The mean of ``features [examples, d]`` over the real examples (``mask``): ``[d]``;
    zeros where there is none (an empty context, or one of padding alone: the
    representation of no evidence, as the attentive NP's mix of no values is; the
    prediction is then the decoder's prior, finite, with a finite gradient)."""
    weights = tf.cast(mask, features.dtype)[:, None]
    return tf.math.divide_no_nan(tf.reduce_sum(features * weights, 0),
                                 tf.reduce_sum(weights))


def encoded_targets(y: Any, classes: Optional[int], dtype: tf.DType, owner: str
                    ) -> Tuple[tf.Tensor, tf.Tensor]:
    """``([examples, targets], [examples] bool mask of real examples)`` of support
    targets ``y``: integer labels one-hot in ``classes`` classes, real targets
    flattened; the padding of :class:`~metalearn.tasks.MaskedLabels` masked out (all
    ``True`` without it).

    Raises:
      tf.errors.InvalidArgumentError: a label outside ``0 .. classes - 1`` (the message
        names ``owner``).
    """
    labels, mask, _ = unmask(y)
    labels = tf.convert_to_tensor(labels)
    if labels.dtype.is_integer:
        labels = tf.reshape(labels, [-1])
        check = tf.debugging.assert_less(
            labels, tf.cast(classes, labels.dtype),
            message=f"{owner}: support labels must be in 0 .. {classes - 1} "
                    f"(num_classes={classes})")
        with tf.control_dependencies([check, tf.debugging.assert_non_negative(
                labels, message=f"{owner}: negative support label")]):
            targets = tf.one_hot(labels, classes, dtype=dtype)
    else:
        targets = tf.cast(flat(labels), dtype)
    if mask is None:
        mask = tf.ones(tf.shape(targets)[:1], tf.bool)
    return targets, mask


def check_task_memory(owner: str, estimate_fn: Any, sizes: Dict[str, Any],
                      budget: Optional[int]) -> List[tf.Operation]:
    """Holds one task's memory estimate to ``budget`` (:func:`metalearn.functional.
    memory.check_budget`; this machine's memory where ``budget`` is ``None``) before the
    work: ``estimate_fn(*sizes.values())`` bytes for the ``sizes`` by what they count
    (``{"context points": 20000, "targets": 50000}``).

    Where every size is static (eager calls, and traced steps on episodes of static
    shapes, as samplers give) the check raises here; where one is only known when the
    graph runs, it returns an assertion to run before the work (an
    ``InvalidArgumentError`` naming the same figures), else ``[]``. XLA drops
    assertions: under ``jit_compile`` only static sizes are checked (the library's
    steps trace on the episodes' static shapes).

    Raises:
      metalearn.functional.memory.MemoryBudgetError: the estimate exceeds the limit.
    """
    values = list(sizes.values())
    if all(isinstance(v, int) for v in values):
        words = ", ".join(f"{value} {name}" for name, value in sizes.items())
        memory.check_budget(owner, int(estimate_fn(*values)), words, budget)
        return []
    limit = memory.machine_memory() if budget is None else int(budget)
    if limit is None:
        return []
    dynamic = [tf.cast(v, tf.float64) for v in values]  # no integer overflow
    estimate = estimate_fn(*dynamic)
    what = "memory_budget" if budget is not None else "this machine's memory"
    message = (f"{owner}: the estimated memory of one task (bytes, then the "
               f"{', '.join(sizes)}) exceeds the limit of {memory.describe_bytes(limit)} "
               f"({what}); use a smaller context or fewer targets, or raise "
               f"{owner}.memory_budget")
    return [tf.debugging.Assert(tf.less_equal(estimate, float(limit)),
                                [message, estimate, *dynamic], summarize=8)]


def static_size(tensor: tf.Tensor) -> Any:
    """The leading size of ``tensor``: an int where static, else a scalar tensor."""
    size = tensor.shape[0]
    return int(size) if size is not None else tf.shape(tensor)[0]


def model_bytes(model: keras.Model, inputs: int) -> int:
    """One example's activation bytes through ``model`` (reading ``inputs`` values),
    0 where they cannot be estimated."""
    return memory.activation_bytes(model, (inputs,)) or 0


def gaussian_outputs(outputs: tf.Tensor, min_scale: float) -> Gaussian:
    """The Gaussian of ``2 * k`` raw outputs: the first half the mean, the second the
    scale ``min_scale + (1 - min_scale) * softplus(raw)``."""
    mean, raw = tf.split(outputs, 2, axis=-1)
    return Gaussian(mean, min_scale + (1.0 - min_scale) * tf.nn.softplus(raw))


class NeuralProcess(Adapter, abc.ABC):
    """The shared part of neural processes: encoding, the decoder's input, the output.

    Subclasses say what the context is (:meth:`encode`) and how a query reads it
    (:meth:`condition`).

    Args:
      encoder: a built Keras model from a support pair ``[x, y]`` (flattened input
        concatenated with the target, or the one-hot label) to its representation
        ``[examples, r]``.
      output: ``"gaussian"`` (the decoder gives ``2 * outputs`` values: mean and raw
        scale; predictions are :class:`~metalearn.functional.Gaussian`) or ``"raw"``
        (the decoder's output as it is, e.g. logits).
      min_scale: the smallest predicted scale (``"gaussian"``), in ``[0, 1)``.
      num_classes: classes of integer labels (one-hot for the encoder); defaults to the
        decoder's number of outputs.
      memory_budget: what one task's work may take: bytes, or a size such as
        ``"2GiB"`` (parsed as ``Auto.memory_budget`` is); ``None``: this machine's
        memory. A task whose estimate (:meth:`memory_estimate`) exceeds it is refused
        before the work (:class:`~metalearn.functional.memory.MemoryBudgetError`).
    """

    steps = 0

    def __init__(self, encoder: keras.Model = gin.REQUIRED, output: str = "gaussian",
                 min_scale: float = 0.01, num_classes: Optional[int] = None,
                 memory_budget: Optional[Any] = None, name: Optional[str] = None):
        super().__init__(name=name)
        if not isinstance(encoder, keras.Model):
            raise TypeError(f"{type(self).__name__} encoder must be a built keras.Model, "
                            f"got {encoder!r}")
        if output not in OUTPUTS:
            raise ValueError(f"{type(self).__name__} output must be one of {OUTPUTS}, got "
                             f"{output!r}")
        min_scale = check_range(type(self).__name__, "min_scale", min_scale, DECAY)
        if num_classes is not None:
            num_classes = check_range(type(self).__name__, "num_classes", num_classes,
                                      COUNT)
        self.encoder = encoder  # an attribute of a tf.Module: tracked by checkpoints
        self.output = output
        self.min_scale = float(min_scale)
        self.num_classes = None if num_classes is None else int(num_classes)
        self.memory_budget = memory.parse_memory(memory_budget)
        self.x_size = self.y_size = self.representation_size = None
        self.bytes_per_context = self.bytes_per_target = 0

    def own_capabilities(self) -> Capabilities:
        return Capabilities(task_axis=False)  # one task's support set at a time

    def own_meta_variables(self) -> List[keras.Variable]:
        return list(self.encoder.trainable_variables)

    # --- sizes ---------------------------------------------------------------------

    def build(self, model: keras.Model, weights: Weights) -> None:
        """Reads the sizes from the encoder and the decoder (``model``) and checks that
        they fit: encoder input ``x + y``, encoder output ``r``, decoder input ``x + r``,
        decoder output ``2 y`` (``"gaussian"``) or ``y`` / ``num_classes`` (``"raw"``).

        Raises:
          ValueError: naming the sizes that do not fit.
        """
        functional.check_built(self.encoder)
        name = type(self).__name__
        encoder_in = last_size(self.encoder.inputs, f"{name}'s encoder input")
        self.representation_size = last_size(self.encoder.outputs,
                                             f"{name}'s encoder output")
        decoder_in = last_size(model.inputs, f"{name}'s decoder (the learner's model) input")
        decoder_out = last_size(model.outputs, f"{name}'s decoder output")
        if self.output == "gaussian":
            if decoder_out % 2:
                raise ValueError(f"{name}(output='gaussian'): the decoder {model.name!r} "
                                 f"gives {decoder_out} values, but a Gaussian needs a mean "
                                 "and a scale per output: 2 * outputs values")
            self.y_size = decoder_out // 2
        else:
            self.num_classes = self.num_classes or decoder_out
            self.y_size = self.num_classes
        self.x_size = encoder_in - self.y_size
        extra, what = self.extra_inputs()
        need = self.x_size + self.representation_size + extra
        if self.x_size < 1 or decoder_in != need:
            raise ValueError(
                f"{name}: the encoder {self.encoder.name!r} reads {encoder_in} values per "
                f"pair [x, y] and gives r of {self.representation_size}; the decoder "
                f"{model.name!r} reads {decoder_in} and gives {decoder_out}, so y has "
                f"{self.y_size} values and x {self.x_size}: the decoder must read x + r"
                f"{what} = {need} values")
        self.bytes_per_context = self.encoding_bytes()
        self.bytes_per_target = model_bytes(model, decoder_in)
        super().build(model, weights)

    # --- memory ----------------------------------------------------------------------

    def encoding_bytes(self) -> int:
        """One support pair's activation bytes through the encoder(s)."""
        return model_bytes(self.encoder, self.x_size + self.y_size)

    def memory_estimate(self, context: Any, targets: Any) -> Any:
        """The bytes one task's work keeps alive for its meta-gradient: the encoder's
        activations for each of ``context`` support pairs and the decoder's for each of
        ``targets`` queries (ints, or float tensors while a graph runs). Subclasses add
        what grows with both (the attentive NP's attention)."""
        return context * self.bytes_per_context + targets * self.bytes_per_target

    def check_memory(self, context: Any, targets: Optional[Any] = None
                     ) -> List[tf.Operation]:
        """Refuses a task whose :meth:`memory_estimate` exceeds ``memory_budget`` before
        its work (:func:`check_task_memory`): raises where the sizes are static, else
        returns the assertion to run first. ``targets=None``: the support set's
        encoding alone (before any query is known)."""
        if targets is None:
            return check_task_memory(type(self).__name__,
                                     lambda c: self.memory_estimate(c, 0),
                                     {"context points": context}, self.memory_budget)
        return check_task_memory(type(self).__name__, self.memory_estimate,
                                 {"context points": context, "targets": targets},
                                 self.memory_budget)

    def extra_inputs(self) -> Tuple[int, str]:
        """Values the decoder reads besides ``[x, r]`` (and how messages name them)."""
        return 0, ""

    # --- the context -----------------------------------------------------------------

    def pairs(self, x: Any, y: Any) -> Tuple[tf.Tensor, tf.Tensor]:
        """``([examples, x + y] support pairs, [examples] bool mask of real examples)``:
        integer labels one-hot (padding of :class:`~metalearn.tasks.MaskedLabels`
        masked out; :func:`encoded_targets`).

        Raises:
          tf.errors.InvalidArgumentError: a label outside ``0 .. num_classes - 1``.
        """
        x = flat(x)
        targets, mask = encoded_targets(y, self.num_classes or self.y_size, x.dtype,
                                        type(self).__name__)
        return tf.concat([x, targets], axis=-1), mask

    def representations(self, pairs: tf.Tensor) -> tf.Tensor:
        """The encoder's ``[examples, r]`` of support pairs, nothing assigned."""
        return functional.call(self.encoder, {}, pairs, training=True)

    @abc.abstractmethod
    def encode(self, support_x: Any, support_y: Any) -> Dict[str, tf.Tensor]:
        """One task's context: tensors by name (kept under :data:`CONTEXT` of the
        task's state)."""

    @abc.abstractmethod
    def condition(self, context: Dict[str, tf.Tensor], x: tf.Tensor) -> tf.Tensor:
        """Each query's representation ``[queries, r]`` from the context and the
        flattened queries ``x [queries, features]``."""

    # --- the adapter interface -------------------------------------------------------

    def adapt(self, weights: Weights, support_x: Any, support_y: Any, loss_fn: LossFn,
              steps: Optional[int] = None) -> Weights:
        """``weights`` unchanged (the encoded support set is the task's state:
        :meth:`task_state`).

        Raises:
          ValueError: ``steps`` other than 0 or None (a neural process takes no inner
            steps; evaluate it with ``evaluate.inner_steps = (0,)``).
        """
        if steps:
            raise ValueError(f"{type(self).__name__} takes no inner steps (it reads the "
                             f"support set in one forward pass), got steps={steps}; "
                             "evaluate it with evaluate.inner_steps = (0,)")
        return dict(weights)

    def task_state(self, weights: Weights, support_x: Any, support_y: Any,
                   loss_fn: LossFn) -> Dict[str, Any]:
        """``{CONTEXT: the encoded support set}`` (:meth:`encode`).

        Raises:
          metalearn.functional.memory.MemoryBudgetError: the encoding's
            :meth:`memory_estimate` exceeds ``memory_budget`` (before it runs).
        """
        context = static_size(tf.nest.flatten(support_x)[0])
        with tf.control_dependencies(self.check_memory(context)):
            return {CONTEXT: self.encode(support_x, support_y)}

    def context_size(self, context: Dict[str, tf.Tensor]) -> Any:
        """Support pairs an encoded context holds, as :meth:`forward`'s memory check
        counts them: 0 for a pooled context (its encoding was checked when
        :meth:`task_state` made it; a query reads one vector of it)."""
        return 0

    def forward(self, call: CallFn, weights: Weights, x: Any,
                state: Optional[Dict[str, Any]] = None) -> Any:
        """The decoder on ``[x, r(x)]``, with ``r`` read from the context in the task's
        ``state``; a :class:`~metalearn.functional.Gaussian` with ``output="gaussian"``.

        Raises:
          ValueError: no context in ``state`` (predictions need what ``adapt`` gives:
            ``learner.predict(learner.adapt(support_x, support_y), x)``).
          metalearn.functional.memory.MemoryBudgetError: the task's
            :meth:`memory_estimate` for this context and these queries exceeds
            ``memory_budget`` (before any query is read).
        """
        context = context_of(state)
        if not context:
            raise ValueError(f"{type(self).__name__}.forward needs the task's encoded "
                             f"support set (Adapted.state[{CONTEXT!r}], what "
                             "learner.adapt(support_x, support_y) gives); got the model's "
                             f"weights alone {sorted(weights)[:4]}")
        x = flat(x)
        with tf.control_dependencies(self.check_memory(self.context_size(context),
                                                       static_size(x))):
            r = tf.cast(self.condition(context, x), x.dtype)
            return self.distribution(call(weights, tf.concat([x, r], axis=-1)))

    def distribution(self, outputs: tf.Tensor) -> Any:
        """The prediction from the decoder's output: a Gaussian of its two halves (the
        second one made positive, :func:`gaussian_outputs`), or the output itself
        (``"raw"``)."""
        if self.output == "raw":
            return outputs
        return gaussian_outputs(outputs, self.min_scale)


@gin.configurable
class ConditionalNeuralProcess(NeuralProcess):
    """The CNP (Garnelo et al., 2018): the context is the mean of the encoder's
    representations of the support pairs, the same ``r`` for every query; invariant to
    the support set's order. Arguments as :class:`NeuralProcess`.

    Example (sinusoids: x and y of one value, r of 64)::

        encoder = metalearn.models.mlp((2,), hidden=(64, 64), outputs=64, name="encoder")
        decoder = metalearn.models.mlp((1 + 64,), hidden=(64, 64), outputs=2, name="decoder")
        learner = metalearn.Learner(decoder, ConditionalNeuralProcess(encoder),
                                    loss=gaussian_nll, metrics={"mse": predictive_mse})
    """

    def encode(self, support_x: Any, support_y: Any) -> Dict[str, tf.Tensor]:
        pairs, mask = self.pairs(support_x, support_y)
        return {"representation": pooled(self.representations(pairs), mask)}

    def condition(self, context: Dict[str, tf.Tensor], x: tf.Tensor) -> tf.Tensor:
        r = context["representation"]
        return tf.tile(r[None], [tf.shape(x)[0], 1])


@gin.configurable
class AttentiveNeuralProcess(NeuralProcess):
    """The deterministic path of the attentive NP (Kim et al., 2019; no latent path):
    each query attends to the support set, keys the support inputs, values their
    encoder representations, through a Keras ``MultiHeadAttention`` layer (learned
    linear projections of queries, keys and values, ``heads`` heads of ``key_size``,
    output of the representation's size). Invariant to the support set's order.

    Args:
      heads: attention heads.
      key_size: size of each head's queries and keys (and values); defaults to
        ``r // heads`` (at least 1).
      encoder, output, min_scale, num_classes, memory_budget: as
        :class:`NeuralProcess`; the attention's ``[targets, context]`` matrices, one
        per head, are the estimate's largest term (:meth:`memory_estimate`).
    """

    def __init__(self, encoder: keras.Model = gin.REQUIRED, heads: int = 4,
                 key_size: Optional[int] = None, output: str = "gaussian",
                 min_scale: float = 0.01, num_classes: Optional[int] = None,
                 memory_budget: Optional[Any] = None, name: Optional[str] = None):
        super().__init__(encoder, output=output, min_scale=min_scale,
                         num_classes=num_classes, memory_budget=memory_budget, name=name)
        self.heads = check_range(type(self).__name__, "heads", heads, COUNT)
        self.key_size = None if key_size is None else check_range(
            type(self).__name__, "key_size", key_size, COUNT)
        self.attention: Optional[keras.Model] = None

    def build(self, model: keras.Model, weights: Weights) -> None:
        """Sizes (:meth:`NeuralProcess.build`), then the attention model: inputs
        queries ``[1, queries, x]``, keys ``[1, support, x]``, values
        ``[1, support, r]`` and the mask ``[1, queries, support]``."""
        super().build(model, weights)
        dtype = self.encoder.inputs[0].dtype
        r = self.representation_size
        key_size = self.key_size or max(1, r // self.heads)
        attention = keras.layers.MultiHeadAttention(
            self.heads, key_size, output_shape=r, dtype=dtype, name="cross_attention")
        queries = keras.Input((None, self.x_size), dtype=dtype, name="queries")
        keys = keras.Input((None, self.x_size), dtype=dtype, name="keys")
        values = keras.Input((None, r), dtype=dtype, name="values")
        mask = keras.Input((None, None), dtype="bool", name="mask")
        self.attention = keras.Model(
            [queries, keys, values, mask],
            attention(queries, values, key=keys, attention_mask=mask),
            name=f"{self.name}_attention")

    def memory_estimate(self, context: Any, targets: Any) -> Any:
        """:meth:`NeuralProcess.memory_estimate` plus the attention: per head,
        :data:`ATTENTION_COPIES` ``[targets, context]`` matrices (the scores, the masked
        scores, the weights; the backward pass keeps them) and the ``[targets, context]``
        mask, and each head's projections of the queries, keys and values."""
        key_size = self.key_size or max(1, (self.representation_size or 1) // self.heads)
        size = tf.as_dtype(self.encoder.inputs[0].dtype).size
        matrices = self.heads * ATTENTION_COPIES * context * targets * size + \
            context * targets
        projections = self.heads * key_size * (targets + 2 * context) * size
        return super().memory_estimate(context, targets) + matrices + projections

    def context_size(self, context: Dict[str, tf.Tensor]) -> Any:
        """The support pairs each query attends to (padding included)."""
        return static_size(context["keys"])

    def own_meta_variables(self) -> List[keras.Variable]:
        found = super().own_meta_variables()
        return found + (list(self.attention.trainable_variables)
                        if self.attention is not None else [])

    def encode(self, support_x: Any, support_y: Any) -> Dict[str, tf.Tensor]:
        pairs, mask = self.pairs(support_x, support_y)
        return {"keys": flat(support_x), "values": self.representations(pairs),
                "mask": mask}

    def condition(self, context: Dict[str, tf.Tensor], x: tf.Tensor) -> tf.Tensor:
        """Each query's attention over the real support pairs; where there is none (an
        empty context, or one of padding alone) the attention over no pair, as for an
        empty support set (a softmax over masked keys alone would spread over the
        padding)."""
        keys = tf.cast(context["keys"], x.dtype)
        values = context["values"]
        mask = tf.tile(context["mask"][None, None, :], [1, tf.shape(x)[0], 1])
        attended = functional.call(self.attention, {}, [x[None], keys[None],
                                                        values[None], mask])[0]
        if keys.shape[0] == 0:
            return attended
        nothing = functional.call(self.attention, {}, [
            x[None], keys[None, :0], values[None, :0], mask[:, :, :0]])[0]
        return tf.where(tf.reduce_any(context["mask"]), attended, nothing)


LATENT_SCALE_FLOOR = 0.1  # sigma = 0.1 + 0.9 sigmoid(raw), as in Le et al. (2018)


@gin.configurable
class LatentNeuralProcess(ConditionalNeuralProcess):
    """The NP with a global latent ``z`` beside the CNP's deterministic path: a latent
    encoder maps each support pair to ``2 * z`` values, mean-pooled into the mean and
    raw scale of ``q(z | context) = N(mu, sigma**2)`` (``sigma = 0.1 + 0.9 sigmoid(raw)``);
    the decoder reads ``[x, r, z]``.

    :meth:`adapt` gives the context ``r`` and the prior ``q(z | support)``; prediction
    uses the prior's mean ``z`` (one Gaussian, not the mixture over ``z``). Meta-train
    it with :class:`~metalearn.learners.LatentNeuralProcessLearner`, whose loss is the
    negative ELBO (the posterior ``q(z | support and query)``, one reparameterised
    sample of ``z``, the KL divergence to the prior in closed form).

    Args:
      latent_encoder: a built Keras model from a support pair ``[x, y]`` to ``2 * z``
        values.
      encoder, output, min_scale, num_classes, memory_budget: as :class:`NeuralProcess`.
    """

    def __init__(self, encoder: keras.Model = gin.REQUIRED,
                 latent_encoder: keras.Model = gin.REQUIRED, output: str = "gaussian",
                 min_scale: float = 0.01, num_classes: Optional[int] = None,
                 memory_budget: Optional[Any] = None, name: Optional[str] = None):
        super().__init__(encoder, output=output, min_scale=min_scale,
                         num_classes=num_classes, memory_budget=memory_budget, name=name)
        if not isinstance(latent_encoder, keras.Model):
            raise TypeError(f"LatentNeuralProcess latent_encoder must be a built "
                            f"keras.Model, got {latent_encoder!r}")
        self.latent_encoder = latent_encoder
        self.latent_size = None

    def extra_inputs(self) -> Tuple[int, str]:
        functional.check_built(self.latent_encoder)
        size = last_size(self.latent_encoder.outputs, "LatentNeuralProcess's latent encoder "
                                                      "output")
        if size % 2:
            raise ValueError(f"LatentNeuralProcess: the latent encoder "
                             f"{self.latent_encoder.name!r} gives {size} values, but z needs "
                             "a mean and a scale: 2 * z values")
        self.latent_size = size // 2
        return self.latent_size, " + z"

    def own_meta_variables(self) -> List[keras.Variable]:
        return super().own_meta_variables() + list(self.latent_encoder.trainable_variables)

    def encoding_bytes(self) -> int:
        """One support pair's activation bytes through both encoders."""
        return super().encoding_bytes() + model_bytes(self.latent_encoder,
                                                      self.x_size + self.y_size)

    def latent(self, x: Any, y: Any) -> Gaussian:
        """``q(z | pairs)``: the Gaussian over ``z`` of the pairs ``(x, y)``, ``[z]`` each."""
        pairs, mask = self.pairs(x, y)
        features = functional.call(self.latent_encoder, {}, pairs, training=True)
        mean, raw = tf.split(pooled(features, mask), 2, axis=-1)
        return Gaussian(mean, LATENT_SCALE_FLOOR + (1 - LATENT_SCALE_FLOOR) * tf.sigmoid(raw))

    def encode(self, support_x: Any, support_y: Any) -> Dict[str, tf.Tensor]:
        prior = self.latent(support_x, support_y)
        return {**super().encode(support_x, support_y), "latent": prior.mean,
                "prior_mean": prior.mean, "prior_scale": prior.scale}

    def condition(self, context: Dict[str, tf.Tensor], x: tf.Tensor) -> tf.Tensor:
        z = tf.tile(context["latent"][None], [tf.shape(x)[0], 1])
        return tf.concat([super().condition(context, x), tf.cast(z, x.dtype)], axis=-1)


def gaussian_kl(q: Gaussian, p: Gaussian) -> tf.Tensor:
    """``KL(q || p)`` of diagonal Gaussians, summed over the last axis."""
    ratio = tf.square(q.scale / p.scale)
    return 0.5 * tf.reduce_sum(ratio + tf.square((q.mean - p.mean) / p.scale) - 1.0
                               - tf.math.log(ratio), axis=-1)
