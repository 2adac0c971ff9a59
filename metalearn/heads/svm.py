"""The multi-class SVM head of MetaOptNet (Lee et al., 2019): the Crammer-Singer dual,
solved inside the graph and differentiated implicitly.

With support embeddings ``X`` ``[n, d]``, one-hot labels ``Y`` ``[n, ways]`` and the
kernel ``K = X X^T (+ ridge I)``, the dual is

    min_alpha  1/2 tr(alpha^T K alpha) - tr(Y^T alpha)
    s.t.       beta = C Y - alpha >= 0,  sum_k beta[i, k] = C   (every example i),

a quadratic over a product of scaled simplices; the class weights are
``W = X^T alpha`` ``[d, ways]``. It is solved batched over any leading axes by
:func:`crammer_singer_dual`: accelerated projected gradient (FISTA with adaptive restart)
for a fixed number of steps, which finds the active set (the projection gives exact
zeros), then one Newton step on that face, exact when the face is right. The gradient
reaches ``X`` through the face's stationarity condition ``P (K alpha - Y) = 0`` (``P``
the projector onto the face's tangent space) by
:func:`~metalearn.pieces.implicit_diff.implicit_solution`, not by unrolling; that
condition's Jacobian is the ``n * ways`` face matrix, so the linear system is solved
directly (shifted by its rounding error, so that a singular face system, as identical
support rows make it, gives a finite solution instead of an error).
"""

from __future__ import annotations

from typing import Any, Optional

import gin
import keras
import tensorflow as tf

from metalearn.heads.base import Head, solve_semidefinite_flat, support_targets
from metalearn.pieces import (COUNT, NON_NEGATIVE, POSITIVE, Capabilities, Range,
                              check_range, implicit_solution)


def simplex_projection(z: tf.Tensor, total: tf.Tensor,
                       allowed: Optional[tf.Tensor] = None) -> tf.Tensor:
    """The Euclidean projection of each row (last axis) of ``z`` onto ``{b >= 0,
    sum(b) = total}`` (by sorting, Held et al. 1974); with ``allowed`` (booleans like
    ``z``) onto that simplex's face ``{b >= 0, sum(b) = total, b = 0 where not
    allowed}``, and a row with nothing allowed onto zero. The allowed entries are
    projected with the same arithmetic as the projection of those entries alone."""
    ways = z.shape[-1]
    if allowed is None:
        allowed = tf.ones_like(z, tf.bool)
    # the allowed entries first, in descending order; the others after them, left out
    ordered = tf.sort(tf.where(allowed, z, z.dtype.min), axis=-1, direction="DESCENDING")
    counts = tf.range(1, ways + 1, dtype=z.dtype)
    inside = counts <= tf.reduce_sum(tf.cast(allowed, z.dtype), -1, keepdims=True)
    excess = tf.cumsum(tf.where(inside, ordered, 0), axis=-1) - total
    support = tf.reduce_sum(tf.cast(inside & (ordered - excess / counts > 0), z.dtype), -1,
                            keepdims=True)
    tau = tf.reduce_sum(tf.where(counts == support, excess / counts, 0), -1, keepdims=True)
    return tf.where(allowed, tf.maximum(z - tau, 0), 0)


def face_projector(active: tf.Tensor):
    """``P``: the orthogonal projector onto the tangent space of the face of the product
    of simplices where ``active`` (``[..., n, ways]`` booleans) holds."""
    mask = tf.cast(active, tf.float64)

    def project(v: tf.Tensor) -> tf.Tensor:
        m = tf.cast(mask, v.dtype)
        # a row with nothing active (a padded example's) is held: its projection is zero
        count = tf.maximum(tf.reduce_sum(m, -1, keepdims=True), 1)
        return m * (v - tf.reduce_sum(m * v, -1, keepdims=True) / count)

    return project


def natural_residual(alpha: tf.Tensor, kernel: tf.Tensor, targets: tf.Tensor,
                     c: float, allowed: Optional[tf.Tensor] = None) -> tf.Tensor:
    """``max |beta - proj(beta - grad)|`` per problem (leading axes): zero exactly at a
    solution of the dual (its KKT conditions), with ``beta = C Y - alpha``."""
    beta = c * targets - alpha
    grad = targets - tf.matmul(kernel, alpha)  # d/d beta of the dual objective
    step = beta - simplex_projection(beta - grad, tf.constant(c, alpha.dtype), allowed)
    return tf.reduce_max(tf.abs(step), axis=[-2, -1])


