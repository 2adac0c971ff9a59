"""Truncated unrolls and persistent evolution strategies (PES, Vicol et al., 2021): the
estimators, on an explicit unroll, for inner loops too long to backpropagate through.

An *unroll* is a pure function ``step(state, theta, t) -> (state, loss)`` (``state`` any
nest of tensors, ``theta`` a list of tensors: the meta-parameters, ``t`` the step's index
in the horizon); the objective is the sum of its losses over a horizon of ``T`` steps from
an initial state. A run goes through the horizon in segments of ``K`` steps, carrying the
state (and, for PES, the accumulated noise) from one segment to the next:

* :func:`truncated_gradient`: backpropagation through one segment, the carried state a
  constant (biased unless ``K`` covers the whole horizon, where it is the full unroll's
  gradient);
* :func:`pes_segment`: PES with antithetic particles. Each particle ``j`` carries its own
  states (``+`` and ``-``) and ``xi_j``, the sum of the standard Gaussian perturbations it
  has seen; a segment draws ``eps_j``, adds it to ``xi_j``, runs ``K`` steps with
  ``theta +- sigma eps_j`` and estimates
  ``g = sum_j xi_j (L+_j - L-_j) / (2 N sigma)``. Summed over the horizon's segments, its
  expectation is the gradient of the Gaussian-smoothed total loss: unbiased, where
  truncated ES (``eps_j`` in place of ``xi_j``, ``pes=False``) is not.

The noise is ES's (:func:`metalearn.outer.evolution.noise`), under the seed ``[seed,
segment]``: a resumed run (the carried state restored) draws the same noise.

On a learner, as outer rules whose carried state is checkpointed with the run:
:mod:`metalearn.outer.truncated` (``TruncatedUnroll``, ``PersistentES``).
"""

from __future__ import annotations

from typing import Any, Callable, List, NamedTuple, Sequence, Tuple

import tensorflow as tf

from metalearn.outer.evolution import check_population, check_sigma, noise, pair_seed
from metalearn.ranges import COUNT, check_range

State = Any
UnrollStep = Callable[[State, List[tf.Tensor], Any], Tuple[State, tf.Tensor]]


def check_truncation(truncation: int, horizon: int, owner: str = "truncated unroll"
                     ) -> Tuple[int, int]:
    """``(truncation, horizon)`` if ``truncation`` is a whole number in ``[1, horizon]``
    that divides ``horizon``.

    Raises:
      ValueError: naming ``owner``, the value and what was expected.
    """
    truncation = check_range(owner, "truncation", truncation, COUNT)
    horizon = check_range(owner, "horizon", horizon, COUNT)
    if truncation > horizon:
        raise ValueError(f"{owner}: truncation ({truncation} steps) is longer than the "
                         f"horizon ({horizon} steps)")
    if horizon % truncation:
        raise ValueError(f"{owner}: truncation ({truncation} steps) must divide the "
                         f"horizon ({horizon} steps) into whole segments")
    return int(truncation), int(horizon)


def unroll(step: UnrollStep, state: State, theta: Sequence[tf.Tensor], start: int,
           steps: int) -> Tuple[State, tf.Tensor]:
    """``steps`` steps of ``step`` from ``state`` (step indices ``start ..``): the final
    state and the sum of the losses."""
    total = None
    for t in range(start, start + steps):
        state, loss = step(state, list(theta), t)
        total = loss if total is None else total + loss
    return state, total


def truncated_gradient(step: UnrollStep, state: State, theta: Sequence[tf.Tensor],
                       start: int, truncation: int
                       ) -> Tuple[List[tf.Tensor], State, tf.Tensor]:
    """Truncated backpropagation through one segment: the gradient of the segment's
    summed loss with respect to ``theta``, the incoming ``state`` held constant; the
    state after the segment (no gradient through it) and the segment's loss."""
    theta = [tf.convert_to_tensor(t) for t in theta]
    state = tf.nest.map_structure(tf.stop_gradient, state)
    with tf.GradientTape() as tape:
        tape.watch(theta)
        state, loss = unroll(step, state, theta, start, truncation)
    gradients = tape.gradient(loss, theta)
    return list(gradients), tf.nest.map_structure(tf.stop_gradient, state), loss


class Particles(NamedTuple):
    """PES's carried state: each particle's ``+`` and ``-`` unroll states (leading axis
    ``[population]``) and its accumulated standard noise ``xi`` (one ``[population,
    ...]`` tensor per meta-parameter)."""
    plus: State
    minus: State
    xi: List[tf.Tensor]


def particles(state: State, theta: Sequence[tf.Tensor], population: int) -> Particles:
    """The particles at the start of a horizon: every one at ``state``, ``xi = 0``.

    Raises:
      ValueError: ``population`` not a whole number >= 1.
    """
    population = check_population(population, "particles")
    tile = lambda t: tf.repeat(tf.convert_to_tensor(t)[None], population, axis=0)
    return Particles(tf.nest.map_structure(tile, state), tf.nest.map_structure(tile, state),
                     [tf.zeros([population] + list(t.shape), t.dtype) for t in theta])


def pes_segment(step: UnrollStep, carried: Particles, theta: Sequence[tf.Tensor],
                start: int, truncation: int, sigma: float, seed: tf.Tensor,
                pes: bool = True) -> Tuple[List[tf.Tensor], Particles, tf.Tensor]:
    """One segment of antithetic PES (``pes=False``: truncated ES).

    Args:
      step: the unroll's step (see the module's docstring).
      carried: the particles (:func:`particles` at the start of a horizon).
      theta: the meta-parameters.
      start: the segment's first step index; ``truncation``: its length.
      sigma: the noise scale (> 0).
      seed: ``[2]`` int64, e.g. ``[run seed, segment index]``; pair ``j``'s noise is
        ES's under ``fold_in(seed, j)``.

    Returns:
      The estimate (one tensor per meta-parameter), the particles after the segment, and
      the per-pair mean loss ``(L+ + L-) / 2`` (``[population]``).
    """
    sigma = check_sigma(sigma, "pes_segment")
    theta = [tf.convert_to_tensor(t) for t in theta]
    population = carried.xi[0].shape[0]
    seed = tf.cast(seed, tf.int64)
    shapes, dtypes = [t.shape for t in theta], [t.dtype for t in theta]
    eps = tf.map_fn(lambda j: noise(pair_seed(seed, j), shapes, dtypes),
                    tf.range(population, dtype=tf.int64),
                    fn_output_signature=[tf.TensorSpec(s, d) for s, d in zip(shapes, dtypes)])
    xi = [x + e for x, e in zip(carried.xi, eps)]

    def one(args):
        plus, minus, e = args
        plus, loss_plus = unroll(step, plus, [t + sigma * n for t, n in zip(theta, e)],
                                 start, truncation)
        minus, loss_minus = unroll(step, minus, [t - sigma * n for t, n in zip(theta, e)],
                                   start, truncation)
        return plus, minus, loss_plus, loss_minus

    plus, minus, loss_plus, loss_minus = tf.vectorized_map(
        one, (carried.plus, carried.minus, eps))
    weights = (loss_plus - loss_minus) / (2.0 * population * sigma)
    directions = xi if pes else eps
    estimate = [tf.tensordot(tf.cast(weights, d.dtype), d, axes=1) for d in directions]
    return estimate, Particles(plus, minus, xi), (loss_plus + loss_minus) / 2.0
