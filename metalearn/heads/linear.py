"""Linear and cosine classifiers fitted per task by gradient steps: the evaluation heads
of Baseline and Baseline++ (Chen et al., 2019, "A Closer Look at Few-shot
Classification"), and the logits both kinds share with whole-class pre-training."""

from __future__ import annotations

from typing import Any, Optional, Tuple

import gin
import tensorflow as tf

from metalearn.heads.base import Head, support_targets
from metalearn.pieces import DECAY, NON_NEGATIVE, POSITIVE, STEPS, Capabilities, check_range
from metalearn.heads.prototypes import class_prototypes, cosine_similarities
from metalearn.tasks.episode import restrict_to_classes

CLASSIFIERS = ("linear", "cosine")


def check_classifier(kind: str, what: str) -> str:
    if kind not in CLASSIFIERS:
        raise ValueError(f"{what} must be one of {CLASSIFIERS}, got {kind!r}")
    return kind


def classifier_logits(kind: str, kernel: tf.Tensor, bias: tf.Tensor, scale: tf.Tensor,
                      embeddings: tf.Tensor) -> tf.Tensor:
    """``[n, classes]`` logits of ``[n, features]`` embeddings: ``x @ kernel + bias``
    (``"linear"``) or ``scale * cos(x, kernel[:, k])`` (``"cosine"``, Baseline++; no bias).
    ``kernel`` is ``[features, classes]``."""
    if kind == "cosine":
        return scale * cosine_similarities(embeddings, tf.transpose(kernel))
    return tf.matmul(embeddings, kernel) + bias