def crammer_singer_dual(kernel: tf.Tensor, targets: tf.Tensor, c: float, steps: int = 100,
                        allowed: Optional[tf.Tensor] = None) -> tf.Tensor:
    """The dual variables ``alpha`` ``[..., n, ways]`` of the Crammer-Singer SVM for
    kernels ``[..., n, n]`` and one-hot ``targets`` ``[..., n, ways]``, every leading index
    an independent problem. Not differentiated (see :class:`SVMHead`).

    ``allowed`` (booleans like ``targets``; a padded episode's real examples times its
    classes) restricts the problem: example ``i``'s ``beta`` lies on the simplex of its
    allowed classes (an absent class is out of its constraints, its ``alpha`` zero), and
    an example with none (a padded one; its targets must be zero) has ``alpha`` fixed at
    zero, its box bound 0. With the padded examples' kernel rows zero (as
    :class:`SVMHead` makes them) the iterates on the allowed entries are those of the
    problem of those entries alone."""
    kernel, targets = tf.stop_gradient(kernel), tf.stop_gradient(targets)
    total = tf.constant(c, kernel.dtype)
    lipschitz = tf.linalg.eigvalsh(kernel)[..., -1:, None]                   # [..., 1, 1]
    step = 1 / tf.maximum(lipschitz, tf.constant(1e-12, kernel.dtype))
    gradient = lambda beta: targets - tf.matmul(kernel, c * targets - beta)  # d/d beta

    def body(i, beta, previous, t):
        beta_new = simplex_projection(previous - step * gradient(previous), total, allowed)
        restart = tf.reduce_sum((previous - beta_new) * (beta_new - beta), [-2, -1],
                                keepdims=True) > 0  # momentum going uphill: drop it
        t = tf.where(restart, tf.ones_like(t), t)
        t_new = (1 + tf.sqrt(1 + 4 * t * t)) / 2
        extrapolated = beta_new + (t - 1) / t_new * (beta_new - beta)
        return i + 1, beta_new, extrapolated, t_new

    beta = total * targets  # alpha = 0: feasible
    t = tf.ones_like(lipschitz)
    _, beta, _, _ = tf.while_loop(lambda i, *_: i < steps, body, (0, beta, beta, t))
    alpha = c * targets - beta
    polished = alpha + newton_step_on_face(alpha, kernel, targets, c)
    feasible = tf.reduce_min(c * targets - polished, axis=[-2, -1]) >= 0  # the right face
    better = feasible & (natural_residual(polished, kernel, targets, c, allowed)
                         < natural_residual(alpha, kernel, targets, c, allowed))
    better = better[..., None, None]
    return tf.where(better, polished, alpha)


def face_matrix(alpha: tf.Tensor, kernel: tf.Tensor, targets: tf.Tensor, c: float
                ) -> tf.Tensor:
    """``A = P (K (x) I) P + (I - P)`` ``[..., n * ways, n * ways]`` on the face of
    ``alpha``: the Jacobian of the face's stationarity condition (symmetric, positive
    definite when ``K`` is), over ``alpha`` flattened row by row."""
    ways = alpha.shape[-1]
    if ways is None:
        raise ValueError(f"SVMHead needs the ways statically known, got dual variables "
                         f"of shape {alpha.shape}")
    # the support set's size: a tensor where it is not static (a task of any size, as
    # an export traces it)
    n = alpha.shape[-2] if alpha.shape[-2] is not None else tf.shape(alpha)[-2]
    mask = tf.cast(c * targets - alpha > 0, alpha.dtype)                   # [..., n, w]
    count = tf.maximum(tf.reduce_sum(mask, -1), 1)[..., None, None]  # 0 for a held row
    blocks = (tf.linalg.diag(mask) - mask[..., :, None] * mask[..., None, :]
              / count)                                                     # P: [..., n, w, w]
    eye_ways = tf.eye(ways, dtype=alpha.dtype)
    a = (kernel[..., :, None, :, None] * tf.einsum("...nkl,...mlj->...nkmj", blocks, blocks)
         + tf.einsum("nm,...nkj->...nkmj", tf.eye(n, dtype=alpha.dtype), eye_ways - blocks))
    return tf.reshape(a, tf.concat([tf.shape(alpha)[:-2], tf.stack([n * ways, n * ways])],
                                   0))


def newton_step_on_face(alpha: tf.Tensor, kernel: tf.Tensor, targets: tf.Tensor,
                        c: float) -> tf.Tensor:
    """The step to the minimiser of the dual on ``alpha``'s face (the quadratic is exact
    in one Newton step), by a direct solve of the ``n * ways`` face system (finite when
    the system is singular, as a kernel of identical support rows makes it:
    :func:`~metalearn.heads.base.solve_semidefinite_flat`)."""
    project = face_projector(c * targets - alpha > 0)
    gradient = project(tf.matmul(kernel, alpha) - targets)
    # projected: the step lies on the face, its entries off the face exactly zero (the
    # solve's rounding would move them off, and the polished point would be infeasible)
    return -project(solve_semidefinite_flat(face_matrix(alpha, kernel, targets, c),
                                            gradient))


