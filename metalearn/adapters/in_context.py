"""The in-context adapter: a transformer reads the support set and the queries together.

A model-based learner for classification and regression in the spirit of SNAIL, CAML
(Fifty et al., 2024) and TabPFN: no inner loop, the task is learned *in context*. Here
it is an :class:`Adapter` of an ordinary :class:`~metalearn.Learner`:

* the learner's **model is the embedding network**, any unmodified Keras model from an
  input to a vector (an MLP, ``models.conv_net``, ``models.resnet12``; its last layer's
  outputs are the embedding);
* :meth:`InContext.adapt` **embeds the support set** (the model's outputs on it, through
  the learner's support forward pass, so BatchNorm sees the support batch as in the
  other learners): the model's weights stay as they are and the task's state
  (:class:`~metalearn.learners.Adapted`, under
  :data:`~metalearn.adapters.neural_process.CONTEXT`) holds the support embeddings,
  their label features and the mask of real (unpadded) examples (:meth:`InContext.task_state`);
* :meth:`InContext.forward` (which ``Learner.predict`` goes through) embeds the queries
  and runs the **sequence model** over ``[support tokens, query tokens]``. A support
  token is ``W_x e + W_y [onehot(y), 0] + b`` (``e`` the embedding; for regression the
  targets in place of the one-hot), a query token ``W_x e + W_y [0, ..., 0, 1] + b``:
  the last row of ``W_y`` is the learned "unknown label" token. Transformer blocks
  (pre-norm: ``LayerNormalization``, ``MultiHeadAttention``, a two-layer ``Dense`` MLP,
  residual connections) then a final norm and a ``Dense`` read-out give each query's
  logits (``ways``), targets, or a :class:`~metalearn.functional.Gaussian`.

**A head as the read-out** (``head=``, e.g. ``InContext.head = @PrototypeHead()``): in
place of the ``Dense`` read-out, any :class:`~metalearn.heads.Head` is fitted on the
transformer's outputs at the support tokens (after the final norm, ``width`` values
each) with the support labels and classifies the outputs at the query tokens: with
:class:`~metalearn.heads.PrototypeHead` a query's logits are its negative squared
distances to the class means of the transformed support tokens, ProtoNets' read-out
over embeddings that have read the whole support set. The head's own meta-variables (a
learned scale) are meta-learned with the transformer's.

The attention mask (:func:`attention_mask`) lets a support token attend to the support
tokens only, and a query token to the support tokens and itself, never to another
query: each query's prediction is a function of the support set and that query alone
(the queries are independent, as they are for a learner with adapted weights; a
BatchNorm embedding in training mode still couples them through its batch statistics,
as in every learner). There is no positional encoding, so the prediction is invariant
to the order of the support set. Padded support examples
(:class:`~metalearn.tasks.MaskedLabels`) are masked out of every attention.

The meta-variables are the embedding's weights (the learner's model) and the
transformer's (this adapter's); the meta-gradient is the plain gradient of the query
loss (no inner loop: second order is trivially exact). It composes as the ``then=`` of
:class:`~metalearn.adapters.Hypernetwork` (weights of the embedding generated from the
support set, then read in context; tests/algorithms_contract_test.py checks the pair's
meta-gradient under every formulation).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import gin
import keras
import tensorflow as tf

from metalearn import functional
from metalearn.adapters.base import Adapter
from metalearn.adapters.hypernetwork import flatten_examples as flat
from metalearn.adapters.neural_process import (ATTENTION_COPIES, CONTEXT, OUTPUTS,
                                              check_task_memory, context_of,
                                              encoded_targets, gaussian_outputs, last_size,
                                              static_size)
from metalearn.functional import Weights, memory
from metalearn.heads.base import Head
from metalearn.pieces import COUNT, CallFn, Capabilities, LossFn, SplitLoss, check_range
from metalearn.tasks.episode import MaskedLabels, unmask

PREFIX = "in_context_"
"""Prefix of the transformer's layer names (so its variable paths never meet a model's)."""


def attention_mask(support_mask: tf.Tensor, queries: Any) -> tf.Tensor:
    """The ``[support + queries, support + queries]`` boolean mask of the sequence
    ``[support tokens, query tokens]``: row ``i`` may attend to column ``j`` where
    ``True``. Support rows see the real support columns (``support_mask [support]``,
    ``False`` for padding); query rows see the real support columns and their own
    column, no other query's."""
    support_mask = tf.convert_to_tensor(support_mask, tf.bool)
    m = tf.shape(support_mask)[0]
    n = tf.convert_to_tensor(queries, tf.int32)
    support_rows = tf.concat([tf.tile(support_mask[None], [m, 1]),
                              tf.zeros([m, n], tf.bool)], axis=1)
    query_rows = tf.concat([tf.tile(support_mask[None], [n, 1]),
                            tf.cast(tf.eye(n), tf.bool)], axis=1)
    return tf.concat([support_rows, query_rows], axis=0)