@gin.configurable
class LinearProbeHead(Head):
    """A new classifier on the support embeddings per task, fitted by ``steps`` steps
    of full-batch gradient descent with momentum on the mean softmax cross-entropy plus
    ``weight_decay / 2 * ||W||^2``: Baseline (``classifier="linear"``, from zero weights)
    and Baseline++ (``classifier="cosine"``: logits ``scale * cos(x, w_k)``, starting from
    the normalised class means, so the fit is deterministic where Chen et al. start from
    a random draw). The settings default to Chen et al.'s fine-tuning (100 steps, SGD
    learning rate 0.01, momentum 0.9, weight decay 0.001; theirs on mini-batches of 4).

    The loss's gradient is written in closed form inside a ``tf.while_loop``, so the fit
    is differentiable (the meta-gradient reaches the embedding through every step). The
    state of a task is ``(kernel [features, ways], bias [ways])``.

    Args:
      classifier: ``"linear"`` or ``"cosine"``.
      steps: gradient steps per task (a whole number >= 0).
      learning_rate, momentum: of the steps (``v = momentum * v + g; w -= lr * v``, as
        ``torch.optim.SGD`` and ``keras.optimizers.SGD`` step): ``learning_rate > 0``,
        ``momentum`` in ``[0, 1)``.
      weight_decay: L2 penalty on the kernel (not the bias), ``>= 0``.
      scale: the cosine classifier's fixed scale (> 0).
      normalize: L2-normalise the embeddings first (the linear classifier).

    On a padded episode (:class:`~metalearn.tasks.episode.MaskedLabels`) the loss is the
    mean over the real examples (the weight decay unchanged) and its softmax is over the
    task's classes: the present classes' weights follow the steps of the episode fitted
    alone at its real size, an absent class's stay 0.
    """

    def own_capabilities(self) -> Capabilities:
        return Capabilities(task_axis=False, padding=True)

    def __init__(self, classifier: str = "linear", steps: int = 100,
                 learning_rate: float = 0.01, momentum: float = 0.9,
                 weight_decay: float = 0.001, scale: float = 10.0, normalize: bool = False,
                 name: Optional[str] = None):
        super().__init__(name=name)
        self.classifier = check_classifier(classifier, "LinearProbeHead.classifier")
        owner = "LinearProbeHead"
        self.steps = check_range(owner, "steps", steps, STEPS)
        self.learning_rate = check_range(owner, "learning_rate", learning_rate, POSITIVE)
        self.momentum = check_range(owner, "momentum", momentum, DECAY)
        self.weight_decay = check_range(owner, "weight_decay", weight_decay, NON_NEGATIVE)
        self.scale = check_range(owner, "scale", scale, POSITIVE)
        self.normalize = bool(normalize)

    def _inputs(self, embeddings: tf.Tensor) -> tf.Tensor:
        return tf.math.l2_normalize(embeddings, axis=-1) if self.normalize else embeddings

    def gradients(self, params: Tuple[tf.Tensor, tf.Tensor], embeddings: tf.Tensor,
                  targets: tf.Tensor, mask: Optional[tf.Tensor] = None,
                  classes: Optional[tf.Tensor] = None) -> Tuple[tf.Tensor, tf.Tensor]:
        """The closed-form gradient of the fit's loss (mean cross-entropy of one-hot
        ``targets`` plus the weight decay) in ``(kernel, bias)``; with a padded
        episode's ``mask`` ``[n]`` and ``classes`` ``[ways]`` (bool) the mean is over the
        real examples and the softmax over the task's classes."""
        kernel, bias = params
        dtype = embeddings.dtype
        scale = tf.constant(self.scale, dtype)
        logits = classifier_logits(self.classifier, kernel, bias, scale, embeddings)
        if classes is not None:
            logits = restrict_to_classes(logits, classes)
        error = tf.nn.softmax(logits) - targets
        if mask is None:
            residual = error / tf.cast(tf.shape(embeddings)[0], dtype)   # [n, ways]
        else:
            weights = tf.cast(mask, dtype)
            residual = weights[:, None] * error / tf.reduce_sum(weights)
        decay = tf.constant(self.weight_decay, dtype) * kernel
        if self.classifier == "linear":
            return (tf.matmul(embeddings, residual, transpose_a=True) + decay,
                    tf.reduce_sum(residual, axis=0))
        # cosine: logits = scale * x̂ ŵ_k with ŵ_k = w_k / ||w_k||
        norms = tf.maximum(tf.norm(kernel, axis=0, keepdims=True), 1e-12)   # [1, ways]
        unit = kernel / norms
        by_unit = scale * tf.matmul(tf.math.l2_normalize(embeddings, axis=-1), residual,
                                    transpose_a=True)                     # [d, ways]
        along = tf.reduce_sum(unit * by_unit, axis=0, keepdims=True)
        return (by_unit - unit * along) / norms + decay, tf.zeros_like(bias)

    def fit(self, embeddings: tf.Tensor, labels: tf.Tensor, ways: int) -> Any:
        # [n, d], [n, ways]; a padded episode's padded rows zero
        x, targets, mask, classes = support_targets(self._inputs(embeddings), labels, ways)
        bias = tf.zeros([ways], x.dtype)
        if self.classifier == "cosine":  # an absent class's mean (and weights) zero
            kernel = tf.transpose(class_prototypes(tf.math.l2_normalize(x, axis=-1),
                                                   labels, ways))          # [d, ways]
        else:
            kernel = tf.zeros(tf.stack([tf.shape(x)[1], ways]), x.dtype)
        rate = tf.constant(self.learning_rate, x.dtype)
        momentum = tf.constant(self.momentum, x.dtype)

        def step(k, kernel, bias, v_kernel, v_bias):
            g_kernel, g_bias = self.gradients((kernel, bias), x, targets, mask, classes)
            v_kernel, v_bias = momentum * v_kernel + g_kernel, momentum * v_bias + g_bias
            return k + 1, kernel - rate * v_kernel, bias - rate * v_bias, v_kernel, v_bias

        _, kernel, bias, _, _ = tf.while_loop(
            lambda k, *_: k < self.steps, step,
            (tf.constant(0), kernel, bias, tf.zeros_like(kernel), tf.zeros_like(bias)))
        return kernel, bias

    def logits(self, state: Any, embeddings: tf.Tensor) -> tf.Tensor:
        kernel, bias = (tf.cast(s, embeddings.dtype) for s in state)
        return classifier_logits(self.classifier, kernel, bias,
                                 tf.constant(self.scale, embeddings.dtype),
                                 self._inputs(embeddings))