def svm_kernel(embeddings: tf.Tensor, ridge: float) -> tf.Tensor:
    """``X X^T + ridge I`` of ``[..., n, d]`` embeddings."""
    gram = tf.matmul(embeddings, embeddings, transpose_b=True)
    return gram + ridge * tf.eye(tf.shape(gram)[-1], dtype=gram.dtype)


@gin.configurable
class SVMHead(Head):
    """MetaOptNet's multi-class (Crammer-Singer) SVM on the support embeddings, logits
    ``scale * (E' W)`` with ``W = X^T alpha`` from the dual (module docstring).

    Args:
      c: the SVM's regularisation ``C`` (> 0; MetaOptNet uses 0.1), a hyperparameter.
      scale: the logits' initial scale, meta-learned unless ``learn=False`` (MetaOptNet
        meta-learns it).
      steps: projected-gradient iterations before the Newton step on the face (a whole
        number >= 1).
      ridge: adds ``ridge * I`` to the kernel (>= 0), keeping the dual strongly convex
        when ``n`` exceeds the features; 0 is the plain Crammer-Singer dual.
      learn: meta-learn ``scale``.

    On a padded episode (:class:`~metalearn.tasks.episode.MaskedLabels`) the padded
    examples' dual variables are fixed at zero and the absent classes are out of every
    example's constraints (:func:`crammer_singer_dual`'s ``allowed``): the dual is the
    episode's own at its real size, and the absent classes' columns of ``W`` are zero.
    """

    def __init__(self, c: float = 0.1, scale: float = 1.0, steps: int = 100,
                 ridge: float = 0.0, learn: bool = True, name: Optional[str] = None):
        super().__init__(name=name)
        self.c = check_range("SVMHead", "c", c, POSITIVE)
        self.steps = check_range("SVMHead", "steps", steps, COUNT)
        self.ridge = check_range("SVMHead", "ridge", ridge, NON_NEGATIVE)
        self.initial_scale = check_range("SVMHead", "scale", scale, Range())
        self.learn = bool(learn)
        self._scale: Optional[keras.Variable] = None

    def own_capabilities(self) -> Capabilities:
        # tf.custom_gradient (the implicit solution) is ignored inside tf.map_fn
        return Capabilities(custom_gradient=True, task_axis=False, padding=True)

    def build(self, dtype: tf.DType) -> None:
        if self._scale is None:
            self._scale = keras.Variable(self.initial_scale, dtype=tf.as_dtype(dtype).name,
                                         trainable=self.learn, name="scale")

    def own_meta_variables(self):
        return [self._scale] if self.learn and self._scale is not None else []

    def fit(self, embeddings: tf.Tensor, labels: tf.Tensor, ways: int) -> tf.Tensor:
        # padded rows zero (their kernel rows too: the step size is the real problem's)
        embeddings, targets, mask, classes = support_targets(embeddings, labels, ways)
        allowed = None if mask is None else mask[:, None] & classes[None, :]  # [n, ways]
        alpha_hat = crammer_singer_dual(svm_kernel(embeddings, self.ridge), targets,
                                        self.c, self.steps, allowed)

        project = face_projector(self.c * targets - alpha_hat > 0)
        off_face = alpha_hat - project(alpha_hat)

        def stationarity(x, theta):  # P (K(theta) alpha_face - Y) + (I - P) (x - alpha_hat)
            kernel = svm_kernel(theta[0], self.ridge)
            on_face = project(x[0]) + off_face
            return [project(tf.matmul(kernel, on_face) - targets) + x[0] - project(x[0])
                    - off_face]

        # its Jacobian in x is the (symmetric) face matrix: solved directly
        jacobian = face_matrix(alpha_hat, tf.stop_gradient(svm_kernel(embeddings, self.ridge)),
                               targets, self.c)
        alpha = implicit_solution(stationarity, [alpha_hat], [embeddings],
                                  lambda _, b: [solve_semidefinite_flat(jacobian, b[0])])[0]
        return tf.matmul(embeddings, alpha, transpose_a=True)              # [d, ways]

    def logits(self, state: Any, embeddings: tf.Tensor) -> tf.Tensor:
        if self._scale is None:
            self.build(embeddings.dtype)
        scale = tf.cast(self._scale, embeddings.dtype)
        return scale * tf.matmul(embeddings, tf.cast(state, embeddings.dtype))
