"""A logistic-regression head (R2-D2's LR-D2, Bertinetto et al., 2019), solved by Newton
steps inside the graph and differentiated implicitly.

The head minimises the multinomial cross-entropy of ``X W`` on the support set plus
``lambda / 2 ||W||^2``. Its solution lies in the span of the support embeddings,
``W = X^T A``, where the optimality condition reads ``lambda A + softmax(X X^T A) - Y =
0``: :func:`logistic_dual` takes Newton steps on that ``n * ways`` system (batched over
leading axes), the same iterates as Newton on ``W``. The gradient reaches ``X`` and
``lambda`` through the stationarity ``X^T (softmax(X W) - Y) + lambda W = 0``, whose
Jacobian ``X^T S X + lambda I`` (``S`` the softmax's) is solved directly through the
``n * ways`` system (the push-through identity), by
:func:`~metalearn.adapters.implicit_diff.implicit_solution`.
"""

from __future__ import annotations

from typing import Optional

import gin
import tensorflow as tf

from metalearn.adapters.base import Capabilities
from metalearn.adapters.implicit_diff import implicit_solution
from metalearn.heads.base import solve_flat
from metalearn.heads.ridge import RidgeHead


def logistic_residual(a: tf.Tensor, gram: tf.Tensor, targets: tf.Tensor,
                      lam: tf.Tensor) -> tf.Tensor:
    """``lambda A + softmax(K A) - Y``: zero at the solution (``[..., n, ways]``)."""
    return lam * a + tf.nn.softmax(tf.matmul(gram, a)) - targets


def softmax_jacobians(p: tf.Tensor) -> tf.Tensor:
    """``S = diag(p) - p p^T`` ``[..., n, ways, ways]`` of probabilities ``[..., n, ways]``."""
    return tf.linalg.diag(p) - p[..., :, None] * p[..., None, :]


def logistic_jacobian(gram: tf.Tensor, p: tf.Tensor, lam: tf.Tensor) -> tf.Tensor:
    """``lambda I + S K`` ``[..., n * ways, n * ways]`` (``S`` the softmax's Jacobians at
    ``p``): the Jacobian of :func:`logistic_residual`, over ``A`` flattened row by row."""
    n, ways = p.shape[-2], p.shape[-1]
    jacobian = tf.einsum("...nm,...nkj->...nkmj", gram, softmax_jacobians(p))
    shape = tf.concat([tf.shape(p)[:-2], [n * ways, n * ways]], 0)
    return tf.reshape(jacobian, shape) + lam * tf.eye(n * ways, dtype=p.dtype)


def logistic_dual(gram: tf.Tensor, targets: tf.Tensor, lam: tf.Tensor, steps: int = 10
                  ) -> tf.Tensor:
    """``A`` ``[..., n, ways]`` with ``W = X^T A`` the regularised logistic regression of
    one-hot ``targets`` on embeddings with Gram matrix ``gram`` ``[..., n, n]``, by
    ``steps`` Newton steps from ``A = 0``. Not differentiated."""
    gram, targets, lam = (tf.stop_gradient(t) for t in (gram, targets, lam))
    n, ways = targets.shape[-2], targets.shape[-1]
    batch = tf.shape(targets)[:-2]

    def body(i, a):
        jacobian = logistic_jacobian(gram, tf.nn.softmax(tf.matmul(gram, a)), lam)
        residual = tf.reshape(logistic_residual(a, gram, targets, lam),
                              tf.concat([batch, [n * ways, 1]], 0))
        return i + 1, a - tf.reshape(tf.linalg.solve(jacobian, residual), tf.shape(a))

    _, a = tf.while_loop(lambda i, _: i < steps, body, (0, tf.zeros_like(targets)))
    return a


@gin.configurable
class LogisticHead(RidgeHead):
    """Multinomial logistic regression on the support embeddings (LR-D2), logits
    ``scale * (E' W) + bias``; the module docstring says how it is solved and
    differentiated. ``lambda``, ``scale``, ``bias`` and the logits are
    :class:`RidgeHead`'s (meta-learned unless ``learn=False``); only the fit differs.
    (R2-D2's LR-D2 is binary, one-vs-rest for several ways; this is its multinomial
    form.)

    Args:
      regularization: ``lambda``'s initial value (> 0).
      scale, bias: the logits' initial scale and offset.
      steps: Newton steps.
      learn: meta-learn ``lambda``, ``scale`` and ``bias``.
    """

    supports_padding = False  # its Newton solve would fit the padding (RidgeHead's does not)

    def __init__(self, regularization: float = 1.0, scale: float = 1.0, bias: float = 0.0,
                 steps: int = 10, learn: bool = True, name: Optional[str] = None):
        super().__init__(regularization=regularization, scale=scale, bias=bias, learn=learn,
                         name=name)
        if int(steps) < 1:
            raise ValueError(f"LogisticHead steps must be >= 1, got {steps}")
        self.steps = int(steps)

    def own_capabilities(self) -> Capabilities:
        # tf.custom_gradient (the implicit solution) is ignored inside tf.map_fn
        return Capabilities(custom_gradient=True, task_axis=False)

    def fit(self, embeddings: tf.Tensor, labels: tf.Tensor, ways: int) -> tf.Tensor:
        lam, _, _ = self._parameters(embeddings.dtype)
        targets = tf.one_hot(tf.cast(tf.reshape(labels, [-1]), tf.int32), ways,
                             dtype=embeddings.dtype)                       # [n, ways]
        if embeddings.shape[0] is None:
            raise ValueError(f"LogisticHead needs the support set's size statically known, "
                             f"got embeddings of shape {embeddings.shape}")
        gram = tf.matmul(embeddings, embeddings, transpose_b=True)
        w_hat = tf.matmul(embeddings, logistic_dual(gram, targets, lam, self.steps),
                          transpose_a=True)                                # [d, ways]

        def stationarity(x, theta):  # gradient of the regularised support loss in W
            e, lam_ = theta
            return [tf.matmul(e, tf.nn.softmax(tf.matmul(e, x[0])) - targets, transpose_a=True)
                    + lam_ * x[0]]

        # its Jacobian in W, X^T S X + lambda I, inverted through the n * ways system:
        # (lambda I + X^T S X)^-1 v = (v - X^T (lambda I + S K)^-1 S X v) / lambda
        e, lam_value = tf.stop_gradient(embeddings), tf.stop_gradient(lam)
        p = tf.nn.softmax(tf.matmul(e, tf.stop_gradient(w_hat)))
        small = logistic_jacobian(tf.stop_gradient(gram), p, lam_value)

        def solve(_, b):
            pushed = tf.einsum("nkj,nj->nk", softmax_jacobians(p), tf.matmul(e, b[0]))
            return [(b[0] - tf.matmul(e, solve_flat(small, pushed), transpose_a=True))
                    / lam_value]

        return implicit_solution(stationarity, [w_hat], [embeddings, lam], solve)[0]
