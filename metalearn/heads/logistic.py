"""Multinomial logistic regression on the support embeddings, solved by Newton's method
inside the graph: one head, :class:`LogisticHead`, with two named configurations, LR-D2
(Bertinetto et al., 2019; :class:`LogisticHead`'s defaults) and the evaluation head of
RFS (Tian et al., 2020; :class:`LogisticRegressionHead`).

The head minimises ``sum_i CE(x_i W + b, y_i) + lambda / 2 ||W||^2`` over the support
set, with the intercept ``b`` (unpenalised) only if asked for and ``x_i`` the embeddings,
L2-normalised if asked for. RFS's ``C * sum_i CE + ||W||^2 / 2`` (scikit-learn's
``LogisticRegression(C)``) is the same minimiser with ``lambda = 1 / C``.

Its solution lies in the span of the support embeddings, ``W = X^T A``, so Newton's
method runs on the dual unknowns ``(A [n, ways], b [ways])`` of the stationarity
conditions ``lambda A + softmax(K A + b) - Y = 0`` and ``sum_i (softmax(K A + b)_i - Y_i)
= 0`` (the latter with an intercept), ``K = X X^T``: at most ``(n + 1) * ways``
equations whatever the embedding's width (a ResNet-12's 640), and the same iterates as
Newton's method on ``W``. The logits are invariant to adding one constant to every
class's bias, so the Jacobian's bias block gets ``damping`` on its diagonal to define
the step (a root of the conditions is a minimiser all the same). :func:`newton_logistic`
takes the steps from ``A = 0, b = 0``, batched over leading axes.

The gradient reaches the embeddings (and ``lambda``) in one of two ways:

- ``"implicit"`` (LR-D2): through the conditions at the solution by
  :func:`~metalearn.pieces.implicit_diff.implicit_solution`, whose linear system is the
  (transposed) Newton Jacobian at the solution (the intercept's shift fixed exactly,
  not damped: :func:`logistic_jacobian`), solved directly. The steps are not
  differentiated, so memory does not grow with them; exact at a root (enough steps).
- ``"unrolled"`` (RFS): automatic differentiation through the fixed number of steps,
  exact for those steps whether or not they converged.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import gin
import tensorflow as tf

from metalearn.heads.base import solve_flat, support_targets
from metalearn.heads.ridge import RidgeHead
from metalearn.pieces import COUNT, POSITIVE, Capabilities, check_range, implicit_solution
from metalearn.tasks.episode import restrict_to_classes

GRADIENTS = ("implicit", "unrolled")


def split_dual(dual: tf.Tensor, intercept: bool) -> Tuple[tf.Tensor, Optional[tf.Tensor]]:
    """``(A [..., n, ways], b [..., 1, ways])`` of the dual unknowns ``[..., n (+ 1),
    ways]`` (``b`` the last row with an intercept, else ``None``)."""
    if not intercept:
        return dual, None
    return dual[..., :-1, :], dual[..., -1:, :]


def support_probabilities(dual: tf.Tensor, gram: tf.Tensor, intercept: bool,
                          classes: Optional[tf.Tensor] = None) -> tf.Tensor:
    """``softmax(K A + b)`` ``[..., n, ways]``: the fit's probabilities on the support
    (over the task's ``classes`` ``[..., ways]`` only if given: zero for the others)."""
    a, b = split_dual(dual, intercept)
    scores = tf.matmul(gram, a)
    scores = scores if b is None else scores + b
    return tf.nn.softmax(scores if classes is None else restrict_to_classes(scores, classes))


def logistic_residual(dual: tf.Tensor, gram: tf.Tensor, targets: tf.Tensor, lam: tf.Tensor,
                      intercept: bool = False, weights: Optional[tf.Tensor] = None,
                      classes: Optional[tf.Tensor] = None) -> tf.Tensor:
    """The stationarity conditions ``lambda A + W (softmax(K A + b) - Y)`` (and, with an
    intercept, the sum of the latter over the support as a last row): zero at the
    solution, in the dual's shape. ``weights`` ``[..., n]`` (``W``'s diagonal, 1 if not
    given) weight the examples' cross-entropies: 0 for a padded example, whose ``A`` is
    then 0; the softmax is over ``classes`` only if given, so an absent class's ``A``
    is 0 and its intercept is free (its condition is identically zero)."""
    a, _ = split_dual(dual, intercept)
    error = support_probabilities(dual, gram, intercept, classes) - targets
    if weights is not None:
        error = weights[..., None] * error
    residual = lam * a + error
    if not intercept:
        return residual
    return tf.concat([residual, tf.reduce_sum(error, axis=-2, keepdims=True)], -2)


def softmax_jacobians(p: tf.Tensor) -> tf.Tensor:
    """``S = diag(p) - p p^T`` ``[..., n, ways, ways]`` of probabilities ``[..., n, ways]``."""
    return tf.linalg.diag(p) - p[..., :, None] * p[..., None, :]


def logistic_jacobian(gram: tf.Tensor, p: tf.Tensor, lam: tf.Tensor, intercept: bool = False,
                      damping: float = 1e-6, shift: float = 0.0,
                      weights: Optional[tf.Tensor] = None,
                      classes: Optional[tf.Tensor] = None) -> tf.Tensor:
    """The Jacobian of :func:`logistic_residual` over the dual flattened row by row, at
    support probabilities ``p``: ``lambda I + S K`` ``[..., n * ways, n * ways]`` (row
    ``(i, a)``, column ``(j, c)``: ``K_ij S_i[a, c]``), bordered with an intercept by the
    ``b`` column ``S_i``, the summed row ``sum_i K_ij S_i`` and the corner ``sum_i S_i +
    damping I + shift / ways 1 1^T`` (``[..., (n + 1) * ways, (n + 1) * ways]``); with
    ``weights`` (:func:`logistic_residual`'s) ``S_i`` is ``weights_i S_i``.

    Without ``damping`` and ``shift`` the bordered Jacobian is singular: a common shift of
    ``b`` changes nothing, on either side of it. ``damping`` (Newton's steps) makes it
    invertible; ``shift`` (the implicit gradient's) does so without changing the solution
    of a system whose right-hand side has no part along that shift, as a gradient of
    anything computed from the logits has none. With ``classes`` (``[..., ways]``, those
    of ``p``'s softmax) the shift is the present classes' common one, ``shift / ways' c
    c^T`` (``ways'`` of them), and an absent class's intercept, which nothing depends on,
    gets 1 on the diagonal: it stays where it is (0), and the present classes' block is
    the Jacobian of the task's own problem at its real size."""
    n, ways = tf.shape(p)[-2], p.shape[-1]
    batch = tf.shape(p)[:-2]
    s = softmax_jacobians(p)                                             # [..., n, w, w]
    if weights is not None:
        s = weights[..., None, None] * s
    coupled = tf.reshape(tf.einsum("...ij,...iac->...iajc", gram, s),
                         tf.concat([batch, [n * ways, n * ways]], 0))
    jacobian = coupled + lam * tf.eye(n * ways, dtype=p.dtype)
    if not intercept:
        return jacobian
    column = tf.reshape(s, tf.concat([batch, [n * ways, ways]], 0))
    row = tf.reshape(tf.einsum("...ij,...iac->...ajc", gram, s),
                     tf.concat([batch, [ways, n * ways]], 0))
    if classes is None:
        common, held = tf.ones([ways, ways], p.dtype) / ways, 0
    else:
        present = tf.cast(classes, p.dtype)                              # [..., w]
        common = (present[..., :, None] * present[..., None, :]
                  / tf.reduce_sum(present, -1)[..., None, None])
        held = tf.linalg.diag(1 - present)
    corner = (tf.reduce_sum(s, axis=-3) + damping * tf.eye(ways, dtype=p.dtype)
              + shift * common + held)
    return tf.concat([tf.concat([jacobian, column], -1), tf.concat([row, corner], -1)], -2)


def newton_logistic(gram: tf.Tensor, targets: tf.Tensor, lam: tf.Tensor, steps: int = 10,
                    intercept: bool = False, damping: float = 1e-6,
                    weights: Optional[tf.Tensor] = None, classes: Optional[tf.Tensor] = None
                    ) -> tf.Tensor:
    """The dual unknowns ``[..., n (+ 1), ways]`` (``A``, then ``b`` with an intercept) of
    the regularised logistic regression of one-hot ``targets`` ``[..., n, ways]`` on
    embeddings with Gram matrix ``gram`` ``[..., n, n]``, after ``steps`` Newton steps
    from zero; ``W = X^T A``. Differentiable through the steps (stop the inputs'
    gradients for an implicit gradient). ``weights`` ``[..., n]`` and ``classes``
    ``[..., ways]``: :func:`logistic_residual`'s (a padded episode's real examples and
    classes; with the padded rows of ``gram`` zero the steps on the real examples and
    classes are those of the problem of those alone)."""
    start = tf.zeros_like(targets)
    if intercept:
        start = tf.concat([start, tf.zeros_like(targets[..., :1, :])], -2)

    def step(k, dual):
        jacobian = logistic_jacobian(
            gram, support_probabilities(dual, gram, intercept, classes), lam, intercept,
            damping, weights=weights, classes=classes)
        residual = logistic_residual(dual, gram, targets, lam, intercept, weights, classes)
        return k + 1, dual - solve_flat(jacobian, residual)

    _, dual = tf.while_loop(lambda k, _: k < steps, step, (tf.constant(0), start))
    return dual


@gin.configurable
class LogisticHead(RidgeHead):
    """Multinomial logistic regression on the support embeddings by Newton's method (the
    module docstring says how it is solved and differentiated); query logits ``scale *
    (x W + b) + bias``. Its defaults are LR-D2 (Bertinetto et al., 2019; R2-D2's LR-D2 is
    binary, one-vs-rest for several ways, this its multinomial form): no intercept, raw
    embeddings, the implicit gradient, and ``lambda`` (through its logarithm), ``scale``
    and ``bias`` :class:`RidgeHead`'s meta-learned scalars. RFS is
    :class:`LogisticRegressionHead`. The state of a task is ``(W [features, ways], b
    [ways])`` (``b = 0`` without an intercept).

    Args:
      regularization: ``lambda``'s initial value (> 0; RFS's ``C`` is ``1 / lambda``).
      scale, bias: the logits' initial scale and offset.
      steps: Newton steps (a whole number >= 1).
      learn: meta-learn ``lambda``, ``scale`` and ``bias``.
      intercept: fit an unpenalised per-class intercept ``b`` (RFS's).
      normalize: L2-normalise the embeddings, support and queries, first (RFS's).
      gradient: ``"implicit"`` or ``"unrolled"`` (module docstring).
      damping: added to the intercept's block of the Newton system (> 0).

    On a padded episode (:class:`~metalearn.tasks.episode.MaskedLabels`) the padded
    examples' cross-entropies have weight 0 (their embeddings are zeroed; the
    regulariser is unchanged) and the softmax of the fit is over the task's classes
    only: the present classes' ``W`` and ``b`` are those of the episode fitted alone at
    its real size, an absent class's are 0.
    """

    def __init__(self, regularization: float = 1.0, scale: float = 1.0, bias: float = 0.0,
                 steps: int = 10, learn: bool = True, intercept: bool = False,
                 normalize: bool = False, gradient: str = "implicit", damping: float = 1e-6,
                 name: Optional[str] = None):
        super().__init__(regularization=regularization, scale=scale, bias=bias, learn=learn,
                         name=name)
        steps = check_range(type(self).__name__, "steps", steps, COUNT)
        if gradient not in GRADIENTS:
            raise ValueError(f"LogisticHead gradient must be one of {GRADIENTS}, "
                             f"got {gradient!r}")
        damping = check_range(type(self).__name__, "damping", damping, POSITIVE)
        self.steps, self.gradient, self.damping = steps, gradient, damping
        self.intercept, self.normalize = bool(intercept), bool(normalize)

    def own_capabilities(self) -> Capabilities:
        if self.gradient == "unrolled":
            return super().own_capabilities()
        # tf.custom_gradient (the implicit solution) is ignored inside tf.map_fn
        return Capabilities(custom_gradient=True, task_axis=False, padding=True)

    def _inputs(self, embeddings: tf.Tensor) -> tf.Tensor:
        return tf.math.l2_normalize(embeddings, axis=-1) if self.normalize else embeddings

    def fit(self, embeddings: tf.Tensor, labels: tf.Tensor, ways: int
            ) -> Tuple[tf.Tensor, tf.Tensor]:
        lam, _, _ = self._parameters(embeddings.dtype)
        # [n, d], [n, ways]; padded rows zero, so the Gram matrix's are too
        x, targets, mask, classes = support_targets(self._inputs(embeddings), labels, ways)
        padding = dict(weights=None if mask is None else tf.cast(mask, x.dtype),
                       classes=classes)
        gram = tf.matmul(x, x, transpose_b=True)                           # [n, n]
        if self.gradient == "unrolled":
            dual = newton_logistic(gram, targets, lam, self.steps, self.intercept,
                                   self.damping, **padding)
        else:
            dual = self._implicit(x, gram, targets, lam, padding)
        a, b = split_dual(dual, self.intercept)                            # [n (+ 1), ways]
        b = tf.zeros([ways], x.dtype) if b is None else b[0]
        return tf.matmul(x, a, transpose_a=True), b                        # [d, ways], [ways]

    def _implicit(self, x: tf.Tensor, gram: tf.Tensor, targets: tf.Tensor, lam: tf.Tensor,
                  padding: Dict[str, Optional[tf.Tensor]]) -> tf.Tensor:
        """The dual solution, differentiable in ``x`` and ``lambda`` through the
        stationarity conditions (the transposed Newton Jacobian at the solution, solved
        directly); the Newton steps themselves are not differentiated. ``padding``: the
        ``weights`` and ``classes`` of :func:`logistic_residual`."""
        gram, lam_value = tf.stop_gradient(gram), tf.stop_gradient(lam)
        solved = newton_logistic(gram, targets, lam_value, self.steps, self.intercept,
                                 self.damping, **padding)
        jacobian = logistic_jacobian(
            gram, support_probabilities(solved, gram, self.intercept, padding["classes"]),
            lam_value, self.intercept, damping=0.0, shift=1.0, **padding)

        def condition(dual, theta):
            e, lam_ = theta
            return [logistic_residual(dual[0], tf.matmul(e, e, transpose_b=True), targets,
                                      lam_, self.intercept, **padding)]

        return implicit_solution(condition, [solved], [x, lam],
                                 lambda _, v: [solve_flat(jacobian, v[0], adjoint=True)])[0]

    def logits(self, state: Any, embeddings: tf.Tensor) -> tf.Tensor:
        _, scale, bias = self._parameters(embeddings.dtype)
        w, b = (tf.cast(s, embeddings.dtype) for s in state)
        return scale * (tf.matmul(self._inputs(embeddings), w) + b) + bias


@gin.configurable
class LogisticRegressionHead(LogisticHead):
    """RFS's evaluation head (Tian et al., 2020, "Rethinking Few-Shot Image
    Classification: a Good Embedding Is All You Need?"): :class:`LogisticHead` set as RFS
    fits scikit-learn's ``LogisticRegression(C=1.0, multi_class="multinomial")`` (no
    scikit-learn here): the minimiser of ``C * sum_i CE(x_i W + b, y_i) + ||W||^2 / 2``
    (``lambda = 1 / C``), an unpenalised intercept, L2-normalised embeddings, logits
    ``x W + b``. Nothing is meta-learned and the head has no variables (a pre-training
    checkpoint restores with it in place of another head without variables); the fit is
    differentiated through its fixed ``iterations`` (``gradient="unrolled"``).

    Args:
      C: inverse regularisation strength (> 0; scikit-learn's ``C``; RFS: 1.0).
      iterations: Newton steps (a whole number >= 1).
      normalize: L2-normalise the embeddings first (RFS does).
      damping: added to the intercept's block of the Newton system (> 0).
    """

    def __init__(self, C: float = 1.0, iterations: int = 10, normalize: bool = True,
                 damping: float = 1e-6, name: Optional[str] = None):
        C = check_range("LogisticRegressionHead", "C", C, POSITIVE)
        iterations = check_range("LogisticRegressionHead", "iterations", iterations, COUNT)
        super().__init__(regularization=1.0 / C, scale=1.0, bias=0.0,
                         steps=iterations, learn=False, intercept=True, normalize=normalize,
                         gradient="unrolled", damping=damping, name=name)
        self.C, self.iterations = float(C), int(iterations)

    def build(self, dtype: tf.DType) -> None:
        """No variables: ``lambda = 1 / C``, the scale 1 and the offset 0 are fixed."""

    def _parameters(self, dtype: tf.DType) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        return (tf.constant(1.0 / self.C, dtype), tf.constant(1.0, dtype),
                tf.constant(0.0, dtype))
