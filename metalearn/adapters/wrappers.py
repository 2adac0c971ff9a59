"""Wrappers around the inner loop's steps: per-step weights, recomputed steps,
mini-batches, steps in a ``tf.while_loop``.

A step of :class:`~metalearn.adapters.GradientDescent` is a function
``step_fn(weights, state, step, x, y) -> (weights, state)``. A wrapper may

* change the weights the loop starts from (:meth:`StepWrapper.start`), or continues
  from at a later step (:meth:`StepWrapper.resume`: a carried trajectory's segment),
* choose the support examples a step sees (:meth:`StepWrapper.batch`; from the current
  weights: :class:`SupportFromWeights`),
* wrap the step function itself (:meth:`StepWrapper.wrap`),
* run the steps itself (:meth:`StepWrapper.iterate`; at most one wrapper of a loop does,
  :class:`WhileLoop`),

and says, like every piece, what it needs (its capabilities), which weights it sets per
task and what it meta-learns. ``GradientDescent(wrappers=[a, b])`` wraps the step in
``a``, then the result in ``b`` (``b`` outermost).
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence, Tuple

import gin
import keras
import numpy as np
import tensorflow as tf

from metalearn.adapters.hyperparameters import variable_name
from metalearn.adapters.updates import State
from metalearn.functional import Weights
from metalearn.pieces import (COUNT, Capabilities, Piece, check_patterns, check_range,
                              clamp_step, select_paths)

StepFn = Callable[[Weights, State, int, Any, Any], Tuple[Weights, State]]
OneStep = Callable[[Weights, State, Any], Tuple[Weights, State]]
"""``one_step(weights, state, step)``: one whole inner step (its support examples chosen by
every wrapper's :meth:`StepWrapper.batch`, then the wrapped step function)."""


class StepWrapper(Piece):
    """Changes how the inner loop's steps run; every hook defaults to no change."""

    def build(self, weights: Weights, steps: int) -> None:
        """Creates meta-learned state for the model's ``weights`` and ``steps`` steps."""

    def start(self, weights: Weights) -> Weights:
        """The weights the loop starts from."""
        return weights

    def resume(self, weights: Weights, step: Any) -> Weights:
        """The weights the loop continues from before inner step ``step`` (an int or a
        scalar int32 tensor), given the carried weights of the paths it adapts: what an
        outer rule carrying the trajectory across outer steps starts a segment from
        (:meth:`~metalearn.adapters.GradientDescent.resume`). Weights this wrapper sets
        per step are set here from its meta-variables, so that a segment's gradient and
        perturbations reach them."""
        return weights

    def batch(self, x: Any, y: Any, step: int) -> Tuple[Any, Any]:
        """The support examples inner step ``step`` sees."""
        return x, y

    def wrap(self, step_fn: StepFn) -> StepFn:
        """The step function, wrapped."""
        return step_fn

    #: Whether this wrapper runs the loop's steps (:meth:`iterate`).
    runs_steps: bool = False

    def iterate(self, one_step: OneStep, weights: Weights, state: State, steps: int,
                keep_all: bool) -> List[Weights]:
        """Runs ``steps`` inner steps from ``weights`` and ``state`` and returns the
        weights before the first step and after each (only the first and the last where
        ``keep_all`` is false). Called only on a wrapper whose :attr:`runs_steps` is
        true; the loop runs the steps in Python otherwise."""
        raise NotImplementedError(f"{type(self).__name__} does not run the inner steps")


@gin.configurable
class PerStepWeights(StepWrapper):
    """MAML++'s per-step weights (e.g. per-step BatchNorm): the matching weights get a
    meta-learned copy for every inner step instead of being adapted.

    The model runs with copy ``k`` whenever it runs with the weights after ``k`` inner
    steps (``k = 0 .. steps``; more steps at test time reuse the last copy). The copies
    start at the model's initial values; the model's own variables for these paths are
    then unused (:meth:`own_task_paths`), so they are not meta-variables.

    Args:
      patterns: regular expressions over variable paths (``re.search``), e.g.
        ``("bn",)`` or ``("gamma", "beta")``.
    """

    def __init__(self, patterns: Sequence[str] = gin.REQUIRED, name: Optional[str] = None):
        super().__init__(name=name)
        self.patterns = check_patterns(patterns, "PerStepWeights")
        self._paths: List[str] = []
        self._copies: List[keras.Variable] = []
        self._steps = 0

    def paths(self, weights: Weights) -> List[str]:
        return select_paths(list(weights), self.patterns, "PerStepWeights")

    def own_task_paths(self, weights: Weights) -> Sequence[str]:
        return self.paths(weights)

    def build(self, weights: Weights, steps: int) -> None:
        self._steps = int(steps)
        self._paths = self.paths(weights)
        self._copies = [
            keras.Variable(np.repeat(np.asarray(weights[p])[None], steps + 1, axis=0),
                           dtype=weights[p].dtype.name, trainable=True,
                           name=variable_name(p, "per_step"))
            for p in self._paths]  # each [steps + 1, *shape]

    def own_capabilities(self) -> Capabilities:
        return Capabilities(step_prefix=True)  # copy k after step k, whatever the count

    def own_meta_variables(self):
        return list(self._copies)

    def at_step(self, weights: Weights, step: Any) -> Weights:
        """``weights`` with the copies of inner step ``step`` put in."""
        weights = dict(weights)
        index = clamp_step(step, self._steps)
        for path, copies in zip(self._paths, self._copies):
            weights[path] = tf.convert_to_tensor(copies)[index]
        return weights

    def start(self, weights):
        return self.at_step(weights, 0)

    def resume(self, weights, step):
        return self.at_step(weights, step)

    def wrap(self, step_fn):
        def with_copies(weights, state, step, x, y):
            weights, state = step_fn(weights, state, step, x, y)
            return self.at_step(weights, step + 1), state
        return with_copies


@gin.configurable
class Recompute(StepWrapper):
    """Trades compute for memory: each inner step is a checkpoint whose intermediate
    activations are not kept for the meta-gradient but recomputed from the step's
    input weights (and transform state) in the backward pass.

    A ``tf.custom_gradient`` (unlike ``tf.recompute_grad`` it allows the gradient tape
    inside the step); same values and meta-gradients. TensorFlow ignores custom gradients
    inside ``tf.map_fn``, so the learner then runs the tasks unrolled (or batched): the
    capability says so. Cost and savings: benchmarks/README.md.
    """

    def own_capabilities(self) -> Capabilities:
        return Capabilities(custom_gradient=True, step_prefix=True)

    def wrap(self, step_fn):
        def recomputed(weights, state, step, x, y):
            keys = list(weights)
            flat_state = tf.nest.flatten(state)
            count = len(keys)

            def run(values):
                w = dict(zip(keys, values[:count]))
                s = tf.nest.pack_sequence_as(state, list(values[count:]))
                w, s = step_fn(w, s, step, x, y)
                return [w[k] for k in keys] + tf.nest.flatten(s)

            @tf.custom_gradient
            def checkpointed(*values):
                result = run(list(values))

                def grad(*output_grads, variables=None):
                    variables = list(variables or [])
                    # Inputs that depend on the incoming gradients: the recomputation can
                    # only start in the backward pass, and graph optimisation cannot merge
                    # it with the forward ops (which would keep their activations alive).
                    with tf.control_dependencies(output_grads):
                        inputs = [tf.identity(v) for v in values]
                    with tf.GradientTape() as tape:
                        tape.watch(inputs)
                        again = run(inputs)
                    grads = tape.gradient(again, inputs + variables,
                                          output_gradients=list(output_grads))
                    return grads[:len(values)], grads[len(values):]
                return result, grad

            out = checkpointed(*[weights[k] for k in keys], *flat_state)
            new_state = tf.nest.pack_sequence_as(state, list(out[count:]))
            return dict(zip(keys, out[:count])), new_state
        return recomputed


@gin.configurable
class MiniBatches(StepWrapper):
    """Each inner step uses a mini-batch of about ``batch_size`` support examples: step
    ``k`` takes every ``m``-th example from position ``k mod m``, with
    ``m = max(1, n // batch_size)`` for ``n`` support examples.

    Over ``m`` steps every example is used once, and on the samplers' class-major support
    sets each mini-batch holds every class equally (when the shots divide evenly).
    Reptile needs this: with full-batch steps on the same examples its update reduces to
    joint training (Nichol et al., 2018, sec. 5). Deterministic, so adaptation stays a
    pure function of the support set. Indexes one task's examples: no task axis.
    """

    def __init__(self, batch_size: int = gin.REQUIRED, name: Optional[str] = None):
        super().__init__(name=name)
        if batch_size is gin.REQUIRED:
            raise ValueError("MiniBatches needs batch_size (a whole number >= 1)")
        self.batch_size = check_range("MiniBatches", "batch_size", batch_size, COUNT)

    def own_capabilities(self) -> Capabilities:
        return Capabilities(task_axis=False, step_prefix=True)  # step k's batch: k alone

    def batch(self, x, y, step):
        n = tf.shape(tf.nest.flatten(y)[0])[0]
        stride = tf.maximum(n // self.batch_size, 1)
        index = tf.range(step % stride, n, stride)
        take = lambda t: tf.gather(t, index)
        return tf.nest.map_structure(take, x), tf.nest.map_structure(take, y)


SupportFn = Callable[[Weights, Any, Any, Any], Tuple[Any, Any]]


@gin.configurable
class SupportFromWeights(StepWrapper):
    """The support set each inner step sees, made from the weights that step starts
    from: ``x, y = fn(weights, x, y, step)`` before every step (``x, y``: the support
    set as the episode and the other wrappers give it). Data that depend on the current
    model inside the inner loop: a rollout of the current policy in meta-RL, an active
    learner choosing its next support inputs. ``fn`` is TensorFlow, run inside the
    compiled step; the meta-gradient flows through it (for data *sampled* from the
    weights, an unbiased estimator is the loss's business, e.g. DiCE).

    Args:
      fn: ``fn(weights, x, y, step) -> (x, y)``, one task's weights (no task axis).
    """

    def __init__(self, fn: SupportFn = gin.REQUIRED, name: Optional[str] = None):
        super().__init__(name=name)
        if not callable(fn):
            raise TypeError(f"SupportFromWeights.fn must be callable(weights, x, y, step)"
                            f" -> (x, y), got {fn!r}")
        self.fn = fn

    def own_capabilities(self) -> Capabilities:
        # fn sees one task's weights; what it makes of the step (a rollout drawing
        # random numbers, say) is its own: no step_prefix
        return Capabilities(task_axis=False)

    def wrap(self, step_fn: StepFn) -> StepFn:
        def step(weights, state, k, x, y):
            x, y = self.fn(weights, x, y, k)
            return step_fn(weights, state, k, x, y)
        return step


@gin.configurable
class WhileLoop(StepWrapper):
    """Runs the inner steps in one ``tf.while_loop`` instead of tracing one copy of the
    step (and of its second-order backward pass) per inner step.

    The traced graph, its compile time and the memory it holds no longer grow with the
    number of inner steps; TensorFlow's while-loop gradient keeps each step's
    intermediates in stacks, so the meta-gradient is the same, to every order. Memory
    and time against the unrolled steps: benchmarks/README.md. Inside the loop the step
    index is a scalar int32 tensor (:class:`~metalearn.adapters.updates.StepInfo`), which
    every piece of metalearn takes (per-step rates and copies are indexed by it).

    Args:
      parallel_iterations: iterations TensorFlow may run at once (``tf.while_loop``'s
        argument). The steps depend on each other; more lets the independent parts of
        neighbouring steps (the backward pass's stacks) overlap, at some memory.
    """

    runs_steps = True

    def __init__(self, parallel_iterations: int = 1, name: Optional[str] = None):
        super().__init__(name=name)
        self.parallel_iterations = check_range("WhileLoop", "parallel_iterations",
                                               parallel_iterations, COUNT)

    def own_capabilities(self) -> Capabilities:
        # no step_prefix: its point is a graph and memory flat in the steps, which
        # keeping every step's weights for the counts of one run would give up
        # (run_steps keeps none); each count runs on its own
        return Capabilities()

    def iterate(self, one_step, weights, state, steps, keep_all):
        if steps == 0:
            return [weights]
        keys = list(weights)
        start = [tf.convert_to_tensor(weights[k]) for k in keys]
        stacks = ([tf.TensorArray(w.dtype, size=steps, element_shape=w.shape) for w in start]
                  if keep_all else [])

        def body(step, values, state, stacks):
            after, state = one_step(dict(zip(keys, values)), state, step)
            values = [tf.convert_to_tensor(after[k]) for k in keys]
            stacks = [s.write(step, v) for s, v in zip(stacks, values)]
            return step + 1, values, state, stacks

        _, values, _, stacks = tf.while_loop(
            lambda step, *_: step < steps, body, (tf.constant(0), start, state, stacks),
            parallel_iterations=self.parallel_iterations, maximum_iterations=steps)
        if not keep_all:
            return [weights, dict(zip(keys, values))]
        stacked = [s.stack() for s in stacks]
        return ([weights] + [{k: t[i] for k, t in zip(keys, stacked)} for i in range(steps - 1)]
                + [dict(zip(keys, values))])