@gin.configurable
class InContext(Adapter):
    """A transformer over the support set and the queries (see the module's text).

    Example (5-way classification over the conv net's 64 features)::

        embedding = metalearn.models.omniglot_conv_net(outputs=64)
        learner = metalearn.Learner(embedding, InContext(ways=5), loss=cross_entropy,
                                    metrics={"accuracy": "accuracy"})
        context = learner.adapt(support_x, support_y)   # Adapted: weights, state["context"]
        logits = learner.predict(context, query_x)      # [queries, 5]

    Args:
      ways: classification with integer labels ``0 .. ways - 1``: the read-out gives
        ``ways`` logits. Give ``ways`` or ``targets``, not both.
      targets: regression with ``targets`` real values per example: the read-out gives
        them (``output="raw"``) or a Gaussian over them (``output="gaussian"``).
      width: the tokens' size.
      depth: transformer blocks.
      heads: attention heads per block.
      key_size: each head's query and key size; defaults to ``width // heads`` (at
        least 1).
      hidden: the blocks' MLP width; defaults to ``2 * width``.
      activation: the blocks' MLP activation (a Keras name).
      output: ``"raw"`` (logits or targets) or ``"gaussian"`` (regression only).
      min_scale: the smallest predicted scale (``"gaussian"``), in ``[0, 1)``.
      head: a :class:`~metalearn.heads.Head` as the read-out (classification only): fitted
        on the transformer's outputs at the support tokens, it gives the logits of the
        outputs at the query tokens; ``None``: the ``Dense`` read-out.
      memory_budget: what one task's work may take: bytes, or a size such as
        ``"2GiB"`` (parsed as ``Auto.memory_budget`` is); ``None``: this machine's
        memory. A task whose estimate (:meth:`memory_estimate`: the attention's
        ``[tokens, tokens]`` matrices per head and block are its largest term) exceeds
        it is refused before the work
        (:class:`~metalearn.functional.memory.MemoryBudgetError`).
    """

    steps = 0

    def __init__(self, ways: Optional[int] = None, targets: Optional[int] = None,
                 width: int = 64, depth: int = 2, heads: int = 4,
                 key_size: Optional[int] = None, hidden: Optional[int] = None,
                 activation: str = "gelu", output: str = "raw", min_scale: float = 0.01,
                 head: Optional[Head] = None, memory_budget: Optional[Any] = None,
                 name: Optional[str] = None):
        super().__init__(name=name)
        if (ways is None) == (targets is None):
            raise ValueError(f"InContext needs ways= (classification) or targets= "
                             f"(regression), exactly one; got ways={ways}, targets={targets}")
        self.ways = None if ways is None else check_range("InContext", "ways", ways, COUNT)
        self.targets = None if targets is None else check_range("InContext", "targets",
                                                                targets, COUNT)
        self.width = check_range("InContext", "width", width, COUNT)
        self.depth = check_range("InContext", "depth", depth, COUNT)
        self.heads = check_range("InContext", "heads", heads, COUNT)
        self.key_size = max(1, self.width // self.heads) if key_size is None else \
            check_range("InContext", "key_size", key_size, COUNT)
        self.hidden = 2 * self.width if hidden is None else check_range(
            "InContext", "hidden", hidden, COUNT)
        keras.activations.get(activation)  # an unknown name fails here, not at build
        self.activation = activation
        if output not in OUTPUTS:
            raise ValueError(f"InContext output must be one of {OUTPUTS}, got {output!r}")
        if output == "gaussian" and self.ways is not None:
            raise ValueError("InContext(output='gaussian') predicts real targets: give "
                             f"targets=, not ways={self.ways}")
        if not 0.0 <= float(min_scale) < 1.0:
            raise ValueError(f"InContext min_scale must be in [0, 1), got {min_scale}")
        if head is not None and not isinstance(head, Head):
            raise TypeError(f"InContext head= must be a metalearn.heads.Head, got {head!r}")
        if head is not None and self.ways is None:
            raise ValueError(f"InContext(head={type(head).__name__}) classifies with the "
                             f"head: give ways=, not targets={self.targets}")
        self.output = output
        self.min_scale = float(min_scale)
        self.head = head
        self.memory_budget = memory.parse_memory(memory_budget)
        self.bytes_per_example = 0
        self.embedding_size: Optional[int] = None
        self.transformer: Optional[keras.Model] = None

    @property
    def label_size(self) -> int:
        """Values of a token's label features: the one-hot (or targets) and the
        "unknown label" flag."""
        return (self.ways or self.targets) + 1

    def own_capabilities(self) -> Capabilities:
        return Capabilities(task_axis=False)  # one task's sequence at a time

    def own_meta_variables(self) -> List[keras.Variable]:
        return list(self.transformer.trainable_variables) if self.transformer else []

    def build(self, model: keras.Model, weights: Weights) -> None:
        """Builds the transformer for the model's embedding: inputs embeddings
        ``[1, tokens, e]``, label features ``[1, tokens, label_size]`` and the mask
        ``[1, tokens, tokens]``; output ``[1, tokens, read-out]`` (with a head: the
        normed tokens ``[1, tokens, width]``, and the head is built in their dtype).

        Raises:
          ValueError: the model has several outputs or no static output size.
        """
        self.embedding_size = last_size(model.outputs, "InContext's embedding (the "
                                                       "learner's model) output")
        dtype = tf.as_dtype(model.variables[0].dtype).name  # a frozen model: no trainable
        layers = keras.layers
        embeddings = keras.Input((None, self.embedding_size), dtype=dtype,
                                 name="embeddings")
        labels = keras.Input((None, self.label_size), dtype=dtype, name="labels")
        mask = keras.Input((None, None), dtype="bool", name="mask")
        h = layers.Add(dtype=dtype, name=PREFIX + "tokens")([
            layers.Dense(self.width, dtype=dtype, name=PREFIX + "embed")(embeddings),
            layers.Dense(self.width, use_bias=False, dtype=dtype,
                         name=PREFIX + "label_embedding")(labels)])
        for i in range(self.depth):
            block = f"{PREFIX}block{i}_"
            a = layers.LayerNormalization(dtype=dtype, name=block + "attention_norm")(h)
            a = layers.MultiHeadAttention(self.heads, self.key_size, dtype=dtype,
                                          name=block + "attention")(a, a, attention_mask=mask)
            h = layers.Add(dtype=dtype, name=block + "attention_residual")([h, a])
            f = layers.LayerNormalization(dtype=dtype, name=block + "mlp_norm")(h)
            f = layers.Dense(self.hidden, activation=self.activation, dtype=dtype,
                             name=block + "mlp_hidden")(f)
            f = layers.Dense(self.width, dtype=dtype, name=block + "mlp_output")(f)
            h = layers.Add(dtype=dtype, name=block + "mlp_residual")([h, f])
        outputs = layers.LayerNormalization(dtype=dtype, name=PREFIX + "final_norm")(h)
        if self.head is None:  # the Dense read-out; a head reads the normed tokens
            readout = self.ways or self.targets * (2 if self.output == "gaussian" else 1)
            outputs = layers.Dense(readout, dtype=dtype, name=PREFIX + "readout")(outputs)
        else:
            self.head.build(tf.as_dtype(dtype))
        self.transformer = keras.Model([embeddings, labels, mask], outputs,
                                       name=f"{self.name}_transformer")
        self.bytes_per_example = memory.activation_bytes(model) or 0
        super().build(model, weights)

    def memory_estimate(self, support: Any, queries: Any) -> Any:
        """The bytes one task's work keeps alive for its meta-gradient, for ``support``
        examples and ``queries`` (ints, or float tensors while a graph runs): the
        embedding's activations of every example; per block, :data:`~metalearn.adapters.
        neural_process.ATTENTION_COPIES` ``[tokens, tokens]`` matrices per head and each
        token's activations (norms, projections, the MLP); the ``[tokens, tokens]``
        mask."""
        tokens = support + queries
        size = tf.as_dtype(self.transformer.inputs[0].dtype).size
        per_token = 6 * self.width + 4 * self.heads * self.key_size + self.hidden
        blocks = self.depth * (self.heads * ATTENTION_COPIES * tokens * tokens
                               + tokens * per_token) * size
        return tokens * self.bytes_per_example + blocks + 2 * tokens * tokens

    # --- the adapter interface -------------------------------------------------------

    def adapt(self, weights: Weights, support_x: Any, support_y: Any, loss_fn: LossFn,
              steps: Optional[int] = None) -> Weights:
        """``weights`` unchanged: the support set is read by :meth:`task_state`.

        Raises:
          ValueError: ``steps`` other than 0 or None; a learner whose support loss is
            not in two halves (``support_objective``), which gives no embedding.
        """
        if steps:
            raise ValueError(f"InContext takes no inner steps (it reads the support set in "
                             f"one forward pass), got steps={steps}; evaluate it with "
                             "evaluate.inner_steps = (0,)")
        self._check_split(loss_fn)
        return dict(weights)

    def _check_split(self, loss_fn: LossFn) -> None:
        if not isinstance(loss_fn, SplitLoss):
            raise ValueError("InContext embeds the support set through the learner's "
                             "support forward pass (support_objective's SplitLoss); this "
                             f"learner overrides support_loss and gives {loss_fn!r}")

    def task_state(self, weights: Weights, support_x: Any, support_y: Any,
                   loss_fn: LossFn) -> Dict[str, Any]:
        """``{CONTEXT: context}``: the support set's ``embeddings [support, e]``,
        ``labels [support, label_size]`` (one-hot or targets, the "unknown" flag 0) and
        ``mask [support]`` (real examples); with a head and padded episodes also the
        task's ``classes [ways]``.

        Raises:
          ValueError: a learner whose support loss is not in two halves.
          TypeError: real targets with ``ways`` (or integer labels with ``targets``).
          ValueError: padded episodes of more ways than ``ways``; padded episodes
            for a head that cannot fit them (``capabilities.padding`` False).
          tf.errors.InvalidArgumentError: a label outside ``0 .. ways - 1`` (an
            episode of more ways than ``ways``).
        """
        self._check_split(loss_fn)
        embeddings = self.embedded(loss_fn.outputs(weights, support_x, support_y))
        labels, mask = self.label_features(support_y, embeddings.dtype)
        context = {"embeddings": embeddings, "labels": labels, "mask": mask}
        classes = unmask(support_y)[2]
        if self.head is not None and classes is not None:
            if not self.head.capabilities.padding:
                raise ValueError(f"InContext's head {type(self.head).__name__} cannot fit "
                                 "padded episodes (MaskedLabels; its capabilities say "
                                 "padding=False): use a head of metalearn.heads or "
                                 "unpadded episodes")
            context["classes"] = tf.reshape(tf.cast(classes, tf.bool), [-1])
        return {CONTEXT: context}

    def forward(self, call: CallFn, weights: Weights, x: Any,
                state: Optional[Dict[str, Any]] = None) -> Any:
        """Each query's prediction from the context in the task's ``state`` (what
        :meth:`task_state` gives): logits ``[queries, ways]``, targets, or a Gaussian.
        Without a context (the support forward pass) the model's output, the
        embedding: what :meth:`task_state` reads the support set with.

        Raises:
          metalearn.functional.memory.MemoryBudgetError: the task's
            :meth:`memory_estimate` exceeds ``memory_budget`` (before the queries are
            embedded).
        """
        context = context_of(state)
        if not context:
            return call(weights, x)
        checks = check_task_memory("InContext", self.memory_estimate, {
            "support examples": static_size(context["embeddings"]),
            "queries": static_size(tf.nest.flatten(x)[0])}, self.memory_budget)
        with tf.control_dependencies(checks):
            return self._predict(call, weights, x, context)

    def _predict(self, call: CallFn, weights: Weights, x: Any,
                 context: Dict[str, tf.Tensor]) -> Any:
        queries = self.embedded(call(weights, x))
        support = tf.cast(context["embeddings"], queries.dtype)
        m, n = tf.shape(support)[0], tf.shape(queries)[0]
        unknown = tf.one_hot(tf.fill([n], self.label_size - 1), self.label_size,
                             dtype=queries.dtype)
        labels = tf.concat([tf.cast(context["labels"], queries.dtype), unknown], axis=0)
        tokens = tf.concat([support, queries], axis=0)
        mask = attention_mask(context["mask"], n)
        outputs = functional.call(self.transformer, {}, [tokens[None], labels[None],
                                                         mask[None]], training=True)[0]
        if self.head is not None:
            return self.head.logits(self.head.fit_finite(
                outputs[:m], self.support_labels(context), self.ways), outputs[m:])
        outputs = outputs[m:]
        return gaussian_outputs(outputs, self.min_scale) if self.output == "gaussian" \
            else outputs

    # --- parts -------------------------------------------------------------------------

    def support_labels(self, context: Dict[str, tf.Tensor]) -> Any:
        """The support labels that :meth:`task_state` kept in ``context`` as the head fits
        them: ``[support]`` int32 (the one-hots' classes), or
        :class:`~metalearn.tasks.MaskedLabels` for a padded episode."""
        labels = tf.argmax(context["labels"][:, :self.ways], axis=-1, output_type=tf.int32)
        if "classes" not in context:
            return labels
        return MaskedLabels(labels, context["mask"], context["classes"])

    def embedded(self, outputs: Any) -> tf.Tensor:
        """The model's outputs as ``[examples, e]`` in the transformer's dtype.

        Raises:
          ValueError: the outputs have another size than the model's declared one.
        """
        outputs = flat(outputs)
        if outputs.shape[-1] is not None and outputs.shape[-1] != self.embedding_size:
            raise ValueError(f"InContext was built for embeddings of "
                             f"{self.embedding_size} values, got {outputs.shape[-1]}")
        return tf.cast(outputs, self.transformer.inputs[0].dtype)

    def label_features(self, y: Any, dtype: tf.DType) -> Tuple[tf.Tensor, tf.Tensor]:
        """``([support, label_size] features, [support] mask of real examples)``: the
        one-hot labels (or targets) and a 0 "unknown" flag."""
        labels = tf.convert_to_tensor(unmask(y)[0])
        if self.ways is not None and not labels.dtype.is_integer:
            raise TypeError(f"InContext(ways={self.ways}) classifies: support labels must "
                            f"be integers, got {labels.dtype.name}; give targets= for "
                            "regression")
        if self.targets is not None and labels.dtype.is_integer:
            raise TypeError(f"InContext(targets={self.targets}) regresses: support targets "
                            f"must be real, got {labels.dtype.name}; give ways= to classify")
        classes = unmask(y)[2]
        if classes is not None and classes.shape[-1] not in (None, self.ways):
            raise ValueError(f"InContext was built for {self.ways} ways (its read-out's "
                             f"logits); these padded episodes have up to "
                             f"{classes.shape[-1]} ways: build it with ways="
                             f"{classes.shape[-1]}, the sampler's largest")
        owner = "InContext" if self.ways is None else \
            f"InContext (built for {self.ways} ways)"
        values, mask = encoded_targets(y, self.ways, dtype, owner)
        if self.targets is not None and values.shape[-1] not in (None, self.targets):
            raise ValueError(f"InContext(targets={self.targets}) got support targets of "
                             f"{values.shape[-1]} values")
        return tf.concat([values, tf.zeros_like(values[:, :1])], axis=-1), mask
