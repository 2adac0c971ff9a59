"""Multinomial logistic regression fitted per task in the graph: the evaluation head of
RFS (Tian et al., 2020, "Rethinking Few-Shot Image Classification: a Good Embedding Is
All You Need?")."""

from __future__ import annotations

from typing import Any, Optional

import gin
import tensorflow as tf

from metalearn.heads.base import Head


@gin.configurable
class LogisticRegressionHead(Head):
    """L2-regularised multinomial logistic regression on the (L2-normalised) support
    embeddings, solved by Newton's method inside the graph: the minimiser of
    ``C * sum_i CE(x_i W + b, y_i) + ||W||^2 / 2`` (the bias not penalised), which is what
    RFS fits with scikit-learn's ``LogisticRegression(C=1.0, multi_class="multinomial")``
    (no scikit-learn here).

    The minimiser's kernel lies in the span of the support embeddings
    (``W = X^T A``), so Newton's method runs on the ``(n + 1) x ways`` unknowns
    ``(A, b)`` of the stationarity conditions ``softmax(K A + b) - Y + A / C = 0``,
    ``sum_i (softmax(K A + b)_i - Y_i) = 0`` with ``K = X X^T``: a system of at most
    ``(shots * ways + 1) * ways`` equations whatever the embedding's width (a ResNet-12's
    640). Query logits are ``X_q X^T A + b``. The logits are invariant to adding one
    constant to every class's bias; the Jacobian's bias block gets ``damping`` on its
    diagonal so the step is defined (a root of the conditions is a minimiser all the
    same). From ``A = 0, b = 0`` the strongly convex problem converges in a few steps;
    ``iterations`` is fixed, so the fit is one graph, differentiable by automatic
    differentiation through the steps. The state of a task is ``(support embeddings,
    A, b)``.

    Args:
      C: inverse regularisation strength (scikit-learn's ``C``; RFS: 1.0).
      iterations: Newton steps.
      normalize: L2-normalise the embeddings first (RFS does).
      damping: added to the bias block of the Newton system.
    """

    def __init__(self, C: float = 1.0, iterations: int = 10, normalize: bool = True,
                 damping: float = 1e-6, name: Optional[str] = None):
        super().__init__(name=name)
        if not float(C) > 0:
            raise ValueError(f"LogisticRegressionHead.C must be > 0, got {C}")
        if isinstance(iterations, bool) or int(iterations) != iterations or int(iterations) < 1:
            raise ValueError("LogisticRegressionHead.iterations must be a whole number >= 1, "
                             f"got {iterations!r}")
        if not float(damping) > 0:
            raise ValueError(f"LogisticRegressionHead.damping must be > 0, got {damping}")
        self.C, self.iterations = float(C), int(iterations)
        self.normalize, self.damping = bool(normalize), float(damping)

    def _inputs(self, embeddings: tf.Tensor) -> tf.Tensor:
        return tf.math.l2_normalize(embeddings, axis=-1) if self.normalize else embeddings

    def fit(self, embeddings: tf.Tensor, labels: tf.Tensor, ways: int) -> Any:
        x = self._inputs(embeddings)                                    # [n, d]
        dtype = x.dtype
        n = tf.shape(x)[0]
        targets = tf.one_hot(tf.cast(tf.reshape(labels, [-1]), tf.int32), ways, dtype=dtype)
        gram = tf.matmul(x, x, transpose_b=True)                        # [n, n]
        inverse_c = tf.constant(1.0 / self.C, dtype)
        eye_w = tf.eye(ways, dtype=dtype)

        def residual_and_jacobian(a, b):
            p = tf.nn.softmax(tf.matmul(gram, a) + b)                  # [n, w]
            residual = tf.concat([tf.reshape(p - targets + inverse_c * a, [-1]),
                                  tf.reduce_sum(p - targets, axis=0)], 0)
            s = tf.linalg.diag(p) - p[:, :, None] * p[:, None, :]       # [n, w, w]
            # d(row i of p - y + a / C) / d(row j of a) = K_ij S_i + delta_ij I / C
            block = tf.einsum("ij,iab->iajb", gram, s) + inverse_c * tf.einsum(
                "ij,ab->iajb", tf.eye(n, dtype=dtype), eye_w)
            top = tf.concat([tf.reshape(block, [n * ways, n * ways]),
                             tf.reshape(s, [n * ways, ways])], 1)
            bottom = tf.concat([tf.reshape(tf.einsum("ij,iab->ajb", gram, s),
                                           [ways, n * ways]),
                                tf.reduce_sum(s, axis=0) + self.damping * eye_w], 1)
            return residual, tf.concat([top, bottom], 0)                 # [size], [size, size]

        def newton(k, a, b):
            residual, jacobian = residual_and_jacobian(a, b)
            delta = tf.linalg.solve(jacobian, residual[:, None])[:, 0]
            a = a - tf.reshape(delta[:n * ways], [n, ways])
            return k + 1, a, b - delta[n * ways:]

        a = tf.zeros(tf.stack([n, ways]), dtype)
        b = tf.zeros([ways], dtype)
        _, a, b = tf.while_loop(lambda k, *_: k < self.iterations, newton,
                                (tf.constant(0), a, b))
        return x, a, b

    def logits(self, state: Any, embeddings: tf.Tensor) -> tf.Tensor:
        support, a, b = (tf.cast(s, embeddings.dtype) for s in state)
        kernel = tf.matmul(self._inputs(embeddings), support, transpose_b=True)  # [q, n]
        return tf.matmul(kernel, a) + b
